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
// crash never leaves a half file under the real name. Reading checks everything before trusting it - header length against
// the file size, the JSON, each dtype, shape and offset range - and a bad file ends in one
// strata::error naming the file and what is wrong at which offset.
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/train/durable_file.hpp"

namespace strata {

struct named_tensor {
  std::string name;
  std::string dtype;                // "F32", "BF16", "F16", "F64"
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> bytes;  // row-major, little-endian

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  // Element i as double, whatever the dtype.
  double at(std::int64_t i) const {
    const unsigned char* p = bytes.data();
    if (dtype == "F32") return load<float>(p, i);
    if (dtype == "F64") return load<double>(p, i);
    if (dtype == "BF16") return convert<double>(load<bf16>(p, i));
    return convert<double>(load<fp16>(p, i));
  }
  // Every element as double, the dtype looked at once.
  std::vector<double> values() const {
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

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  // Whether strata converts its dtype (F32, F64, BF16, F16).
  bool convertible() const { return safetensors_dtype_bytes(dtype) > 0; }
};

namespace detail {

inline std::uint64_t safetensors_header_length(const unsigned char* first8, std::uint64_t file_size, const std::string& path) {
  STRATA_CHECK(file_size >= 8, "safetensors: '", path, "' is ", file_size, " bytes, too short for a header length");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(first8[i]) << (8 * i);
  STRATA_CHECK(n <= file_size - 8, "safetensors: '", path, "': the header length at offset 0 says ", n,
               " bytes, but the file has ", file_size - 8, " after it");
  return n;
}

// Checks a header (the n bytes after the length) of a file of file_size bytes: the JSON, and for
// every entry its dtype, shape and offset range. strict: only the dtypes strata converts are
// accepted; otherwise any safetensors dtype is, and entries strata cannot convert are kept (their
// sizes checked all the same) for the caller to skip.
inline std::vector<safetensors_entry> parse_safetensors_header(const unsigned char* text, std::uint64_t n,
                                                               std::uint64_t file_size, const std::string& path,
                                                               bool strict,
                                                               std::map<std::string, std::string>* metadata) {
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, text + n);
  } catch (const nlohmann::json::exception& e) {
    fail("safetensors: '", path, "': the header (bytes 8 to ", 8 + n, ") is not valid JSON: ", e.what());
  }
  STRATA_CHECK(header.is_object(), "safetensors: '", path, "': the header is not a JSON object");
  const std::uint64_t data_begin = 8 + n, data_size = file_size - data_begin;
  std::vector<safetensors_entry> out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (metadata && it.value().is_object())
        for (auto m = it.value().begin(); m != it.value().end(); ++m)
          (*metadata)[m.key()] = m.value().is_string() ? m.value().get<std::string>() : m.value().dump();
      continue;
    }
    const auto& e = it.value();
    const std::string where = "safetensors: '" + path + "': tensor '" + it.key() + "'";
    STRATA_CHECK(e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"), where,
                 " needs dtype, shape and data_offsets");
    safetensors_entry t;
    t.name = it.key();
    try {
      t.dtype = e["dtype"].get<std::string>();
      t.shape = e["shape"].get<std::vector<std::int64_t>>();
      const auto off = e["data_offsets"].get<std::vector<std::uint64_t>>();
      STRATA_CHECK(off.size() == 2 && off[0] <= off[1] && off[1] <= data_size, where, " has data_offsets [",
                   off.empty() ? 0 : off[0], ", ", off.size() < 2 ? 0 : off[1], "] outside the ", data_size,
                   " data bytes (file offset ", data_begin, " on)");
      const std::size_t bits = strict ? 8 * safetensors_dtype_bytes(t.dtype) : safetensors_dtype_bits(t.dtype);
      if (strict)
        STRATA_CHECK(bits > 0, where, " has dtype ", t.dtype, " (F32, F64, BF16 or F16 expected)");
      else
        STRATA_CHECK(bits > 0, where, " has dtype ", t.dtype, ", which is not a safetensors dtype");
      std::uint64_t count = 1;  // the element count, checked not to overflow (in bits, too)
      for (auto d : t.shape) {
        STRATA_CHECK(d >= 0, where, " has a negative dimension");
        STRATA_CHECK(d == 0 || count <= (std::uint64_t(1) << 56) / std::uint64_t(d), where, " has a shape of more than 2^56 elements");
        count *= std::uint64_t(d);
      }
      const std::uint64_t need = (count * bits + 7) / 8;
      STRATA_CHECK(count * bits % 8 == 0, where, " has ", count, " elements of ", bits, " bits, not a whole number of bytes");
      STRATA_CHECK(off[1] - off[0] == need, where, " spans ", off[1] - off[0], " bytes at file offset ", data_begin + off[0],
                   ", its dtype and shape need ", need);
      t.offset = data_begin + off[0];
      t.size = off[1] - off[0];
    } catch (const nlohmann::json::exception& ex) {
      fail(where, " has a malformed entry: ", ex.what());
    }
    out.push_back(std::move(t));
  }
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
  } catch (const error& e) {
    fail("safetensors: ", e.what());
  }
  return decode_safetensors(all, path, metadata);
}

// A safetensors file read lazily: opening it reads and checks the header only (every entry's
// dtype, shape and offsets, whatever its dtype); a tensor's bytes are read when asked for. A
// tensor whose dtype strata does not convert (BOOL, I8, ...) is an entry like any other, and an
// error only when read: a file's attention masks need not stop a loader that does not use them.
class safetensors_reader {
 public:
  explicit safetensors_reader(std::string path) : path_(std::move(path)) {
    std::FILE* f = std::fopen(path_.c_str(), "rb");
    STRATA_CHECK(f != nullptr, "safetensors: cannot open '", path_, "': ", std::strerror(errno));
    std::uint64_t size = 0, n = 0;
    unsigned char first8[8] = {};
    std::vector<unsigned char> text;
    bool read_ok = std::fseek(f, 0, SEEK_END) == 0;
    const long end = read_ok ? std::ftell(f) : -1;
    read_ok = end >= 0 && std::fseek(f, 0, SEEK_SET) == 0;
    if (read_ok) {
      size = std::uint64_t(end);
      read_ok = size < 8 || std::fread(first8, 1, 8, f) == 8;
    }
    try {
      STRATA_CHECK(read_ok, "safetensors: reading '", path_, "' failed");
      n = detail::safetensors_header_length(first8, size, path_);
      text.resize(static_cast<std::size_t>(n));
      STRATA_CHECK(std::fread(text.data(), 1, text.size(), f) == text.size(), "safetensors: reading the header of '",
                   path_, "' failed");
    } catch (...) {
      std::fclose(f);
      throw;
    }
    std::fclose(f);
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
    named_tensor t{e.name, e.dtype, e.shape, std::vector<unsigned char>(static_cast<std::size_t>(e.size))};
    std::FILE* f = std::fopen(path_.c_str(), "rb");
    STRATA_CHECK(f != nullptr, "safetensors: cannot open '", path_, "': ", std::strerror(errno));
    const bool ok = std::fseek(f, long(e.offset), SEEK_SET) == 0 &&
                    (e.size == 0 || std::fread(t.bytes.data(), 1, t.bytes.size(), f) == t.bytes.size());
    std::fclose(f);
    STRATA_CHECK(ok, "safetensors: '", path_, "': reading tensor '", e.name, "' (", e.size, " bytes at file offset ",
                 e.offset, ") failed; was the file cut short since it was opened?");
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
