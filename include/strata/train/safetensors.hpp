// strata/train/safetensors.hpp - named tensors in the safetensors format.
//
// The file: an 8-byte little-endian header length n, then n bytes of JSON
//   {"name": {"dtype": "F32", "shape": [768, 2304], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// (padded with spaces to a multiple of 8), then the tensors' bytes, little-endian, row-major,
// offsets relative to the end of the header. strata writes F32, BF16 and F16 (its storage types)
// and converts those plus F64. read_safetensors reads a whole file of those dtypes (checkpoints);
// safetensors_reader reads a file's header and then only the tensors asked for, so a Hugging Face
// file may also hold tensors of other dtypes (BOOL attention masks, ...) that nobody reads.
//
// Writing goes to "<path>.tmp", fsynced, then renamed over <path> (train/durable_file.hpp): a
// crash never leaves a half file under the real name. Reading checks everything before trusting it - a regular file,
// the header length against the file size, the JSON (nesting depth, no key twice), each dtype,
// shape and offset range (integers, in range, overflow-checked), and that the tensors tile the
// data with no overlap or gap - and a bad file ends in one strata::error naming the file and
// what is wrong at which offset or field.
#pragma once
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/core/checked_math.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/train/durable_file.hpp"
#include "strata/train/untrusted_json.hpp"

namespace strata {

struct named_tensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", "F64"
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> bytes;  // row-major, little-endian

  // Checked: a shape with a negative dimension or more than 2^63 elements is an error.
  std::int64_t numel() const {
    const auto n = checked_numel(shape);
    STRATA_CHECK(n.has_value(), "safetensors: tensor '", name, "' has a shape with a negative dimension or more than ",
                 "2^63 elements");
    return *n;
  }
  // Element i as double, whatever the dtype.
  double at(std::int64_t i) const {
    if (dtype == "F32") return element<float>(i);
    if (dtype == "F64") return element<double>(i);
    if (dtype == "BF16") return convert<double>(element<bf16>(i));
    STRATA_CHECK(dtype == "F16", "safetensors: tensor '", name, "' has dtype ", dtype,
                 " (F32, F64, BF16 or F16 expected)");
    return convert<double>(element<fp16>(i));
  }
  // Every element as double, the dtype looked at once.
  std::vector<double> values() const {
    const std::size_t size = element_bytes();
    STRATA_CHECK(std::uint64_t(numel()) == bytes.size() / size && bytes.size() % size == 0, "safetensors: tensor '",
                 name, "' holds ", bytes.size(), " bytes for ", numel(), " elements of ", dtype);
    std::vector<double> out(static_cast<std::size_t>(numel()));
    const auto fill = [&](auto tag) {
      using U = decltype(tag);
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = convert<double>(load<U>(bytes.data(), std::int64_t(i)));
    };
    if (dtype == "F32") fill(float{});
    else if (dtype == "F64") fill(double{});
    else if (dtype == "BF16") fill(bf16{});
    else fill(fp16{});
    return out;
  }

 private:
  // Bytes per element of a dtype strata converts (anything else here is an error, not fp16).
  std::size_t element_bytes() const {
    const std::size_t size = dtype == "F32" ? 4 : dtype == "F64" ? 8 : dtype == "BF16" || dtype == "F16" ? 2 : 0;
    STRATA_CHECK(size > 0, "safetensors: tensor '", name, "' has dtype ", dtype, " (F32, F64, BF16 or F16 expected)");
    return size;
  }
  // Element i, which must lie inside `bytes` (called once per element by loaders: one check).
  template <class U>
  U element(std::int64_t i) const {
    STRATA_CHECK(i >= 0 && std::uint64_t(i) < bytes.size() / sizeof(U), "safetensors: tensor '", name,
                 "' has no element ", i, " (", bytes.size() / sizeof(U), " of them)");
    return load<U>(bytes.data(), i);
  }
  template <class U>
  static U load(const unsigned char* p, std::int64_t i) {
    U v;
    std::memcpy(&v, p + i * std::int64_t(sizeof(U)), sizeof(U));
    return v;
  }
};

