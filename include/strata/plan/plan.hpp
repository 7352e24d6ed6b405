// strata/plan/plan.hpp - what each rank holds, computes and communicates, before anything runs.
//
// The plan of a declared model (layers/sequential.hpp) under a layout and precision is the sum
// of its layers' own constexpr costs (cost.hpp: parameters, activations, FLOPs, tensor-group
// traffic) with the layout's tensor split, placed on pipeline stages the way
// sequential_model places them, plus the analytic formulas of the data and pipeline axes. No
// model's wiring is written here: a user's model is planned exactly like the example GPT-2.
// All of it is constexpr:
//
//   using Policy = st::policy<st::cuda, st::parallel<st::data<8, st::zero<1>>, st::tensor<2>>, st::mixed<st::bf16,
//   float>>; static_assert(st::plan<my_model<Policy>>(config, st::batch{.micro = 4, .global =
//   512}).fits(st::hw::h100_80gb));
//
// A plan that does not fit fails to compile in a call to model_state_exceeds_device_memory(),
// activations_exceed_device_memory() or total_exceeds_device_memory(): the function's name says
// which category overflows. With dynamic degrees, plan_model<Model>(config, batch, setup) gives
// the same figures at start-up and check_fits() throws with the numbers. docs/planner.md has every
// formula and its source.
//
// Per rank means the busiest rank: the pipeline stage holding the most (the first holds the parts
// before the blocks, the last the parts after them and its replica of a tied table). Bytes are
// exact for what strata's allocator charges when the ZeRO pieces split evenly (Ψ divisible by dp
// and one bucket; otherwise within one bucket's rounding). Activations are those kept from
// forward to backward (transients of a single layer are not counted).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/recompute.hpp"
#include "strata/layers/sequential.hpp"
#include "strata/parallel/pipeline_schedule.hpp"
#include "strata/plan/hardware.hpp"
#include "strata/layers/tensor_checks.hpp"
#include "strata/policy/layout.hpp"
#include "strata/policy/policy.hpp"

namespace strata {

struct batch {
  std::int64_t micro = 1, global = 1;  // sequences per micro-batch, and per step over all ranks
  std::int64_t seq = 0;                // tokens per sequence; 0: the model config's `seq`
};

enum class optimizer_kind { adamw, sgd };  // sgd: with momentum (one fp32 moment)

struct plan_setup {
  layout_config layout{};
  recompute_mode recompute = recompute_mode::none;
  optimizer_kind optimizer = optimizer_kind::adamw;
  pipeline_schedule_kind schedule = pipeline_schedule_kind::one_f_one_b;
};

// Per-rank bytes communicated per step, by process group (ring volumes, as counters.hpp).
// `dp` is the gradient group's (dp × cp: parameters are replicated over both; under expert
// parallelism a rank's experts are reduced over the expert-data group instead, counted here too);
// `ep` is the expert group's all-to-all.
struct comm_plan {
  double dp = 0, cp = 0, tp = 0, pp = 0, embedding = 0, ep = 0;
  constexpr double total() const { return dp + cp + tp + pp + embedding + ep; }
};

// Non-constexpr on purpose: a constant-evaluated fits() that calls one fails to compile, and the
// compiler names the function - and so the category - that overflowed.
inline bool model_state_exceeds_device_memory() { return false; }
inline bool activations_exceed_device_memory() { return false; }
inline bool total_exceeds_device_memory() { return false; }

struct plan_result {
  std::int64_t params_total = 0;            // Ψ of the whole model (serial, unpadded vocabulary)
  std::int64_t params_active = 0;           // of Ψ, those one token uses (a mixture of experts: its k experts)
  std::int64_t params_per_rank = 0;         // the busiest rank's share, before ZeRO
  std::int64_t expert_params_per_rank = 0;  // of it, a mixture's experts (its share under expert parallelism)
  std::int64_t params_bytes = 0, grads_bytes = 0, master_bytes = 0, optimizer_bytes = 0, comm_buffer_bytes = 0;
  std::int64_t activation_bytes_per_microbatch = 0;  // one micro-batch on the busiest stage
  std::int64_t activation_bytes = 0;                 // kept, at the schedule's peak in flight
  std::int64_t activation_peak_bytes = 0;            // the step's high: kept, and forward's or backward's scratch
  int in_flight = 1;                                 // (chunk-)micro-batches at that peak
  std::int64_t microbatches = 1;                     // per step and data-parallel rank
  double flops_per_step = 0;                         // the whole model, one iteration, recomputation included
  double model_flops_per_step = 0;                   // the same without recomputation (for MFU)
  double flops_per_rank = 0;                         // the busiest stage's FLOPs per step, over its dp·cp·t ranks
  comm_plan comm_bytes{};
  double bubble_fraction = 0;
  // The time model's inputs (plan/time_model.hpp): the busiest stage's work for one micro-batch
  // on one rank (its layers' matrix products, attention and memory-bound bytes; all V chunks), as
  // planned and without recomputation; and the parameters this rank's optimizer updates.
  layer_cost stage_work{}, stage_work_plain{};
  std::int64_t optimizer_params_per_rank = 0;
  std::int64_t stage_blocks = 0;  // blocks per pipeline stage
  int storage_bytes = 2;          // bytes per weight, gradient and activation element

