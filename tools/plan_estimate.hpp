// tools/plan_estimate.hpp - the step-time model: how long a planned step takes on a device, and
// what that makes of its throughput.
//
// The search ranks its layouts by this estimate, and the plan of one layout prints the same, so
// the two never disagree. plan/time_model.hpp: GEMMs by shape, attention, memory-bound work and
// the optimizer on the device, communication by the links each group crosses, overlap by axis,
// the bubble. Reported with it:
//   tokens_per_s            = global_batch x seq / T_step
//   tflops_per_gpu          = model_flops_per_step / T_step / gpus / 1e12   (no recomputation)
//   hardware_tflops_per_gpu = flops_per_step / T_step / gpus / 1e12         (recomputation counted)
//   mfu                     = tflops_per_gpu x 1e12 / peak
// search_model_help states the model in words, as --help ends.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include <strata/core/json_number.hpp>
#include <strata/plan/hardware.hpp>
#include <strata/plan/plan.hpp>
#include <strata/plan/time_model.hpp>

#include "plan_text.hpp"

namespace strata_plan {

namespace st = strata;

struct step_estimate {
  st::step_time time;
  double tokens_per_s = 0, tflops_per_gpu = 0, hardware_tflops_per_gpu = 0, mfu = 0;
};

template <class Dims>
step_estimate estimate_step(const st::plan_result& r, const st::plan_setup& s, const Dims& m, const st::batch& b,
                            const st::hw::device_spec& d) {
  const int gpus = s.layout.tp * s.layout.cp * s.layout.dp * s.layout.pp;
  step_estimate e;
  e.time = st::estimate_step_time(r, s, d);
  const double step = e.time.step_s;
  e.tokens_per_s = double(b.global) * double(m.seq) / step;
  e.tflops_per_gpu = r.model_flops_per_step / step / double(gpus) / 1e12;
  e.hardware_tflops_per_gpu = r.flops_per_step / step / double(gpus) / 1e12;
  e.mfu = e.tflops_per_gpu * 1e12 / d.peak_flops(r.storage_bytes);
  return e;
}

inline nlohmann::ordered_json estimate_json(const step_estimate& e) {
  const st::step_time& t = e.time;
  return {{"step_time_s", st::json_number(t.step_s)},
          {"compute_s", st::json_number(t.compute_s())},
          {"gemm_s", st::json_number(t.gemm_s)},
          {"attention_s", st::json_number(t.attention_s)},
          {"memory_s", st::json_number(t.memory_s)},
          {"recompute_s", st::json_number(t.recompute_s)},
          {"optimizer_s", st::json_number(t.optimizer_s)},
          {"tp_s", st::json_number(t.tp_s)},
          {"cp_s", st::json_number(t.cp_s)},
          {"pp_s", st::json_number(t.pp_s)},
          {"ep_s", st::json_number(t.ep_s)},
          {"dp_s", st::json_number(t.dp_s)},
          {"bubble_s", st::json_number(t.bubble_s)},
          {"tokens_per_s", st::json_number(e.tokens_per_s)},
          {"tflops_per_gpu", st::json_number(e.tflops_per_gpu)},
          {"hardware_tflops_per_gpu", st::json_number(e.hardware_tflops_per_gpu)},
          {"mfu", st::json_number(e.mfu)}};
}

// The device as the time model sees it: memory, peak, GPUs per node and the links' bandwidths.
inline std::string device_text(const st::hw::device_spec& d, int storage_bytes) {
  return printf_string("%s: %g GB, %s/s peak (%s), %d per node, %g GB/s in a node, %g GB/s between nodes",
                       std::string(d.name).c_str(), d.memory_bytes / 1e9,
                       si(d.peak_flops(storage_bytes), "FLOP").c_str(), storage_bytes <= 2 ? "16-bit" : "fp32",
                       d.gpus_per_node, d.intra_node_bandwidth / 1e9, d.inter_node_bandwidth / 1e9);
}

inline const char* const search_model_help = R"(
Step-time model (ranks the layouts; an estimate, not a measurement; docs/planner.md):
  GPUs = dp x cp x tp x pp; ranks placed tp fastest, then cp, then dp, then pp
  per micro-batch on the busiest stage:
    GEMMs by shape: waves of 128 x 256 output tiles over the SMs at gemm_efficiency x k/(k + k_half),
    each at least gemm_floor_seconds
    attention at attention_efficiency x peak; norms, activations, residual, rotary, embedding
    and loss at memory_efficiency x memory bandwidth; recomputation as its extra work
  communication at link_efficiency x the bandwidth of the links a group crosses (NVLink within
  a node, the network across), plus a latency per ring step:
    tp exposed (but a device's tensor_overlap share); cp ring hidden behind attention where it
    is shorter; ep exposed; pp sends only at the bubble's edges; dp buckets hidden behind
    backward but the last (ZeRO-1's weight gather exposed)
  T_step = M x micro-batch + bubble (p-1)/V micro-batches + edge sends + dp exposed + optimizer
  tokens/s = global batch x seq / T_step; TFLOP/s per GPU = model FLOPs / T_step / GPUs
  --explain prints where the time goes, --explain-svg FILE draws it; --hw-file FILE reads a
  device (a preset with figures replaced: {"base": "a100_80gb", "gemm_efficiency": 0.78})
)";

}  // namespace strata_plan