inline std::size_t safetensors_dtype_bytes(const std::string& d) {
  if (d == "F32") return 4;
  if (d == "F64") return 8;
  if (d == "BF16" || d == "F16") return 2;
  return 0;
}

// The dtype name of a strata storage type.
template <class T>
constexpr const char* safetensors_dtype() {
  if constexpr (std::is_same_v<T, float>) return "F32";
  else if constexpr (std::is_same_v<T, double>) return "F64";
  else if constexpr (std::is_same_v<T, bf16>) return "BF16";
  else return "F16";
}

// A tensor of `shape` whose element i is values[i], stored as T.
template <class T>
named_tensor make_tensor(std::string name, std::vector<std::int64_t> shape, const std::vector<double>& values) {
  named_tensor t{std::move(name), safetensors_dtype<T>(), std::move(shape), {}};
  STRATA_CHECK(t.numel() == static_cast<std::int64_t>(values.size()), "safetensors: tensor '", t.name, "' has ",
               values.size(), " values for ", t.numel(), " elements");
  t.bytes.resize(values.size() * sizeof(T));
  for (std::size_t i = 0; i < values.size(); ++i) {
    const T v = convert<T>(values[i]);
    std::memcpy(t.bytes.data() + i * sizeof(T), &v, sizeof(T));
  }
  return t;
}

// The file's bytes: header length, header, tensors.
inline std::vector<unsigned char> encode_safetensors(const std::vector<named_tensor>& tensors,
                                                     const std::map<std::string, std::string>& metadata = {}) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    STRATA_CHECK(safetensors_dtype_bytes(t.dtype) * std::size_t(t.numel()) == t.bytes.size(), "safetensors: tensor '",
                 t.name, "' holds ", t.bytes.size(), " bytes, its dtype and shape say ",
                 safetensors_dtype_bytes(t.dtype) * std::size_t(t.numel()));
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  std::vector<unsigned char> out;
  out.reserve(8 + text.size() + offset);
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(n >> (8 * i)));
  out.insert(out.end(), text.begin(), text.end());
  for (const auto& t : tensors) out.insert(out.end(), t.bytes.begin(), t.bytes.end());
  return out;
}

inline void write_safetensors(const std::string& path, const std::vector<named_tensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {}) {
  write_file_durably(path, encode_safetensors(tensors, metadata));
}

// Bits per element of every dtype the safetensors format defines (0: not one of them). strata
// converts only F32, F64, BF16 and F16 (safetensors_dtype_bytes); the others are sized so that a
// header holding them can still be checked entry by entry.
inline std::size_t safetensors_dtype_bits(const std::string& d) {
  if (d == "F32" || d == "I32" || d == "U32") return 32;
  if (d == "F64" || d == "I64" || d == "U64" || d == "C64") return 64;
  if (d == "BF16" || d == "F16" || d == "I16" || d == "U16") return 16;
  if (d == "BOOL" || d == "U8" || d == "I8" || d == "F8_E5M2" || d == "F8_E4M3" || d == "F8_E8M0") return 8;
  if (d == "F6_E2M3" || d == "F6_E3M2") return 6;
  if (d == "F4") return 4;
  return 0;
}

// One entry of a safetensors header: a tensor's name, dtype, shape and where its bytes lie.
struct safetensors_entry {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t offset = 0, size = 0;  // the bytes: `size` of them from `offset`, counted from the file's start

  // Never overflows: parsing refused shapes of more than 2^56 elements.
  std::int64_t numel() const {
    const auto n = checked_numel(shape);
    STRATA_CHECK(n.has_value(), "safetensors: tensor '", name, "' has a shape with a negative dimension or more than ",
                 "2^63 elements");
    return *n;
  }
  // Whether strata converts its dtype (F32, F64, BF16, F16).
  bool convertible() const { return safetensors_dtype_bytes(dtype) > 0; }
};