  constexpr std::int64_t model_state_bytes() const {
    return params_bytes + grads_bytes + master_bytes + optimizer_bytes;
  }
  // The activation bytes at the step's high (a plan of model state alone has only kept ones: none).
  constexpr std::int64_t activation_high_bytes() const {
    return activation_peak_bytes > activation_bytes ? activation_peak_bytes : activation_bytes;
  }
  constexpr std::int64_t total_bytes() const {
    return model_state_bytes() + activation_high_bytes() + comm_buffer_bytes;
  }

  // True when the busiest rank's bytes fit the device; see model_state_exceeds_device_memory.
  constexpr bool fits(const hw::device_spec& d) const {
    const double mem = d.memory_bytes;
    if (double(model_state_bytes()) > mem)
      return std::is_constant_evaluated() ? model_state_exceeds_device_memory() : false;
    if (double(activation_high_bytes()) > mem)
      return std::is_constant_evaluated() ? activations_exceed_device_memory() : false;
    if (double(total_bytes()) > mem) return std::is_constant_evaluated() ? total_exceeds_device_memory() : false;
    return true;
  }
  // The start-up form: throws, naming the category and the numbers.
  void check_fits(const hw::device_spec& d) const {
    const auto gb = [](double b) { return b / 1e9; };
    STRATA_CHECK(double(model_state_bytes()) <= d.memory_bytes, "plan: model state of ",
                 gb(double(model_state_bytes())), " GB per rank does not fit ", d.name, " (", gb(d.memory_bytes),
                 " GB)");
    STRATA_CHECK(double(total_bytes()) <= d.memory_bytes, "plan: ", gb(double(total_bytes())),
                 " GB per rank (model state ", gb(double(model_state_bytes())), " + activations at the step's peak ",
                 gb(double(activation_high_bytes())), " + buffers ", gb(double(comm_buffer_bytes)), ") does not fit ",
                 d.name, " (", gb(d.memory_bytes), " GB)");
  }
};

// Model state of Ψ parameters on one rank of dp-way data parallelism under ZeRO stage `zero`
// (the back-of-envelope figure; no activations): weights and gradients in the storage type, the
// optimizer's fp32 master copy when kept, and its moments (AdamW 2, SGD with momentum 1).
// ZeRO-1 shards master weights and moments, ZeRO-2 also gradients, ZeRO-3 also weights (pieces
// rounded up). E.g. 7.5B parameters, dp 64, bf16 + fp32 AdamW: 120 GB, 31.4, 16.6, 1.9.
struct model_state_options {
  int storage_bytes = 2;  // weights and gradients
  int master_bytes = 4;   // 0: the weights are their own master copy
  int moment_bytes = 4;
  optimizer_kind optimizer = optimizer_kind::adamw;
  int dp = 1, zero = 0;
};
constexpr plan_result model_state_plan(std::int64_t params, const model_state_options& o) {
  plan_result r;
  r.params_total = r.params_per_rank = params;
  const std::int64_t owned = (params + o.dp - 1) / o.dp;
  r.params_bytes = (o.zero >= 3 ? owned : params) * o.storage_bytes;
  r.grads_bytes = (o.zero >= 2 ? owned : params) * o.storage_bytes;
  const std::int64_t opt = o.zero >= 1 ? owned : params;
  r.master_bytes = opt * o.master_bytes;
  r.optimizer_bytes = opt * o.moment_bytes * (o.optimizer == optimizer_kind::adamw ? 2 : 1);
  return r;
}

namespace plan_detail {

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Chunk-micro-batches stage s holds at the schedule's peak (pipeline_schedule.hpp's simulate).
constexpr int in_flight(pipeline_schedule_kind k, int p, int s, int M, int V) {
  if (k == pipeline_schedule_kind::gpipe) return M;
  if (V == 1) return std::min(p - s, M);
  const int warmup = M == p ? M * V : std::min(M * V, 2 * (p - s - 1) + (V - 1) * p);
  return std::min(M * V, warmup + 1);
}

// The model's parts in three groups, for one micro-batch on one rank of the tensor group: the
// parts before the blocks, one block (recomputation applied), the parts after the blocks.
struct part_costs {
  layer_cost before{}, block{}, after{};
  std::int64_t blocks = 0;  // how many
};
template <class Model>
constexpr part_costs costs_of(const typename Model::config& c, const cost_scope& s) {
  const auto layers = Model::layers(c);
  using list = layers_of<Model>;
  part_costs r;
  r.blocks = layers.blocks().count;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (
        [&] {
          using L = typename list::template part_type<I>::layer_type;
          const auto& part = layers.template part<I>();
          if constexpr (I == list::blocks_at) r.block = recompute<recompute_from_context, L>::cost(part.config, s);
          else if constexpr (I < list::blocks_at) r.before = r.before.then(L::cost(part.config, s));
          else r.after = r.after.then(L::cost(part.config, s));
        }(),
        ...);
  }
  (std::make_index_sequence<list::size>{});
  return r;
}

