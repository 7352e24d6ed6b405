// strata/plan/time_model.hpp - how long one training step takes on the busiest rank, from a plan
// (plan/plan.hpp), its layout and a device (plan/hardware.hpp). An estimate built per op:
//
//   GEMMs        each shape of the busiest stage's layers (layers/cost.hpp gemm_list) in waves
//                of output tiles over the SMs (a partial wave costs a whole one, a partial tile a
//                whole tile), at an efficiency that grows with the inner dimension k to the
//                device's ceiling, k / (k + k_half); never faster than its operands' bytes at
//                the memory bandwidth
//   attention    the core's FLOPs at the device's attention efficiency, plus, for a kernel that
//                writes its score matrix out, the bytes it moves per score entry
//   memory-bound norms, activations, residual sums, embedding and loss: their bytes at the
//                memory bandwidth (times memory_efficiency); the optimizer likewise, over the
//                state this rank updates
//   recompute    the difference between the planned work and the same without recomputation
//
// Communication goes at the bandwidth of the links a group crosses: ranks are numbered tp
// fastest, then cp, then dp, then pp (policy/mesh_axes.hpp), and a group whose every copy lies
// within one node of gpus_per_node ranks uses NVLink, otherwise the network: one adapter per GPU,
// so a group with k members in each node crosses at k adapters' rate (at most NVLink's), a
// pipeline send at one's. Each collective also pays a latency per step of its ring (2(n-1) for
// an all-reduce). What is hidden:
//
//   dp   gradient buckets are reduced while backward runs (data_parallel.hpp posts each as it
//        fills, so their latencies overlap): all but the last bucket hide behind the last
//        micro-batch's backward (every micro-batch's at ZeRO-2 and 3, which reduce per
//        micro-batch; ZeRO-3's gathers hide behind forward too), times the device's
//        data_parallel_overlap (1 for strata). ZeRO-1's gather of the updated weights is exposed.
//   tp   exposed, except the device's tensor_overlap share (0 for strata, which does not
//        overlap them)
//   cp   the ring's next block travels while the current one is computed: exposed only where
//        it takes longer than the attention it overlaps; all-to-all exposed
//   ep   exposed
//   pp   a send costs time only at the bubble's edges: the first micro-batch's way down the
//        pipeline and the last one's way back (2(p·V - 1) hops)
//   bubble  (p - 1)/V micro-batches' time
//
// The step: M micro-batches of (forward + backward + exposed tp, cp, ep) on the busiest stage,
// plus the bubble and the pipeline's edge sends, plus exposed dp, plus the optimizer.
// docs/planner.md gives the validation against published runs.
#pragma once
#include <algorithm>
#include <cstdint>

#include "strata/core/error.hpp"
#include "strata/layers/cost.hpp"
#include "strata/plan/hardware.hpp"
#include "strata/plan/plan.hpp"

namespace strata {

// Where one step's time goes on the busiest rank (seconds per step; exposed communication only).
struct step_time {
  double gemm_s = 0, attention_s = 0, memory_s = 0;  // compute, recomputation excluded
  double recompute_s = 0;                            // the recomputed forward work
  double optimizer_s = 0;
  double tp_s = 0, cp_s = 0, ep_s = 0, pp_s = 0, dp_s = 0;
  double bubble_s = 0;
  double step_s = 0;
  // Each group's links: inside one node (NVLink) or across nodes.
  bool tp_intra = true, cp_intra = true, dp_intra = true, pp_intra = true, ep_intra = true;

