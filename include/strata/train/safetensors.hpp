// strata/train/safetensors.hpp - named tensors in the safetensors format.
//
// The file: an 8-byte little-endian header length n, then n bytes of JSON
//   {"name": {"dtype": "F32", "shape": [768, 2304], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// (padded with spaces to a multiple of 8), then the tensors' bytes, little-endian, row-major,
// offsets relative to the end of the header. strata writes F32, BF16 and F16 (its storage types)
// and reads those plus F64.
//
// Writing goes to "<path>.tmp", fsynced, then renamed over <path> (train/durable_file.hpp): a
// crash never leaves a half file under the real name. Reading checks everything before trusting it - header length against
// the file size, the JSON, each dtype, shape and offset range - and a bad file ends in one
// strata::error naming the file and what is wrong at which offset.
#pragma once
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

// Parses a file's bytes; `path` names it in every message.
inline std::vector<named_tensor> decode_safetensors(const std::vector<unsigned char>& all, const std::string& path,
                                                    std::map<std::string, std::string>* metadata = nullptr) {
  STRATA_CHECK(all.size() >= 8, "safetensors: '", path, "' is ", all.size(), " bytes, too short for a header length");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(all[std::size_t(i)]) << (8 * i);
  STRATA_CHECK(n <= all.size() - 8, "safetensors: '", path, "': the header length at offset 0 says ", n,
               " bytes, but the file has ", all.size() - 8, " after it");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(all.begin() + 8, all.begin() + 8 + std::ptrdiff_t(n));
  } catch (const nlohmann::json::exception& e) {
    fail("safetensors: '", path, "': the header (bytes 8 to ", 8 + n, ") is not valid JSON: ", e.what());
  }
  STRATA_CHECK(header.is_object(), "safetensors: '", path, "': the header is not a JSON object");
  const std::uint64_t data_begin = 8 + n, data_size = all.size() - data_begin;
  std::vector<named_tensor> out;
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
    named_tensor t;
    t.name = it.key();
    try {
      t.dtype = e["dtype"].get<std::string>();
      t.shape = e["shape"].get<std::vector<std::int64_t>>();
      const auto off = e["data_offsets"].get<std::vector<std::uint64_t>>();
      STRATA_CHECK(off.size() == 2 && off[0] <= off[1] && off[1] <= data_size, where, " has data_offsets [",
                   off.empty() ? 0 : off[0], ", ", off.size() < 2 ? 0 : off[1], "] outside the ", data_size,
                   " data bytes (file offset ", data_begin, " on)");
      STRATA_CHECK(safetensors_dtype_bytes(t.dtype) > 0, where, " has dtype ", t.dtype, " (F32, F64, BF16 or F16 expected)");
      for (auto d : t.shape) STRATA_CHECK(d >= 0, where, " has a negative dimension");
      STRATA_CHECK(off[1] - off[0] == safetensors_dtype_bytes(t.dtype) * std::uint64_t(t.numel()), where, " spans ",
                   off[1] - off[0], " bytes at file offset ", data_begin + off[0], ", its dtype and shape need ",
                   safetensors_dtype_bytes(t.dtype) * std::uint64_t(t.numel()));
      t.bytes.assign(all.begin() + std::ptrdiff_t(data_begin + off[0]), all.begin() + std::ptrdiff_t(data_begin + off[1]));
    } catch (const nlohmann::json::exception& ex) {
      fail(where, " has a malformed entry: ", ex.what());
    }
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

}  // namespace strata