// The batch's sequence length: given, or the model config's `seq`.
template <class Config>
constexpr std::int64_t sequence_length(const Config& c, const batch& b) {
  if (b.seq > 0) return b.seq;
  if constexpr (requires { c.seq; }) return static_cast<std::int64_t>(c.seq);
  fail("plan: give the batch's sequence length (batch.seq); the model config has no `seq`");
}

}  // namespace plan_detail

namespace plan_detail {
// The layout's degrees and the batch's numbers, after the checks a start-up makes.
struct plan_numbers {
  int t = 1, p = 1, dp = 1, cp = 1, V = 1, ep = 1;
  bool sp = false;
  context_form form = context_form::ring;
  std::int64_t s = 0, layers = 0, M = 0, per_stage = 0, per_chunk = 0;
};

template <class Model>
constexpr plan_numbers checked_numbers(const typename Model::config& c, const batch& b, const plan_setup& setup) {
  const layout_config& L = setup.layout;
  plan_numbers n{L.tp, L.pp, L.dp, L.cp, L.virtual_chunks, L.ep};
  const int t = n.t, p = n.p, dp = n.dp, cp = n.cp, V = n.V, ep = n.ep;
  n.sp = L.sequence_parallel == 1 && t > 1;
  n.s = sequence_length(c, b);
  n.form = L.context_form == "all_to_all" ? context_form::all_to_all : context_form::ring;
  const std::int64_t s = n.s;
  check_tensor_extents<Model>(c, t, "plan: ");
  STRATA_CHECK(cp == 1 || s % (2 * cp) == 0, "plan: context parallelism cp=", cp,
               " cuts each sequence into 2·cp = ", 2 * cp, " chunks, which do not divide the sequence length ", s);
  n.layers = Model::layers(c).blocks().count;
  STRATA_CHECK(n.layers % (p * V) == 0, "plan: ", n.layers, " layers do not split evenly over ", p, " stages x ", V,
               " chunks");
  STRATA_CHECK(!n.sp || s / cp % t == 0, "plan: sequence parallelism over tp=", t,
               " needs the tokens per context rank divisible by it, got ", s / cp);
  STRATA_CHECK(b.global % (dp * b.micro) == 0, "plan: the global batch ", b.global, " does not split into dp=", dp,
               " x micro-batches of ", b.micro);
  STRATA_CHECK(p == 1 || L.zero_stage <= 1, "plan: pipeline parallelism works with ZeRO 0 or 1, not ", L.zero_stage);
  STRATA_CHECK(ep >= 1 && (dp * cp) % ep == 0, "plan: expert parallelism ep=", ep,
               " does not divide dp x cp = ", dp * cp);
  n.M = b.global / (dp * b.micro);
  STRATA_CHECK(V == 1 || setup.schedule == pipeline_schedule_kind::interleaved, "plan: ", V,
               " virtual chunks per stage need the interleaved schedule");
  STRATA_CHECK(V == 1 || n.M % p == 0, "plan: interleaved 1F1B needs microbatches (", n.M,
               ") divisible by the pipeline degree (", p, ")");
  n.per_stage = n.layers / p;
  n.per_chunk = n.layers / (p * V);
  return n;
}

// The parameters of the busiest stage, and the model state ZeRO leaves a rank of it: over the
// gradient group dp × cp (pieces rounded up: rank 0 holds the largest), a rank's experts over
// the expert-data group, dp·cp/ep ranks.
template <class Precision, class T>
constexpr void plan_model_state(plan_result& r, const plan_numbers& n, const part_costs& mine,
                                const plan_setup& setup) {
  const int p = n.p, replicas_n = n.dp * n.cp, expert_replicas = replicas_n / n.ep;
  // The busiest stage: the first (the parts before the blocks), the last (the parts after them
  // and, when it is another stage, its replica of a tied parameter), or with one stage both.
  const std::int64_t first = mine.before.params + (p > 1 ? mine.before.tied_params : 0);
  const std::int64_t last = mine.after.params + (p > 1 ? mine.after.tied_params : 0);
  const std::int64_t blocks = n.per_stage * mine.block.params;
  r.params_per_rank = p == 1 ? first + blocks + last : std::max(first + blocks, blocks + last);
  r.expert_params_per_rank = n.per_stage * mine.block.expert_params;
  // Without expert parallelism experts share buckets with the rest: one group, one rounding.
  const std::int64_t psi = r.params_per_rank, experts_psi = n.ep > 1 ? r.expert_params_per_rank : 0;
  const std::int64_t dense_psi = psi - experts_psi;
  const std::int64_t owned = ceil_div(dense_psi, replicas_n) + ceil_div(experts_psi, expert_replicas);
  const int z = setup.layout.zero_stage;
  const std::int64_t storage = sizeof(T);
  constexpr int master = sizeof(typename Precision::master);
  const auto state_of = [&](std::int64_t elements, int over) {
    return model_state_plan(
        elements, {int(storage), Precision::keeps_master_copy ? master : 0, master, setup.optimizer, over, z});
  };
  const auto dense = state_of(dense_psi, replicas_n), experts = state_of(experts_psi, expert_replicas);
  r.params_bytes = dense.params_bytes + experts.params_bytes;
  r.grads_bytes = dense.grads_bytes + experts.grads_bytes;
  r.master_bytes = dense.master_bytes + experts.master_bytes;
  r.optimizer_bytes = dense.optimizer_bytes + experts.optimizer_bytes;
  r.comm_buffer_bytes = z == 1 && replicas_n > 1 ? owned * storage : 0;
  r.optimizer_params_per_rank = z >= 1 ? owned : psi;
  r.stage_blocks = n.per_stage;
  r.storage_bytes = int(storage);
}

// The busiest stage's work per micro-batch: with one stage the whole model, otherwise the first
// (the parts before the blocks) or the last (those after), whichever has more FLOPs.
constexpr layer_cost stage_work(const part_costs& k, const plan_numbers& n) {
  const layer_cost blocks = k.block.repeated(n.per_stage);
  if (n.p == 1) return k.before.then(blocks).then(k.after);
  const layer_cost first_stage = k.before.then(blocks), last_stage = blocks.then(k.after);
  const auto flops = [](const layer_cost& x) { return x.forward_flops + x.backward_flops; };
  return flops(first_stage) >= flops(last_stage) ? first_stage : last_stage;
}

// Activations kept from forward to backward, per chunk-micro-batch, on each stage, and the step's
// peak.
constexpr void plan_activations(plan_result& r, const plan_numbers& n, const part_costs& mine,
                                const plan_setup& setup) {
  const int p = n.p, V = n.V;
  const std::int64_t act_blocks = n.per_chunk * mine.block.activation_bytes;
  const std::int64_t act_input = mine.block.output_bytes;  // an activation received from the stage before
  r.microbatches = n.M;
  if (p == 1 && V == 1) {
    r.activation_bytes_per_microbatch = mine.before.activation_bytes + act_blocks + mine.after.activation_bytes;
    r.activation_bytes = r.activation_bytes_per_microbatch;
    r.in_flight = 1;
    const layer_cost model = mine.before.then(mine.block.repeated(n.per_chunk)).then(mine.after);
    r.activation_peak_bytes =
        layer_cost::max_of(model.forward_high(), model.activation_bytes + model.backward_peak_bytes);
    return;
  }
  // Each stage: its in-flight chunk-micro-batches times its largest chunk (exact for V = 1).
  // The peak adds to what is in flight (the first backward comes when the most micro-batches
  // are) the largest chunk's backward scratch, and two activations of the stage boundary: the
  // output gradient the backward received, and the receive posted for the next action.
  const layer_cost chunk_blocks = mine.block.repeated(n.per_chunk);
  for (int stage = 0; stage < p; ++stage) {
    std::int64_t largest = 0, scratch = 0;
    for (int ch = 0; ch < V; ++ch) {
      const int v = ch * p + stage;
      std::int64_t bytes = act_blocks + (v == 0 ? mine.before.activation_bytes : act_input);
      if (v == p * V - 1) bytes += mine.after.activation_bytes;
      largest = std::max(largest, bytes);
      layer_cost chunk = v == 0 ? mine.before.then(chunk_blocks) : chunk_blocks;
      if (v == p * V - 1) chunk = chunk.then(mine.after);
      scratch = std::max(scratch, chunk.backward_peak_bytes);
    }
    const int in_flight_here = in_flight(setup.schedule, p, stage, int(n.M), V);
    if (std::int64_t(in_flight_here) * largest > r.activation_bytes) {
      r.activation_bytes = std::int64_t(in_flight_here) * largest;
      r.activation_bytes_per_microbatch = largest * V;
      r.in_flight = in_flight_here;
    }
    r.activation_peak_bytes =
        std::max(r.activation_peak_bytes, std::int64_t(in_flight_here) * largest + scratch + 2 * act_input);
  }
}

// FLOPs of one iteration, whole model (unsplit costs over the global batch); recomputation is
// counted in flops_per_step, not in model_flops_per_step (MFU's numerator).
constexpr void plan_flops(plan_result& r, const plan_numbers& n, const part_costs& whole, const part_costs& plain) {
  const auto step_flops = [&](const part_costs& k) {
    return double(k.before.forward_flops + k.before.backward_flops) +
           double(n.layers) * double(k.block.forward_flops + k.block.backward_flops) +
           double(k.after.forward_flops + k.after.backward_flops);
  };
  r.model_flops_per_step = step_flops(plain);
  r.flops_per_step = step_flops(whole);
  // The busiest stage: its blocks plus the parts before (first) or after (last) the blocks,
  // shared by its dp·cp·t ranks.
  const double stage_blocks = double(n.per_stage) * double(whole.block.forward_flops + whole.block.backward_flops);
  const double head = double(whole.before.forward_flops + whole.before.backward_flops);
  const double tail = double(whole.after.forward_flops + whole.after.backward_flops);
  const double busiest = n.p == 1 ? stage_blocks + head + tail : stage_blocks + std::max(head, tail);
  r.flops_per_rank = busiest / double(n.dp * n.cp * n.t);
}

// Communication per rank per step (bytes), each group's.
constexpr void plan_communication(plan_result& r, const plan_numbers& n, const part_costs& mine,
                                  const plan_setup& setup) {
  const int p = n.p, z = setup.layout.zero_stage, replicas_n = n.dp * n.cp, expert_replicas = replicas_n / n.ep;
  const double S = double(r.storage_bytes);
  const int n_micro = int(n.M);
  const std::int64_t experts_psi = n.ep > 1 ? r.expert_params_per_rank : 0, dense_psi = r.params_per_rank - experts_psi;
  const auto gradient_bytes = [&](double bytes, int over) {
    switch (z) {
      case 0:
      case 1: return ring_all_reduce_bytes(bytes, over);               // RS + AG = AR
      case 2: return (n_micro + 1) * ring_gather_bytes(bytes, over);   // RS per micro-batch, AG once
      default: return 3.0 * n_micro * ring_gather_bytes(bytes, over);  // 2 AG + RS per micro-batch
    }
  };
  r.comm_bytes.dp =
      gradient_bytes(double(dense_psi) * S, replicas_n) + gradient_bytes(double(experts_psi) * S, expert_replicas);
  // Expert parallel: the busiest stage's MoE blocks' all-to-alls, per micro-batch.
  r.comm_bytes.ep = n.ep > 1 ? double(n.per_stage) * mine.block.expert_bytes() * n_micro : 0.0;
  // Tensor parallel: what the layers of the busiest stage send, per micro-batch.
  const double block_tp = double(n.per_stage) * mine.block.tensor_bytes();
  const double first_tp = block_tp + mine.before.tensor_bytes(), last_tp = block_tp + mine.after.tensor_bytes();
  const double per_micro =
      p == 1 ? block_tp + mine.before.tensor_bytes() + mine.after.tensor_bytes() : std::max(first_tp, last_tp);
  r.comm_bytes.tp = n.t > 1 ? per_micro * n_micro : 0.0;
  // Context parallel: what the busiest stage's attention sends around its context group.
  const double block_cp = double(n.per_stage) * mine.block.context_bytes();
  const double cp_micro = p == 1
                              ? block_cp + mine.before.context_bytes() + mine.after.context_bytes()
                              : std::max(block_cp + mine.before.context_bytes(), block_cp + mine.after.context_bytes());
  r.comm_bytes.cp = n.cp > 1 ? cp_micro * n_micro : 0.0;
  // Pipeline: each chunk-micro-batch sends its activation on and its input gradient back.
  r.comm_bytes.pp = p > 1 ? 2.0 * double(n_micro) * n.V * double(mine.block.output_bytes) : 0.0;
  // Tied parameters: the replica's gradient summed with the owner's, once per step.
  const std::int64_t replicas = p > 1 ? mine.before.tied_params + mine.after.tied_params : 0;
  r.comm_bytes.embedding = p > 1 ? ring_all_reduce_bytes(double(replicas) * S, 2) : 0.0;
}
}  // namespace plan_detail

