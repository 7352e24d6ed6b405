// strata/plan/hardware_json.hpp - a device for the planner from JSON: a preset with some of its
// figures replaced, or a device of its own. This is how a calibration measured on a device (or a
// datasheet the presets lack) reaches the time model:
//
//   {"base": "a100_80gb", "name": "selene_a100", "gemm_efficiency": 0.78, "inter_node_bandwidth": 23e9}
//
// Every key other than "base" and "name" is a device_spec field by its name; an unknown key, a
// value of the wrong type or out of range is an error naming the file and the key.
#pragma once
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "strata/core/error.hpp"
#include "strata/plan/hardware.hpp"

namespace strata::hw {

// A device_spec that owns its name.
struct named_device {
  std::string name;
  device_spec spec{};
  const device_spec& get() {
    spec.name = name;
    return spec;
  }
};

namespace detail {

// Sets the device_spec field JSON key `key` names to `value`, checked against the field's range;
// false when no field has that name.
inline bool set_device_field(device_spec& s, const std::string& key, const nlohmann::json& value,
                             const std::string& where) {
  using real_member = double device_spec::*;
  using int_member = int device_spec::*;
  struct real_field {
    const char* key;
    real_member field;
    bool share;  // a share of a peak: in (0, 1]
  };
  const real_field reals[] = {
      {"memory_bytes", &device_spec::memory_bytes, false},
      {"peak_flops_16bit", &device_spec::peak_flops_16bit, false},
      {"peak_flops_fp32", &device_spec::peak_flops_fp32, false},
      {"intra_node_bandwidth", &device_spec::intra_node_bandwidth, false},
      {"inter_node_bandwidth", &device_spec::inter_node_bandwidth, false},
      {"intra_node_latency", &device_spec::intra_node_latency, false},
      {"inter_node_latency", &device_spec::inter_node_latency, false},
      {"memory_bandwidth", &device_spec::memory_bandwidth, false},
      {"gemm_efficiency", &device_spec::gemm_efficiency, true},
      {"gemm_k_half", &device_spec::gemm_k_half, false},
      {"gemm_floor_seconds", &device_spec::gemm_floor_seconds, false},
      {"attention_efficiency", &device_spec::attention_efficiency, true},
      {"score_bytes_forward", &device_spec::score_bytes_forward, false},
      {"score_bytes_backward", &device_spec::score_bytes_backward, false},
      {"memory_efficiency", &device_spec::memory_efficiency, true},
      {"link_efficiency", &device_spec::link_efficiency, true},
      {"tensor_overlap", &device_spec::tensor_overlap, false},
      {"data_parallel_overlap", &device_spec::data_parallel_overlap, false},
  };
  struct int_field {
    const char* key;
    int_member field;
  };
  const int_field ints[] = {{"gpus_per_node", &device_spec::gpus_per_node},
                            {"sm_count", &device_spec::sm_count},
                            {"gemm_tile_m", &device_spec::gemm_tile_m},
                            {"gemm_tile_n", &device_spec::gemm_tile_n}};
  bool known = false;
  for (const auto& f : reals) {
    if (key != f.key) continue;
    known = true;
    STRATA_CHECK(value.is_number(), where, ": \"", key, "\" is a number, got ", value.dump());
    const double v = value.get<double>();
    if (key == std::string("tensor_overlap") || key == std::string("data_parallel_overlap")) {
      STRATA_CHECK(v >= 0 && v <= 1, where, ": \"", key, "\" is a share in [0, 1], got ", v);
    } else if (f.share) {
      STRATA_CHECK(v > 0 && v <= 1, where, ": \"", key, "\" is a share of a peak in (0, 1], got ", v);
    } else {
      STRATA_CHECK(v >= 0 && v < 1e300, where, ": \"", key, "\" is a non-negative number, got ", v);
    }
    s.*f.field = v;
  }
  for (const auto& f : ints) {
    if (key != f.key) continue;
    known = true;
    STRATA_CHECK(value.is_number_integer() && value.get<long long>() >= 1 && value.get<long long>() <= 1 << 20, where,
                 ": \"", key, "\" is a whole number from 1 to 1048576, got ", value.dump());
    s.*f.field = int(value.get<long long>());
  }
  return known;
}

}  // namespace detail

// `where` names the source in errors (a file's path).
inline named_device device_from_json(const nlohmann::json& j, const std::string& where) {
  STRATA_CHECK(j.is_object(), where, ": a device is a JSON object, got ", j.dump());
  named_device d;
  d.name = "custom";
  if (j.contains("base")) {
    STRATA_CHECK(j["base"].is_string(), where, ": \"base\" names a preset, got ", j["base"].dump());
    const std::string base = j["base"].get<std::string>();
    const device_spec* p = find(base);
    STRATA_CHECK(p != nullptr, where, ": \"base\": unknown preset '", base, "'");
    d.spec = *p;
    d.name = base;
  }
  if (j.contains("name")) {
    STRATA_CHECK(j["name"].is_string() && !j["name"].get<std::string>().empty(), where,
                 ": \"name\" is a non-empty string, got ", j["name"].dump());
    d.name = j["name"].get<std::string>();
  }
  device_spec& s = d.spec;
  for (const auto& [key, value] : j.items()) {
    if (key == "base" || key == "name") continue;
    const bool known = detail::set_device_field(s, key, value, where);
    STRATA_CHECK(known, where, ": unknown key \"", key, "\" (a device_spec field, \"base\" or \"name\")");
  }
  STRATA_CHECK(s.memory_bytes > 0 && s.peak_flops_16bit > 0 && s.peak_flops_fp32 > 0 && s.memory_bandwidth > 0 &&
                   s.intra_node_bandwidth > 0 && s.inter_node_bandwidth > 0,
               where,
               ": a device needs memory_bytes, both peaks, memory_bandwidth and both link bandwidths "
               "(give \"base\" to start from a preset)");
  return d;
}

// The device a JSON file describes.
inline named_device device_from_json_file(const std::string& path) {
  std::ifstream in(path);
  STRATA_CHECK(in.good(), path, ": cannot open the device file");
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  STRATA_CHECK(!j.is_discarded(), path, ": not valid JSON");
  return device_from_json(j, path);
}

}  // namespace strata::hw
