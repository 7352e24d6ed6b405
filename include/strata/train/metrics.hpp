// strata/train/metrics.hpp - one JSON object per step, one line each, for tools to read.
//
//   {"step":3,"loss":4.12,"lr":0.0006,"grad_norm":1.8,"tokens_per_s":5120,"loss_scale":1,
//    "applied":true,"mem":{"parameters":...,"gradients":...,...},"mem_peak":{...},
//    "comm":{"world":{...},"dp":{"all_reduce":{"calls":..,"bytes_sent":..,"bytes_received":..}},...}}
#pragma once
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>

#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/train/trainer.hpp"

namespace strata {

namespace detail {
inline void json_number(std::string& out, double v) {
  if (!std::isfinite(v)) {  // JSON has no NaN or infinity
    out += "null";
    return;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  out += buf;
}
inline void json_bytes_by_category(std::string& out, const memory_ledger& ledger, bool peak) {
  out += '{';
  for (int i = 0; i < memory_category_count; ++i) {
    auto c = static_cast<memory_category>(i);
    if (i) out += ',';
    out += '"';
    out += category_name(c);
    out += "\":";
    out += std::to_string(peak ? ledger.peak(c) : ledger.current(c));
  }
  out += '}';
}
}  // namespace detail

// `comm`, when given, is a JSON object of bytes per group (process_mesh::counters_json()).
// `comm` and `pipeline` are JSON objects added as they are (empty: left out).
inline std::string metrics_line(const step_result& r, const memory_ledger& ledger, std::string_view comm = {},
                                std::string_view pipeline = {}) {
  std::string s = "{\"step\":" + std::to_string(r.step) + ",\"loss\":";
  detail::json_number(s, r.loss);
  s += ",\"lr\":";
  detail::json_number(s, r.lr);
  s += ",\"grad_norm\":";
  detail::json_number(s, r.grad_norm);
  s += ",\"tokens_per_s\":";
  detail::json_number(s, r.seconds > 0 ? double(r.tokens) / r.seconds : 0.0);
  s += ",\"loss_scale\":";
  detail::json_number(s, r.loss_scale);
  s += ",\"applied\":";
  s += r.applied ? "true" : "false";
  s += ",\"mem\":";
  detail::json_bytes_by_category(s, ledger, false);
  s += ",\"mem_peak\":";
  detail::json_bytes_by_category(s, ledger, true);
  if (!comm.empty()) {
    s += ",\"comm\":";
    s += comm;
  }
  if (!pipeline.empty()) {
    s += ",\"pipeline\":";
    s += pipeline;
  }
  s += '}';
  return s;
}

// Appends one line per step to a file, flushed each time so a crash loses at most one line.
class metrics_file {
 public:
  explicit metrics_file(const std::string& path) : f_(std::fopen(path.c_str(), "w")), path_(path) {
    STRATA_CHECK(f_ != nullptr, "cannot open metrics file '", path, "' for writing");
  }
  metrics_file(const metrics_file&) = delete;
  metrics_file& operator=(const metrics_file&) = delete;
  ~metrics_file() { std::fclose(f_); }

  void write(const step_result& r, const memory_ledger& ledger, std::string_view comm = {},
             std::string_view pipeline = {}) {
    const std::string line = metrics_line(r, ledger, comm, pipeline) + "\n";
    STRATA_CHECK(std::fputs(line.c_str(), f_) >= 0 && std::fflush(f_) == 0, "writing metrics file '", path_,
                 "' failed");
  }

 private:
  std::FILE* f_;
  std::string path_;
};

}  // namespace strata
