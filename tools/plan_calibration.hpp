// tools/plan_calibration.hpp - strata-plan --calibrate: a device from measurements on it.
//
// Reads {"base": preset, "name": ..., "storage_bytes": 2, "gemms": [{"m", "n", "k", "seconds"}],
// and optionally the measured "memory_bandwidth" (a device-to-device copy's bytes/s) and
// "intra_node_bandwidth" / "inter_node_bandwidth" (collectives' bus bandwidth, bytes/s)}, and
// prints the device JSON --hw-file reads: the GEMM figures fitted (plan/calibration.hpp), and
// measured bandwidths taken as reached (their efficiency 1). A file that cannot be read, or says
// less than the fit needs, is a usage error naming the file.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <strata/core/json_number.hpp>
#include <strata/plan/calibration.hpp>
#include <strata/plan/hardware_json.hpp>

#include "plan_options.hpp"

namespace strata_plan {

inline int run_calibrate(const options& o) {
  std::ifstream in(o.calibrate);
  if (!in.good()) throw usage_error("--calibrate " + o.calibrate + ": cannot open the file");
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  const auto bad = [&](const std::string& why) { return usage_error("--calibrate " + o.calibrate + ": " + why); };
  if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
  nlohmann::json base = nlohmann::json::object();
  for (const char* key : {"base", "name"})
    if (j.contains(key)) base[key] = j[key];
  st::hw::named_device start =
      st::hw::device_from_json(base.contains("base") ? base : nlohmann::json{{"base", o.hw}}, o.calibrate);
  const int storage = j.value("storage_bytes", 2);
  if (storage != 2 && storage != 4) throw bad("\"storage_bytes\" is 2 or 4");
  if (!j.contains("gemms") || !j["gemms"].is_array() || j["gemms"].empty())
    throw bad("\"gemms\" lists the measured GEMMs: [{\"m\": .., \"n\": .., \"k\": .., \"seconds\": ..}]");
  std::vector<st::gemm_sample> samples;
  for (const auto& g : j["gemms"]) {
    for (const char* key : {"m", "n", "k", "seconds"})
      if (!g.contains(key) || !g[key].is_number())
        throw bad(std::string("a GEMM without a number \"") + key + "\": " + g.dump());
    samples.push_back({{g["m"].get<std::int64_t>(), g["n"].get<std::int64_t>(), g["k"].get<std::int64_t>()},
                       g["seconds"].get<double>()});
  }
  st::hw::device_spec d = start.get();
  const auto measured = [&](const char* key, double& field, double& efficiency) {
    if (!j.contains(key)) return;
    if (!j[key].is_number() || j[key].get<double>() <= 0)
      throw bad(std::string("\"") + key + "\" is a positive number");
    field = j[key].get<double>();
    efficiency = 1;
  };
  double link_efficiency = d.link_efficiency;
  measured("memory_bandwidth", d.memory_bandwidth, d.memory_efficiency);
  measured("intra_node_bandwidth", d.intra_node_bandwidth, link_efficiency);
  measured("inter_node_bandwidth", d.inter_node_bandwidth, link_efficiency);
  d.link_efficiency = link_efficiency;
  const st::gemm_fit fit = st::calibrate_gemms(d, samples, storage);
  const st::hw::device_spec& c = fit.device;
  std::fprintf(stderr,
               "strata-plan --calibrate: %d of %zu GEMMs fitted (the rest memory-bound): efficiency %.3f, k_half %.0f, "
               "floor %.1f us, rms error %.1f%%\n",
               fit.samples_used, samples.size(), c.gemm_efficiency, c.gemm_k_half, 1e6 * c.gemm_floor_seconds,
               100 * (std::exp(fit.rms_log_error) - 1));
  nlohmann::ordered_json out;
  if (base.contains("base")) out["base"] = base["base"];
  else out["base"] = o.hw;
  out["name"] = start.name;
  out["gemm_efficiency"] = st::json_number(c.gemm_efficiency);
  out["gemm_k_half"] = st::json_number(c.gemm_k_half);
  out["gemm_floor_seconds"] = st::json_number(c.gemm_floor_seconds);
  out["memory_bandwidth"] = st::json_number(c.memory_bandwidth);
  out["memory_efficiency"] = st::json_number(c.memory_efficiency);
  out["intra_node_bandwidth"] = st::json_number(c.intra_node_bandwidth);
  out["inter_node_bandwidth"] = st::json_number(c.inter_node_bandwidth);
  out["link_efficiency"] = st::json_number(c.link_efficiency);
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
}

}  // namespace strata_plan