namespace detail {

// A header is ~100 bytes per tensor: 64 MiB is hundreds of thousands of tensors. A larger one is
// not a safetensors header, and its DOM (several times the text) is not built.
inline constexpr std::uint64_t safetensors_max_header_bytes = std::uint64_t(64) << 20;

inline std::uint64_t safetensors_header_length(const unsigned char* first8, std::uint64_t file_size,
                                               const std::string& path) {
  STRATA_CHECK(file_size >= 8, "safetensors: '", path, "' is ", file_size, " bytes, too short for a header length");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(first8[i]) << (8 * i);
  STRATA_CHECK(n <= file_size - 8, "safetensors: '", path, "': the header length at offset 0 says ", n,
               " bytes, but the file has ", file_size - 8, " after it");
  STRATA_CHECK(n <= safetensors_max_header_bytes, "safetensors: '", path, "': the header length at offset 0 says ", n,
               " bytes, more than the ", safetensors_max_header_bytes, " a header may have");
  return n;
}

// __metadata__: an object of strings, copied into `metadata` when the caller asks for it.
inline void read_safetensors_metadata(const nlohmann::json& value, const std::string& path,
                                      std::map<std::string, std::string>* metadata) {
  const std::string where = "safetensors: '" + path + "': __metadata__";
  STRATA_CHECK(value.is_object(), where, " is ", json_shown(value), ", expected an object of strings");
  for (auto m = value.begin(); m != value.end(); ++m) {
    STRATA_CHECK(m.value().is_string(), where, ": field '", m.key(), "' is ", json_shown(m.value()),
                 ", expected a string");
    if (metadata) (*metadata)[m.key()] = m.value().get<std::string>();
  }
}

// The bytes a tensor of `shape` holds at `bits` an element, its element count bounded so that
// count * bits cannot overflow, whatever the order of the dimensions (a zero does not excuse the
// others: [0, 2^62, 2^62] is refused too). e: the entry, shown in messages.
inline std::uint64_t safetensors_tensor_bytes(const std::vector<std::int64_t>& shape, std::size_t bits,
                                              const nlohmann::json& e, const std::string& where) {
  std::uint64_t count = 1;
  bool empty = false;
  for (auto d : shape) {
    if (d == 0) {
      empty = true;
      continue;
    }
    STRATA_CHECK(count <= (std::uint64_t(1) << 56) / std::uint64_t(d), where, ": field 'shape' ",
                 json_shown(e.at("shape")), " has more than 2^56 elements");
    count *= std::uint64_t(d);
  }
  if (empty) count = 0;
  const std::uint64_t need = (count * bits + 7) / 8;
  STRATA_CHECK(count * bits % 8 == 0, where, " has ", count, " elements of ", bits,
               " bits, not a whole number of bytes");
  return need;
}

// One tensor's entry `e` under `name`, its fields checked (see parse_safetensors_header); data
// starts at file offset data_begin and holds data_size bytes.
inline safetensors_entry parse_safetensors_entry(const std::string& name, const nlohmann::json& e,
                                                 const std::string& path, bool strict, std::uint64_t data_begin,
                                                 std::uint64_t data_size) {
  const std::string where = "safetensors: '" + path + "': tensor '" + name + "'";
  STRATA_CHECK(e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"), where,
               " needs dtype, shape and data_offsets");
  for (auto f = e.begin(); f != e.end(); ++f)
    STRATA_CHECK(f.key() == "dtype" || f.key() == "shape" || f.key() == "data_offsets", where, " has the field '",
                 f.key(), "' (only dtype, shape and data_offsets belong to a tensor)");
  safetensors_entry t;
  t.name = name;
  t.dtype = json_string_field(e, "dtype", where);
  const std::size_t bits = strict ? 8 * safetensors_dtype_bytes(t.dtype) : safetensors_dtype_bits(t.dtype);
  if (strict) STRATA_CHECK(bits > 0, where, " has dtype ", t.dtype, " (F32, F64, BF16 or F16 expected)");
  else STRATA_CHECK(bits > 0, where, " has dtype ", t.dtype, ", which is not a safetensors dtype");
  t.shape = json_integer_array_field(e, "shape", 0, INT64_MAX, 8, where);
  const auto& off_json = e.at("data_offsets");
  STRATA_CHECK(off_json.is_array() && off_json.size() == 2, where, ": field 'data_offsets' is ", json_shown(off_json),
               ", expected [begin, end]");
  const auto begin = json_integer(off_json[0], 0, INT64_MAX, where, "data_offsets[0]");
  const auto end = json_integer(off_json[1], 0, INT64_MAX, where, "data_offsets[1]");
  STRATA_CHECK(begin <= end && std::uint64_t(end) <= data_size, where, " has data_offsets [", begin, ", ", end,
               "] outside the ", data_size, " data bytes (file offset ", data_begin, " on)");
  const std::uint64_t need = safetensors_tensor_bytes(t.shape, bits, e, where);
  STRATA_CHECK(std::uint64_t(end - begin) == need, where, " spans ", end - begin, " bytes at file offset ",
               data_begin + std::uint64_t(begin), ", its dtype and shape need ", need);
  t.offset = data_begin + std::uint64_t(begin);
  t.size = std::uint64_t(end - begin);
  return t;
}

// The tensors tile the data section (file offsets data_begin .. file_size): sorted by where they
// start, each begins where the one before ended. Anything else is bytes read as two tensors, or
// bytes that belong to none.
inline void check_safetensors_tiling(const std::vector<safetensors_entry>& tensors, std::uint64_t data_begin,
                                     std::uint64_t file_size, const std::string& path) {
  const std::uint64_t data_size = file_size - data_begin;
  std::vector<const safetensors_entry*> by_offset;
  for (const auto& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    if (a->offset != b->offset) return a->offset < b->offset;
    return a->size != b->size ? a->size < b->size : a->name < b->name;  // one order, one message
  });
  std::uint64_t at = data_begin;
  const safetensors_entry* before = nullptr;
  for (const auto* t : by_offset) {
    const std::string where = "safetensors: '" + path + "': tensor '" + t->name + "'";
    STRATA_CHECK(t->offset >= at, where, " has data_offsets [", t->offset - data_begin, ", ",
                 t->offset - data_begin + t->size, "], overlapping tensor '", before ? before->name : "", "' (",
                 "which ends at data offset ", at - data_begin, ")");
    STRATA_CHECK(t->offset == at, where, " has data_offsets [", t->offset - data_begin, ", ",
                 t->offset - data_begin + t->size, "], leaving the data bytes [", at - data_begin, ", ",
                 t->offset - data_begin, ") to no tensor (a gap)");
    at += t->size;
    before = t;
  }
  STRATA_CHECK(at == file_size, "safetensors: '", path, "': the data bytes [", at - data_begin, ", ", data_size,
               ") (file offset ", at, " on) belong to no tensor",
               before ? " (after tensor '" + before->name + "')" : "");
}

