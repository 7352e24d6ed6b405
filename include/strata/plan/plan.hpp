// strata/plan/plan.hpp - what each rank holds, computes and communicates, before anything runs.
//
// The plan of a GPT-style model (strata's embedding, transformer blocks, final LayerNorm and tied
// head) under a layout and precision is the sum of the layers' own constexpr costs
// (param_count, activation_bytes, forward/backward_flops) with each layer's tensor split, plus
// the analytic formulas of the parallel axes. All of it is constexpr:
//
//   struct shape { static constexpr st::model_shape value{.vocab = 50304, .seq = 1024, .layers = 12,
//                                                          .heads = 12, .hidden = 768}; };
//   using Policy = st::policy<st::cuda, st::parallel<st::data<8, st::zero<1>>, st::tensor<2>>, st::mixed<st::bf16, float>>;
//   static_assert(st::plan<shape, Policy>(st::batch{.micro = 4, .global = 512}).fits(st::hw::h100_80gb));
//
// A plan that does not fit fails to compile in a call to model_state_exceeds_device_memory(),
// activations_exceed_device_memory() or total_exceeds_device_memory(): the function's name says
// which category overflows. With dynamic degrees, plan_gpt<Precision>(shape, batch, setup) gives the
// same figures at start-up and check_fits() throws with the numbers. docs/planner.md has every
// formula and its source.
//
// Per rank means the busiest rank: the pipeline stage holding the most (the first holds the
// embedding, the last the head and its copy of the tied table). Bytes are exact for what strata's
// allocator charges when the ZeRO pieces split evenly (Ψ divisible by dp and one bucket; otherwise
// within one bucket's rounding). Activations are those kept from forward to backward (transients
// of a single layer are not counted).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "strata/core/error.hpp"
#include "strata/layers/embedding.hpp"
#include "strata/layers/layernorm.hpp"
#include "strata/layers/lm_head.hpp"
#include "strata/layers/recompute.hpp"
#include "strata/layers/transformer_block.hpp"
#include "strata/parallel/pipeline_schedule.hpp"
#include "strata/plan/hardware.hpp"
#include "strata/policy/layout.hpp"
#include "strata/policy/policy.hpp"

namespace strata {

struct model_shape {
  std::int64_t vocab = 0, seq = 0, layers = 0, heads = 0, hidden = 0;
  std::int64_t ffn = 0;  // 0: 4 x hidden
  constexpr std::int64_t ffn_width() const { return ffn > 0 ? ffn : 4 * hidden; }
};

struct batch {
  std::int64_t micro = 1, global = 1;  // sequences per micro-batch, and per step over all ranks
};

enum class optimizer_kind { adamw, sgd };  // sgd: with momentum (one fp32 moment)

struct plan_setup {
  layout_config layout{};
  recompute_mode recompute = recompute_mode::none;
  optimizer_kind optimizer = optimizer_kind::adamw;
  pipeline_schedule_kind schedule = pipeline_schedule_kind::one_f_one_b;
};

// Per-rank bytes communicated per step, by process group (ring volumes, as counters.hpp).
struct comm_plan {
  double dp = 0, tp = 0, pp = 0, embedding = 0;
  constexpr double total() const { return dp + tp + pp + embedding; }
};

// Non-constexpr on purpose: a constant-evaluated fits() that calls one fails to compile, and the
// compiler names the function - and so the category - that overflowed.
inline bool model_state_exceeds_device_memory() { return false; }
inline bool activations_exceed_device_memory() { return false; }
inline bool total_exceeds_device_memory() { return false; }

struct plan_result {
  std::int64_t params_total = 0;     // Ψ of the whole model (serial, unpadded vocabulary)
  std::int64_t params_per_rank = 0;  // the busiest rank's share, before ZeRO
  std::int64_t params_bytes = 0, grads_bytes = 0, master_bytes = 0, optimizer_bytes = 0, comm_buffer_bytes = 0;
  std::int64_t activation_bytes_per_microbatch = 0;  // one micro-batch on the busiest stage
  std::int64_t activation_bytes = 0;                 // at the schedule's peak in flight
  int in_flight = 1;                                 // (chunk-)micro-batches at that peak
  std::int64_t microbatches = 1;                     // per step and data-parallel rank
  double flops_per_step = 0;        // the whole model, one iteration, recomputation included
  double model_flops_per_step = 0;  // the same without recomputation (for MFU)
  double flops_per_rank = 0;        // the busiest stage's FLOPs per step, over its dp·t ranks
  comm_plan comm_bytes{};
  double bubble_fraction = 0;