// The plan for a declared model with config `c` under `setup`, in its policy's precision. Checks
// the layout against the model first (the same words as at start-up).
template <class Model>
constexpr plan_result plan_model(const typename Model::config& c, const batch& b, const plan_setup& setup) {
  using P = typename Model::policy;
  const plan_detail::plan_numbers n = plan_detail::checked_numbers<Model>(c, b, setup);
  const cost_scope here{{n.t, n.sp}, b.micro, n.s, setup.recompute, n.cp, n.form, n.ep};
  cost_scope here_plain = here;
  here_plain.recompute = recompute_mode::none;
  // One micro-batch on this rank, and the whole model unsplit over the global batch (FLOPs).
  const plan_detail::part_costs mine = plan_detail::costs_of<Model>(c, here),
                                mine_plain = plan_detail::costs_of<Model>(c, here_plain);
  const plan_detail::part_costs whole = plan_detail::costs_of<Model>(c, {{}, b.global, n.s, setup.recompute});
  const plan_detail::part_costs plain = plan_detail::costs_of<Model>(c, {{}, b.global, n.s, recompute_mode::none});

  plan_result r;
  r.params_total =
      plan_detail::costs_of<Model>(c, {}).before.params + n.layers * whole.block.params + whole.after.params;
  r.params_active =
      r.params_total - (whole.before.idle_params + n.layers * whole.block.idle_params + whole.after.idle_params);
  plan_detail::plan_model_state<typename P::precision, typename P::storage>(r, n, mine, setup);
  r.stage_work = plan_detail::stage_work(mine, n);
  r.stage_work_plain = plan_detail::stage_work(mine_plain, n);
  plan_detail::plan_activations(r, n, mine, setup);
  plan_detail::plan_flops(r, n, whole, plain);
  plan_detail::plan_communication(r, n, mine, setup);
  r.bubble_fraction = n.p > 1 ? double(n.p - 1) / double(n.V * n.M + n.p - 1) : 0.0;
  return r;
}