// Checks a header (the n bytes after the length) of a file of file_size bytes: the JSON (nesting,
// no key twice), and for every entry exactly the fields dtype (a string), shape (integers >= 0)
// and data_offsets (two integers, begin <= end, within the data), the bytes the dtype and shape
// need, and that the tensors tile the data: no overlap, no gap, nothing after the last.
// __metadata__, when present, maps strings to strings. strict: only the dtypes strata converts
// are accepted; otherwise any safetensors dtype is, and entries strata cannot convert are kept
// (their sizes checked all the same) for the caller to skip.
inline std::vector<safetensors_entry> parse_safetensors_header(const unsigned char* text, std::uint64_t n,
                                                               std::uint64_t file_size, const std::string& path,
                                                               bool strict,
                                                               std::map<std::string, std::string>* metadata) {
  const nlohmann::json header = parse_untrusted_json(
      text, text + n, "safetensors: '" + path + "': the header (bytes 8 to " + std::to_string(8 + n) + ")");
  STRATA_CHECK(header.is_object(), "safetensors: '", path, "': the header is not a JSON object");
  const std::uint64_t data_begin = 8 + n, data_size = file_size - data_begin;
  std::vector<safetensors_entry> out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") read_safetensors_metadata(it.value(), path, metadata);
    else out.push_back(parse_safetensors_entry(it.key(), it.value(), path, strict, data_begin, data_size));
  }
  check_safetensors_tiling(out, data_begin, file_size, path);
  return out;
}

}  // namespace detail