  constexpr std::int64_t model_state_bytes() const { return params_bytes + grads_bytes + master_bytes + optimizer_bytes; }
  constexpr std::int64_t total_bytes() const { return model_state_bytes() + activation_bytes + comm_buffer_bytes; }

  // True when the busiest rank's bytes fit the device; see model_state_exceeds_device_memory.
  constexpr bool fits(const hw::device_spec& d) const {
    const double mem = d.memory_bytes;
    if (double(model_state_bytes()) > mem) return std::is_constant_evaluated() ? model_state_exceeds_device_memory() : false;
    if (double(activation_bytes) > mem) return std::is_constant_evaluated() ? activations_exceed_device_memory() : false;
    if (double(total_bytes()) > mem) return std::is_constant_evaluated() ? total_exceeds_device_memory() : false;
    return true;
  }
  // The start-up form: throws, naming the category and the numbers.
  void check_fits(const hw::device_spec& d) const {
    const auto gb = [](double b) { return b / 1e9; };
    STRATA_CHECK(double(model_state_bytes()) <= d.memory_bytes, "plan: model state of ", gb(double(model_state_bytes())),
                 " GB per rank does not fit ", d.name, " (", gb(d.memory_bytes), " GB)");
    STRATA_CHECK(double(total_bytes()) <= d.memory_bytes, "plan: ", gb(double(total_bytes())), " GB per rank (model state ",
                 gb(double(model_state_bytes())), " + activations ", gb(double(activation_bytes)), " + buffers ",
                 gb(double(comm_buffer_bytes)), ") does not fit ", d.name, " (", gb(d.memory_bytes), " GB)");
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

// Ring volumes in elements (counters.hpp): all-reduce 2(n-1)/n, gather and scatter (n-1)/n.
constexpr double all_reduce(double elems, int n) { return n > 1 ? 2.0 * (n - 1) / n * elems : 0.0; }
constexpr double half_ring(double elems, int n) { return n > 1 ? double(n - 1) / n * elems : 0.0; }

}  // namespace plan_detail

// The plan for `shape` under `setup` with the precision's types (Precision: st::fp32,
// st::mixed<st::bf16, float>, ...). Checks the layout against the shape first (the same words as
// at start-up).
template <class Precision>
constexpr plan_result plan_gpt(const model_shape& m, const batch& b, const plan_setup& setup) {
  using P = policy<host, serial, Precision>;
  using T = typename P::storage;
  using block = recompute<recompute_mode_by_config, transformer_block<P>>;
  const layout_config& L = setup.layout;
  const int t = L.tp, p = L.pp, dp = L.dp, V = L.virtual_chunks;
  const bool sp = L.sequence_parallel && t > 1;
  STRATA_CHECK(m.heads % t == 0, "plan: tensor parallelism tp=", t, " does not divide heads = ", m.heads);
  STRATA_CHECK(m.ffn_width() % t == 0, "plan: tensor parallelism tp=", t, " does not divide the FFN width ", m.ffn_width());
  STRATA_CHECK(m.layers % (p * V) == 0, "plan: ", m.layers, " layers do not split evenly over ", p, " stages x ", V,
               " chunks");
  STRATA_CHECK(!sp || m.seq % t == 0, "plan: sequence parallelism over tp=", t, " needs seq divisible by it, got ", m.seq);
  STRATA_CHECK(b.global % (dp * b.micro) == 0, "plan: the global batch ", b.global, " does not split into dp=", dp,
               " x micro-batches of ", b.micro);
  STRATA_CHECK(p == 1 || L.zero_stage <= 1, "plan: pipeline parallelism works with ZeRO 0 or 1, not ", L.zero_stage);
  const std::int64_t M = b.global / (dp * b.micro);
  STRATA_CHECK(V == 1 || setup.schedule == pipeline_schedule_kind::interleaved, "plan: ", V,
               " virtual chunks per stage need the interleaved schedule");
  STRATA_CHECK(V == 1 || M % p == 0, "plan: interleaved 1F1B needs microbatches (", M,
               ") divisible by the pipeline degree (", p, ")");
  const tensor_split split{t, sp};

  typename embedding<P>::config emb{m.vocab, m.seq, m.hidden, 0.02, split};
  typename block::config blk;
  static_cast<typename transformer_block<P>::config&>(blk) = {m.hidden, m.heads, m.ffn_width(), 1e-5, 0.02, 0.02, split};
  blk.recompute = setup.recompute;
  const typename layernorm<P>::config lnf{m.hidden, 1e-5, split};
  const typename lm_head<P>::config head{m.vocab, m.hidden, 0.02, split};
  const std::int64_t per_stage = m.layers / p, per_chunk = m.layers / (p * V);

  plan_result r;
  // Ψ: the serial model's count.
  {
    typename embedding<P>::config e1 = emb;
    e1.tp = {};
    auto b1 = blk;
    b1.tp = {};
    r.params_total = embedding<P>::param_count(e1) + m.layers * block::param_count(b1) + 2 * m.hidden;
  }
  // The busiest stage: the first (embedding), the last (final LayerNorm and its copy of the
  // table), or with one stage both.
  const std::int64_t blocks = per_stage * block::param_count(blk);
  const std::int64_t table = embedding<P>::param_count(emb);
  const std::int64_t tail = layernorm<P>::param_count(lnf) + (p > 1 ? lm_head<P>::param_count(head, false) : 0);
  r.params_per_rank = p == 1 ? table + blocks + tail : std::max(table + blocks, blocks + tail);

  // Model state, ZeRO over dp (pieces rounded up: rank 0 holds the largest).
  const std::int64_t psi = r.params_per_rank, owned = plan_detail::ceil_div(psi, dp);
  const int z = L.zero_stage;
  const std::int64_t storage = sizeof(T);
  {
    constexpr int master = sizeof(typename Precision::master);
    const auto state = model_state_plan(psi, {int(storage), Precision::keeps_master_copy ? master : 0, master,
                                              setup.optimizer, dp, z});
    r.params_bytes = state.params_bytes;
    r.grads_bytes = state.grads_bytes;
    r.master_bytes = state.master_bytes;
    r.optimizer_bytes = state.optimizer_bytes;
  }
  r.comm_buffer_bytes = z == 1 && dp > 1 ? owned * storage : 0;

  // Activations kept from forward to backward, per chunk-micro-batch, on each stage.
  const std::int64_t mb = b.micro, s = m.seq;
  const std::int64_t act_blocks = per_chunk * block::activation_bytes(blk, mb, s);
  const std::int64_t act_embed = embedding<P>::activation_bytes(emb, mb, s);
  const std::int64_t act_tail = layernorm<P>::activation_bytes(lnf, mb, s) + lm_head<P>::activation_bytes(head, mb, s);
  const std::int64_t act_input = mb * (sp ? s / t : s) * m.hidden * storage;  // a received activation
  r.microbatches = M;
  if (p == 1 && V == 1) {
    r.activation_bytes_per_microbatch = act_embed + act_blocks + act_tail;
    r.activation_bytes = r.activation_bytes_per_microbatch;
    r.in_flight = 1;
  } else {
    // Each stage: its in-flight chunk-micro-batches times its largest chunk (exact for V = 1).
    for (int stage = 0; stage < p; ++stage) {
      std::int64_t largest = 0;
      for (int c = 0; c < V; ++c) {
        const int v = c * p + stage;
        std::int64_t bytes = act_blocks + (v == 0 ? act_embed : act_input);
        if (v == p * V - 1) bytes += act_tail;
        largest = std::max(largest, bytes);
      }
      const int n = plan_detail::in_flight(setup.schedule, p, stage, int(M), V);
      if (std::int64_t(n) * largest > r.activation_bytes) {
        r.activation_bytes = std::int64_t(n) * largest;
        r.activation_bytes_per_microbatch = largest * V;
        r.in_flight = n;
      }
    }
  }

  // FLOPs of one iteration, whole model (unsplit costs over the global batch).
  {
    auto e1 = emb;
    e1.tp = {};
    auto b1 = blk;
    b1.tp = {};
    auto n1 = lnf;
    n1.tp = {};
    auto h1 = head;
    h1.tp = {};
    const std::int64_t B = b.global;
    const double fwd = double(embedding<P>::forward_flops(e1, B, s)) +
                       double(m.layers) * double(block::forward_flops(b1, B, s)) +
                       double(layernorm<P>::forward_flops(n1, B, s)) + double(lm_head<P>::forward_flops(h1, B, s));
    const double bwd = double(embedding<P>::backward_flops(e1, B, s)) +
                       double(m.layers) * double(transformer_block<P>::backward_flops(b1, B, s)) +
                       double(layernorm<P>::backward_flops(n1, B, s)) + double(lm_head<P>::backward_flops(h1, B, s));
    const double block_fwd = double(transformer_block<P>::forward_flops(b1, B, s));
    const double block_bwd = double(transformer_block<P>::backward_flops(b1, B, s));
    double block_again = 0;  // recomputation
    if (setup.recompute == recompute_mode::full) block_again = block_fwd;
    if (setup.recompute == recompute_mode::selective)
      block_again = double(attention<P>::core_flops(transformer_block<P>::attn_config(b1), B, s));
    r.model_flops_per_step = fwd + bwd;
    r.flops_per_step = fwd + bwd + double(m.layers) * block_again;
    // The busiest stage: its blocks plus the embedding (first) or the final LayerNorm and head
    // (last), shared by its dp·t ranks.
    const double stage_blocks = double(per_stage) * (block_fwd + block_bwd + block_again);
    const double first = double(embedding<P>::forward_flops(e1, B, s) + embedding<P>::backward_flops(e1, B, s));
    const double last = double(layernorm<P>::forward_flops(n1, B, s) + layernorm<P>::backward_flops(n1, B, s) +
                               lm_head<P>::forward_flops(h1, B, s) + lm_head<P>::backward_flops(h1, B, s));
    const double busiest = p == 1 ? stage_blocks + first + last : stage_blocks + std::max(first, last);
    r.flops_per_rank = busiest / double(dp * t);
  }

  // Communication per rank per step (bytes).
  {
    const double S = double(storage);
    const double psi_b = double(psi) * S;
    const int n_micro = int(M);
    switch (z) {
      case 0:
      case 1: r.comm_bytes.dp = plan_detail::all_reduce(psi_b, dp); break;  // RS + AG = AR
      case 2: r.comm_bytes.dp = (n_micro + 1) * plan_detail::half_ring(psi_b, dp); break;  // RS per micro-batch, AG once
      default: r.comm_bytes.dp = 3.0 * n_micro * plan_detail::half_ring(psi_b, dp); break;  // 2 AG + RS per micro-batch
    }
    // Tensor parallel, per micro-batch and block: 2 all-reduces of b·s·h forward, 2 backward (one
    // more forward's pair under full recomputation); sequence parallel: the same volume as
    // gathers and scatters, plus 2 re-gathers in backward and the LayerNorm gradient sums.
    const double bsh = double(mb * s * m.hidden) * S;
    const int passes = setup.recompute == recompute_mode::full ? 3 : 2;  // forward, backward (, forward again)
    double per_block = 2.0 * passes * plan_detail::all_reduce(bsh, t);
    if (sp) per_block += 2 * plan_detail::half_ring(bsh, t) + 2 * plan_detail::all_reduce(double(2 * m.hidden) * S, t);
    double per_micro = double(per_stage) * per_block;
    // The embedding leaves its region once; the head enters one (and its loss needs 3 all-reduces of b·s).
    per_micro += plan_detail::all_reduce(bsh, t) + plan_detail::all_reduce(bsh, t) +
                 plan_detail::all_reduce(3.0 * double(mb * s) * 4.0, t);
    r.comm_bytes.tp = t > 1 ? per_micro * n_micro : 0.0;
    // Pipeline: each chunk-micro-batch sends its activation on and its input gradient back.
    r.comm_bytes.pp = p > 1 ? 2.0 * double(n_micro) * V * double(act_input) : 0.0;
    r.comm_bytes.embedding = p > 1 ? plan_detail::all_reduce(double(lm_head<P>::param_count(head, false)) * S, 2) : 0.0;
  }
  r.bubble_fraction = p > 1 ? double(p - 1) / double(V * M + p - 1) : 0.0;
  return r;
}

// The plan of a model shape given as a type (static constexpr model_shape value) under a policy
// whose layout is static: usable in static_assert.
template <class Shape, class Policy>
constexpr plan_result plan(const batch& b, recompute_mode r = recompute_mode::none,
                           optimizer_kind o = optimizer_kind::adamw) {
  using L = typename Policy::layout;
  static_assert(L::is_static, "strata::plan<Shape, Policy>: the layout has dynamic degrees; call plan_gpt at start-up");
  plan_setup setup;
  setup.layout.dp = L::dp;
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
  return plan_gpt<typename Policy::precision>(Shape::value, b, setup);
}

}  // namespace strata