// The layout of a policy whose layout type fixes everything: usable in static_assert.
template <class Policy>
constexpr plan_setup static_plan_setup(recompute_mode r, optimizer_kind o) {
  using L = typename Policy::layout;
  static_assert(L::is_fully_static,
                "strata::plan<Model>: the layout leaves values to the launch; call plan_model "
                "with the resolved layout at start-up");
  plan_setup setup;
  setup.layout.dp = L::dp;
  setup.layout.cp = L::cp;
  setup.layout.ep = L::ep;
  setup.layout.context_form = context_form_name<typename L::context_form>;
  setup.layout.tp = L::tp;
  setup.layout.pp = L::pp;
  setup.layout.zero_stage = L::zero_stage;
  setup.layout.sequence_parallel = L::sequence_parallel;
  setup.layout.microbatches = L::microbatches;
  setup.layout.virtual_chunks = L::virtual_chunks;
  setup.recompute = r;
  setup.optimizer = o;
  setup.schedule = std::is_base_of_v<interleaved_1f1b, typename L::schedule> ? pipeline_schedule_kind::interleaved
                   : std::is_base_of_v<one_f_one_b, typename L::schedule>    ? pipeline_schedule_kind::one_f_one_b
                                                                             : pipeline_schedule_kind::gpipe;
  return setup;
}

// The plan of a model under its policy's static layout, for a config given here or the model's
// static shape (`static constexpr config shape`).
template <class Model>
constexpr plan_result plan(const typename Model::config& c, const batch& b, recompute_mode r = recompute_mode::none,
                           optimizer_kind o = optimizer_kind::adamw) {
  static_assert(check_static_layout<Model>());
  return plan_model<Model>(c, b, static_plan_setup<typename Model::policy>(r, o));
}
template <class Model>
requires has_static_shape<Model>
constexpr plan_result plan(const batch& b, recompute_mode r = recompute_mode::none,
                           optimizer_kind o = optimizer_kind::adamw) {
  return plan<Model>(Model::shape, b, r, o);
}

}  // namespace strata