// Parses a file's bytes; `path` names it in every message. Every tensor must have a dtype strata
// converts (safetensors_reader reads files that hold others).
inline std::vector<named_tensor> decode_safetensors(const std::vector<unsigned char>& all, const std::string& path,
                                                    std::map<std::string, std::string>* metadata = nullptr) {
  const std::uint64_t n = detail::safetensors_header_length(all.data(), all.size(), path);
  std::vector<named_tensor> out;
  for (auto& e : detail::parse_safetensors_header(all.data() + 8, n, all.size(), path, true, metadata)) {
    named_tensor t{std::move(e.name), std::move(e.dtype), std::move(e.shape), {}};
    t.bytes.assign(all.begin() + std::ptrdiff_t(e.offset), all.begin() + std::ptrdiff_t(e.offset + e.size));
    out.push_back(std::move(t));
  }
  return out;
}

inline std::vector<named_tensor> read_safetensors(const std::string& path,
                                                  std::map<std::string, std::string>* metadata = nullptr) {
  std::vector<unsigned char> all;
  try {
    all = read_whole_file(path);
  } catch (const error& e) { fail("safetensors: ", e.what()); }
  return decode_safetensors(all, path, metadata);
}

// A safetensors file read lazily: opening it reads and checks the header only (every entry's
// dtype, shape and offsets, whatever its dtype); a tensor's bytes are read when asked for. A
// tensor whose dtype strata does not convert (BOOL, I8, ...) is an entry like any other, and an
// error only when read: a file's attention masks need not stop a loader that does not use them.
class safetensors_reader {
 public:
  explicit safetensors_reader(std::string path) : path_(std::move(path)) {
    const regular_file f(path_, "safetensors file");  // a FIFO or a device is refused, not waited on
    const std::uint64_t size = f.size();
    unsigned char first8[8] = {};
    if (size >= 8) f.read_at(0, first8, 8);
    const std::uint64_t n = detail::safetensors_header_length(first8, size, path_);
    std::vector<unsigned char> text(static_cast<std::size_t>(n));  // n: checked against the file and the cap
    f.read_at(8, text.data(), text.size());
    file_size_ = size;
    entries_ = detail::parse_safetensors_header(text.data(), n, size, path_, false, &metadata_);
    for (std::size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].name, i);
  }

  const std::string& path() const { return path_; }
  std::uint64_t file_size() const { return file_size_; }
  const std::vector<safetensors_entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The entry called `name`, or null.
  const safetensors_entry* find(const std::string& name) const {
    const auto it = index_.find(name);
    return it == index_.end() ? nullptr : &entries_[it->second];
  }

  // The tensor `name` with its bytes; it must be in the file with a dtype strata converts.
  named_tensor read(const std::string& name) const {
    const auto* e = find(name);
    STRATA_CHECK(e != nullptr, "safetensors: '", path_, "' has no tensor '", name, "'");
    return read(*e);
  }
  named_tensor read(const safetensors_entry& e) const {
    STRATA_CHECK(e.convertible(), "safetensors: '", path_, "': tensor '", e.name, "' has dtype ", e.dtype,
                 " (F32, F64, BF16 or F16 expected)");
    STRATA_CHECK(e.offset <= file_size_ && e.size <= file_size_ - e.offset, "safetensors: '", path_, "': tensor '",
                 e.name, "' (", e.size, " bytes at file offset ", e.offset, ") lies outside the file's ", file_size_,
                 " bytes");
    const regular_file f(path_, "safetensors file");
    // The header was checked against the size the file had then; a file changed since is refused.
    STRATA_CHECK(f.size() == file_size_, "safetensors: '", path_, "' has ", f.size(), " bytes now, ", file_size_,
                 " when it was opened: it changed meanwhile");
    named_tensor t{e.name, e.dtype, e.shape, std::vector<unsigned char>(static_cast<std::size_t>(e.size))};
    try {
      f.read_at(e.offset, t.bytes.data(), t.bytes.size());
    } catch (const error& err) {
      fail("safetensors: '", path_, "': reading tensor '", e.name, "' (", e.size, " bytes at file offset ", e.offset,
           ") failed: ", err.what());
    }
    return t;
  }

 private:
  std::string path_;
  std::uint64_t file_size_ = 0;
  std::vector<safetensors_entry> entries_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace strata