  constexpr double compute_s() const { return gemm_s + attention_s + memory_s + recompute_s; }
  constexpr double exposed_communication_s() const { return tp_s + cp_s + ep_s + pp_s + dp_s; }
};

namespace time_detail {

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Whether every copy of the group along one axis (members `stride` ranks apart, `size` of them)
// lies within one node.
constexpr bool group_within_node(int ranks, int per_node, int stride, int size) {
  if (size <= 1) return true;
  for (int r = 0; r < ranks; ++r) {
    if ((r / stride) % size != 0) continue;  // r is not the first member of its copy
    if (r / per_node != (r + (size - 1) * stride) / per_node) return false;
  }
  return true;
}

// How many members of such a group share one node: a collective that crosses nodes runs its
// rings over that many network adapters per node at once (one per GPU).
constexpr int members_per_node(int per_node, int stride, int size) {
  if (stride >= per_node) return 1;
  const int n = per_node / stride;
  return n < size ? n : size;
}

}  // namespace time_detail

// One GEMM's seconds on the device, in `storage_bytes` elements: its compute or its bytes, and at
// least the device's floor for one GEMM.
constexpr double gemm_seconds(const gemm_shape& g, const hw::device_spec& d, int storage_bytes) {
  const double peak = d.peak_flops(storage_bytes);
  const std::int64_t tiles = time_detail::ceil_div(g.m, d.gemm_tile_m) * time_detail::ceil_div(g.n, d.gemm_tile_n);
  const std::int64_t waves = time_detail::ceil_div(tiles, d.sm_count);
  const double quantized =
      double(waves) * double(d.sm_count) * double(d.gemm_tile_m) * double(d.gemm_tile_n) * 2.0 * double(g.k);
  const double efficiency = d.gemm_efficiency * double(g.k) / (double(g.k) + d.gemm_k_half);
  const double compute = quantized / (efficiency * peak);
  const double bytes =
      double(storage_bytes) * (double(g.m) * double(g.k) + double(g.k) * double(g.n) + double(g.m) * double(g.n));
  return std::max({compute, bytes / (d.memory_bandwidth * d.memory_efficiency), d.gemm_floor_seconds});
}

// Seconds of a gemm_list (each shape times its count).
constexpr double gemm_seconds(const gemm_list& list, const hw::device_spec& d, int storage_bytes) {
  double s = 0;
  for (const auto& e : list) s += gemm_seconds(e.shape, d, storage_bytes) * double(e.count);
  return s;
}

// A layer_cost's forward and backward work in seconds, by kind.
struct work_time {
  double gemm_s = 0, attention_s = 0, memory_s = 0;
  constexpr double total() const { return gemm_s + attention_s + memory_s; }
};
constexpr work_time work_seconds(const layer_cost& c, const hw::device_spec& d, int storage_bytes) {
  const double peak = d.peak_flops(storage_bytes);
  const double bandwidth = d.memory_bandwidth * d.memory_efficiency;
  const double score_bytes =
      c.attention_forward_scores * d.score_bytes_forward + c.attention_backward_scores * d.score_bytes_backward;
  return {gemm_seconds(c.forward_gemms, d, storage_bytes) + gemm_seconds(c.backward_gemms, d, storage_bytes),
          (c.attention_forward_flops + c.attention_backward_flops) / (d.attention_efficiency * peak) +
              score_bytes / bandwidth,
          (c.memory_forward_bytes + c.memory_backward_bytes) / bandwidth};
}

namespace time_detail {
// The device's numbers the model needs, and the kinds of the plan's work: a layer whose cost()
// states FLOPs but not their kinds would take no time here, so say so.
constexpr void check_inputs(const plan_result& r, const hw::device_spec& d) {
  STRATA_CHECK(d.peak_flops(r.storage_bytes) > 0 && d.memory_bandwidth > 0 && d.intra_node_bandwidth > 0 &&
                   d.inter_node_bandwidth > 0 && d.sm_count > 0 && d.gemm_tile_m > 0 && d.gemm_tile_n > 0 &&
                   d.gpus_per_node > 0,
               "time model: device '", d.name,
               "' needs its peak, memory and link bandwidths, SM count, GEMM tile and GPUs per node");
  STRATA_CHECK(d.gemm_efficiency > 0 && d.attention_efficiency > 0 && d.memory_efficiency > 0 && d.link_efficiency > 0,
               "time model: device '", d.name, "' needs positive GEMM, attention, memory and link efficiencies");
  const layer_cost& w = r.stage_work_plain;
  const double flops = double(w.forward_flops + w.backward_flops);
  const double kinds =
      w.forward_gemms.flops() + w.backward_gemms.flops() + w.attention_forward_flops + w.attention_backward_flops;
  STRATA_CHECK(flops <= 0 || kinds >= 0.9 * flops, "time model: the layers state ", 100 * kinds / flops,
               "% of their FLOPs as matrix products or attention; a layer's cost() leaves its kinds of work "
               "unstated (layer_cost::forward_gemms/backward_gemms, attention_*_flops, memory_*_bytes: "
               "layers/cost.hpp)");
}

// A collective inside a node runs at NVLink's rate; across nodes at the network's, times the
// adapters of the group's members in one node (capped at NVLink's). A send goes through one.
struct links {
  const hw::device_spec& d;
  constexpr double bandwidth(bool intra, int stride = 0, int size = 1) const {
    if (intra) return d.intra_node_bandwidth * d.link_efficiency;
    const int adapters = stride > 0 ? members_per_node(d.gpus_per_node, stride, size) : 1;
    return std::min(d.intra_node_bandwidth, d.inter_node_bandwidth * adapters) * d.link_efficiency;
  }
  constexpr double latency(bool intra) const { return intra ? d.intra_node_latency : d.inter_node_latency; }
};

// Exposed tensor-, context- and expert-parallel communication per micro-batch on the busiest
// stage, into t.tp_s, t.cp_s and t.ep_s (per step); returns their sum per micro-batch.
constexpr double exposed_per_microbatch(step_time& t, const plan_result& r, const plan_setup& setup, const links& l,
                                        const work_time& planned) {
  const layout_config& L = setup.layout;
  const int tp = L.tp, cp = L.cp, ep = L.ep;
  const double M = double(r.microbatches), blocks = double(r.stage_blocks);
  const bool again = setup.recompute == recompute_mode::full;
  double tp_mb = 0, cp_mb = 0, ep_mb = 0;
  if (tp > 1) {
    // Per block about 4 collectives (2 forward, 2 backward; 6 with full recomputation), each a
    // ring of 2(tp - 1) steps.
    const double collectives = blocks * (again ? 6.0 : 4.0);
    tp_mb = (r.comm_bytes.tp / M / l.bandwidth(t.tp_intra, 1, tp) +
             l.latency(t.tp_intra) * collectives * 2.0 * double(tp - 1)) *
            (1.0 - l.d.tensor_overlap);
  }
  if (cp > 1) {
    const bool ring = L.context_form != "all_to_all";
    const bool redo = setup.recompute != recompute_mode::none;
    // Steps per block: the ring's hops; all-to-all's 2 collectives forward and 3 backward (dout,
    // the output, dqkv), each of cp - 1 steps, and forward's again where it is recomputed.
    const double steps = ring ? (2.0 * cp - 1) + (redo ? cp - 1 : 0) : (5.0 + (redo ? 2 : 0)) * double(cp - 1);
    const double transfer =
        r.comm_bytes.cp / M / l.bandwidth(t.cp_intra, tp, cp) + l.latency(t.cp_intra) * steps * blocks;
    cp_mb = ring ? std::max(0.0, transfer - (planned.attention_s)) : transfer;
  }
  if (ep > 1) {
    const double alltoalls = blocks * (5.0 + (again ? 3 : 0));
    ep_mb = r.comm_bytes.ep / M / l.bandwidth(t.ep_intra, tp, ep) + l.latency(t.ep_intra) * alltoalls * double(ep - 1);
  }
  t.tp_s = tp_mb * M;
  t.cp_s = cp_mb * M;
  t.ep_s = ep_mb * M;
  return tp_mb + cp_mb + ep_mb;
}

// Data parallel: the gradient group's traffic, hidden behind backward but for the last bucket.
constexpr double exposed_gradient_seconds(const step_time& t, const plan_result& r, const layout_config& L,
                                          const links& l, const work_time& planned) {
  const int n = L.dp * L.cp;
  if (n == 1) return 0.0;
  const bool intra = t.dp_intra;
  const double M = double(r.microbatches);
  const double bucket_bytes = double(std::int64_t(1) << 20) * double(r.storage_bytes);
  const double last_bucket = 2.0 * double(n - 1) / double(n) * bucket_bytes / l.bandwidth(intra, L.tp, n) +
                             l.latency(intra) * 2.0 * double(n - 1);
  // Buckets are posted back to back as they fill, so their latencies overlap: one ring's worth.
  const double total = r.comm_bytes.dp / l.bandwidth(intra, L.tp, n) + l.latency(intra) * 2.0 * double(n - 1);
  const double backward_one = planned.total() * 2.0 / 3.0;  // backward is about 2/3 of a micro-batch's work
  // What backward can hide: the last micro-batch's (every micro-batch's at ZeRO-2, which
  // reduces per micro-batch; forward's too at ZeRO-3, which also gathers); ZeRO-1's gather of
  // the updated weights comes after the optimizer and stays exposed.
  const double window = L.zero_stage <= 1 ? backward_one : L.zero_stage == 2 ? backward_one * M : planned.total() * M;
  const double reducible = L.zero_stage == 1 ? total / 2 : total;
  const double hidden = l.d.data_parallel_overlap * std::max(0.0, std::min(reducible - last_bucket, window));
  return total - hidden;
}

// The optimizer reads and writes its state (master copy, moments), reads the gradients and
// writes the weights (and, without a master copy, reads them too); clipping reads the gradients.
constexpr double optimizer_seconds(const plan_result& r, const hw::device_spec& d) {
  const double owned = double(r.optimizer_params_per_rank);
  const double state = double(r.master_bytes + r.optimizer_bytes);  // this rank's share already
  const double bytes = 2.0 * state + owned * double(r.storage_bytes) * (r.master_bytes > 0 ? 3.0 : 4.0);
  return bytes / (d.memory_bandwidth * d.memory_efficiency);
}
}  // namespace time_detail

// The step time of plan `r` made under `setup`, on device `d`.
constexpr step_time estimate_step_time(const plan_result& r, const plan_setup& setup, const hw::device_spec& d) {
  const layout_config& L = setup.layout;
  const int tp = L.tp, cp = L.cp, dp = L.dp, pp = L.pp, V = L.virtual_chunks, ep = L.ep;
  const int gpus = tp * cp * dp * pp, S = r.storage_bytes;
  time_detail::check_inputs(r, d);
  const double M = double(r.microbatches);
  step_time t;
  t.tp_intra = time_detail::group_within_node(gpus, d.gpus_per_node, 1, tp);
  t.cp_intra = time_detail::group_within_node(gpus, d.gpus_per_node, tp, cp);
  t.dp_intra = time_detail::group_within_node(gpus, d.gpus_per_node, tp, dp * cp);  // the gradient group dp x cp
  t.pp_intra = time_detail::group_within_node(gpus, d.gpus_per_node, tp * cp * dp, pp);
  t.ep_intra = time_detail::group_within_node(gpus, d.gpus_per_node, tp, ep);
  const time_detail::links links{d};

  // Compute per micro-batch on the busiest stage.
  const work_time planned = work_seconds(r.stage_work, d, S), plain = work_seconds(r.stage_work_plain, d, S);
  t.gemm_s = plain.gemm_s * M;
  t.attention_s = plain.attention_s * M;
  t.memory_s = plain.memory_s * M;
  t.recompute_s = std::max(0.0, planned.total() - plain.total()) * M;
  const double per_micro = planned.total() + time_detail::exposed_per_microbatch(t, r, setup, links, planned);

  // The pipeline: the bubble, and the sends at its edges.
  if (pp > 1) {
    t.bubble_s = double(pp - 1) / double(V) * per_micro;
    const double send =
        r.comm_bytes.pp / (2.0 * M * double(V)) / links.bandwidth(t.pp_intra) + links.latency(t.pp_intra);
    t.pp_s = 2.0 * double(pp * V - 1) * send;
  }
  t.dp_s = time_detail::exposed_gradient_seconds(t, r, L, links, planned);
  t.optimizer_s = time_detail::optimizer_seconds(r, d);
  t.step_s = per_micro * M + t.bubble_s + t.pp_s + t.dp_s + t.optimizer_s;
  return t;
}

}  // namespace strata
