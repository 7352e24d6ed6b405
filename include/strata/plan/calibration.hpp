// strata/plan/calibration.hpp - the time model's figures from measurements on a device: GEMM
// times by shape fix gemm_efficiency, gemm_k_half and gemm_floor_seconds (plan/time_model.hpp's
// gemm_seconds), a
// copy's bandwidth the memory-bound work, collectives' bus bandwidth the links.
//
//   std::vector<gemm_sample> gemms = ...;        // measured (m, n, k) -> seconds
//   hw::device_spec d = calibrate_gemms(hw::h100_80gb, gemms, 2);
//
// The fit keeps the model's form: for each GEMM floor (none, or one of the measured times) and
// each k_half on a grid, the efficiency that makes the geometric mean of predicted over measured
// time 1 over the samples at least twice the floor (closed form), and the floor and k_half whose
// predictions miss the measurements least (root mean square of the log ratio). Samples the
// model holds to the memory bandwidth say nothing about the tensor cores and are left out.
// strata-plan --calibrate reads such measurements as JSON and writes the device JSON that
// --hw-file reads (scripts/gpu-check measures them on a GPU).
#pragma once
#include <cmath>
#include <span>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/layers/cost.hpp"
#include "strata/plan/hardware.hpp"
#include "strata/plan/time_model.hpp"

namespace strata {

struct gemm_sample {
  gemm_shape shape{};
  double seconds = 0;
};

struct gemm_fit {
  hw::device_spec device{};
  double rms_log_error = 0;  // of the predictions against the samples used
  int samples_used = 0;
};

inline gemm_fit calibrate_gemms(hw::device_spec d, std::span<const gemm_sample> samples, int storage_bytes) {
  STRATA_CHECK(!samples.empty(), "calibrate_gemms: no GEMM measurements");
  for (const auto& s : samples)
    STRATA_CHECK(s.seconds > 0 && s.shape.m > 0 && s.shape.n > 0 && s.shape.k > 0,
                 "calibrate_gemms: a measurement needs positive m, n, k and seconds, got m=", s.shape.m,
                 " n=", s.shape.n, " k=", s.shape.k, " seconds=", s.seconds);
  // Candidate floors: none, and each measured time (the floor is what the smallest GEMMs take).
  std::vector<double> floors{0.0};
  for (const auto& s : samples) floors.push_back(s.seconds);
  gemm_fit best;
  bool have = false;
  for (const double floor : floors)
    for (double k_half = 1; k_half <= 8192; k_half *= 1.05) {
      hw::device_spec trial = d;
      trial.gemm_k_half = k_half;
      trial.gemm_efficiency = 1;  // predictions scale as 1/efficiency while compute-bound
      trial.gemm_floor_seconds = 0;
      hw::device_spec unbounded = trial;
      unbounded.memory_bandwidth = 1e300;  // the compute side alone
      double sum_log = 0;
      int n = 0;
      for (const auto& s : samples) {
        const double predicted = gemm_seconds(s.shape, trial, storage_bytes);
        if (predicted > gemm_seconds(s.shape, unbounded, storage_bytes)) continue;  // memory-bound at efficiency 1
        if (s.seconds < 2 * floor) continue;  // near the floor: says little about the tensor cores
        sum_log += std::log(predicted / s.seconds);
        ++n;
      }
      if (n == 0) continue;
      const double efficiency = std::exp(sum_log / n);  // geometric mean of predicted (at 1) over measured
      if (efficiency <= 0 || efficiency > 1) continue;
      trial.gemm_efficiency = efficiency;
      trial.gemm_floor_seconds = floor;
      unbounded.gemm_efficiency = efficiency;
      unbounded.gemm_floor_seconds = floor;
      double sq = 0;
      int used = 0;
      for (const auto& s : samples) {
        const double compute = gemm_seconds(s.shape, unbounded, storage_bytes);
        if (gemm_seconds(s.shape, trial, storage_bytes) > compute) continue;
        const double e = std::log(compute / s.seconds);
        sq += e * e;
        ++used;
      }
      const double rms = std::sqrt(sq / used);
      if (!have || rms < best.rms_log_error) {
        best = {trial, rms, used};
        have = true;
      }
    }
  STRATA_CHECK(have,
               "calibrate_gemms: no efficiency in (0, 1] explains the measurements (are they in seconds, and "
               "of the precision given?)");
  return best;
}

}  // namespace strata
