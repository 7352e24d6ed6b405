// strata/train/metrics.hpp - one JSON object per step, one line each, for tools to read.
//
//   {"step":3,"loss":4.1203389167785645,"lr":0.0006,"grad_norm":1.8,"tokens_per_s":5120,
//    "flops_per_s":1200000000,"mfu":null,"loss_scale":1,"skipped_steps":0,"applied":true,
//    "mem":{"parameters":...,"gradients":...,...},"mem_peak":{...},
//    "comm":{"world":{...},"dp":{"all_reduce":{"calls":..,"bytes_sent":..,"bytes_received":..}},...}}
// A model with auxiliary terms (a mixture of experts) adds "aux_loss" and, per MoE block,
//   "experts":[{"block":0,"balance":2.01,"z":3.2,"dropped":0,"tokens_min":..,"tokens_max":..,"tokens_mean":..},...]
//
// docs/metrics.md describes every field.
#pragma once
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "strata/core/error.hpp"
#include "strata/core/json_number.hpp"
#include "strata/core/memory.hpp"
#include "strata/layers/moe_statistics.hpp"
#include "strata/train/trainer.hpp"

namespace strata {

// What a step's line carries beyond its step_result: figures only the caller knows.
struct step_extras {
  // The planner's plan_result::model_flops_per_step: one global step's FLOPs without
  // recomputation, so recomputing does not inflate the figure. 0: unknown, "flops_per_s" null.
  double model_flops_per_step = 0;
  // The job's peak FLOP/s: ranks x device_spec::peak_flops(storage bytes). 0: no device known,
  // "mfu" null (a CPU run has no meaningful peak).
  double peak_flops = 0;
  long skipped_steps = 0;       // loss_scaler::skipped_steps(): fp16 overflows so far
  std::string_view comm{};      // JSON object of bytes per group (process_mesh::counters_json())
  std::string_view pipeline{};  // JSON object of the stages' busy and idle time
};

namespace detail {
// The caller's objects (comm, pipeline) arrive as JSON text; parsed, they nest in the line.
inline nlohmann::ordered_json json_object_field(std::string_view text, const char* field) {
  nlohmann::ordered_json object = nlohmann::ordered_json::parse(text, nullptr, false);
  STRATA_CHECK(object.is_object(), "metrics: step_extras::", field, " is not a JSON object: ", text);
  return object;
}
inline nlohmann::ordered_json bytes_by_category(const memory_ledger& ledger, bool peak) {
  nlohmann::ordered_json bytes = nlohmann::ordered_json::object();
  for (int i = 0; i < memory_category_count; ++i) {
    const auto c = static_cast<memory_category>(i);
    bytes[std::string(category_name(c))] = peak ? ledger.peak(c) : ledger.current(c);
  }
  return bytes;
}
}  // namespace detail

inline std::string metrics_line(const step_result& r, const memory_ledger& ledger, const step_extras& x) {
  const bool timed = r.seconds > 0;
  const double flops_per_s = timed && x.model_flops_per_step > 0 ? x.model_flops_per_step / r.seconds : NAN;
  nlohmann::ordered_json line;
  line["step"] = r.step;
  line["loss"] = json_number(r.loss);  // resumed runs are compared with straight ones bit for bit
  line["lr"] = json_number(r.lr);
  line["grad_norm"] = json_number(r.grad_norm);
  line["tokens_per_s"] = json_number(timed ? double(r.tokens) / r.seconds : 0.0);
  line["flops_per_s"] = json_number(flops_per_s);
  line["mfu"] = json_number(x.peak_flops > 0 ? flops_per_s / x.peak_flops : NAN);
  line["loss_scale"] = json_number(r.loss_scale);
  line["skipped_steps"] = x.skipped_steps;
  line["applied"] = r.applied;
  if (!r.auxiliary.empty() || r.aux_loss != 0) {
    line["aux_loss"] = json_number(r.aux_loss);
    nlohmann::ordered_json experts = nlohmann::ordered_json::array();
    for (const expert_load& l : expert_loads(r.auxiliary))
      experts.push_back({{"block", l.block},
                         {"balance", json_number(l.balance)},
                         {"z", json_number(l.z)},
                         {"dropped", json_number(l.dropped)},
                         {"tokens_min", json_number(l.tokens_min)},
                         {"tokens_max", json_number(l.tokens_max)},
                         {"tokens_mean", json_number(l.tokens_mean)}});
    line["experts"] = std::move(experts);
  }
  line["mem"] = detail::bytes_by_category(ledger, false);
  line["mem_peak"] = detail::bytes_by_category(ledger, true);
  if (!x.comm.empty()) line["comm"] = detail::json_object_field(x.comm, "comm");
  if (!x.pipeline.empty()) line["pipeline"] = detail::json_object_field(x.pipeline, "pipeline");
  return line.dump();
}

// The earlier form: no FLOP figures (both null) and no skipped-step count.
inline std::string metrics_line(const step_result& r, const memory_ledger& ledger, std::string_view comm = {},
                                std::string_view pipeline = {}) {
  return metrics_line(r, ledger, step_extras{.comm = comm, .pipeline = pipeline});
}

// Appends one line per step to a file, flushed each time so a crash loses at most one line.
class metrics_file {
 public:
  // `append`: a resumed run adds its steps after those already there (a reader takes the last
  // line of a step written twice).
  explicit metrics_file(const std::string& path, bool append = false)
      : f_(std::fopen(path.c_str(), append ? "a" : "w")), path_(path) {
    STRATA_CHECK(f_ != nullptr, "cannot open metrics file '", path, "' for writing");
  }
  metrics_file(const metrics_file&) = delete;
  metrics_file& operator=(const metrics_file&) = delete;
  ~metrics_file() { std::fclose(f_); }

  void write(const step_result& r, const memory_ledger& ledger, const step_extras& x) {
    const std::string line = metrics_line(r, ledger, x) + "\n";
    STRATA_CHECK(std::fputs(line.c_str(), f_) >= 0 && std::fflush(f_) == 0, "writing metrics file '", path_,
                 "' failed");
  }
  void write(const step_result& r, const memory_ledger& ledger, std::string_view comm = {},
             std::string_view pipeline = {}) {
    write(r, ledger, step_extras{.comm = comm, .pipeline = pipeline});
  }

 private:
  std::FILE* f_;
  std::string path_;
};

}  // namespace strata
