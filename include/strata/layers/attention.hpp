// strata/layers/attention.hpp - causal self-attention: multi-head (GPT-2), grouped-query or
// multi-query (Llama), with rotary positions or without.
//
// x [B, T, C] -> qkv = x·Wqkvᵀ (+ b) [B, T, (H + 2·KV)·d]: H query heads, KV key/value heads of d
// = C/H each -> optionally q and k turned by their positions (rotary embedding, in place in qkv)
// -> per query head softmax(q·kᵀ·scale, causal)·v with the key/value head it shares (never
// repeated in memory) [B, T, C] -> y = ·Wprojᵀ (+ b) [B, T, C]. Keeps one logsumexp per query
// row for backward (no T² term). With recompute_core(true) (selective recomputation) it drops the
// logsumexps after forward and recomputes them from the kept qkv in backward.
//
// Tensor parallel over t ranks: sharded by heads. QKV is column-parallel with its q, k and v
// groups split separately (each rank gets H/t query heads and their KV/t key/value heads, so a
// grouped-query layer communicates exactly like a multi-head one); with fewer key/value heads
// than ranks (t a multiple of KV) each key/value head goes to t/KV ranks. The core runs on this
// rank's heads alone; the projection is row-parallel.
//
// Context parallel over cp ranks (layers/context_parallel.hpp): x holds this rank's two chunks
// of every sequence. q and k turn by each token's absolute position, one chunk at a time, and
// the core is layers/context_attention.hpp in the layout's form: the ring (key/value blocks
// passed round, partial outputs merged by logsumexp) or all-to-all (heads exchanged for the
// sequence; this rank's H/t query and key/value heads must divide by cp). The projections see
// only local tokens and need nothing.
//
// Variants (config): the rotary embedding may turn only the first rotary_fraction of each head
// (partial rotary: GPT-NeoX's 0.25); the fused projection's rows may come per head, [H, 3, d]
// (fused_qkv = qkv_layout::per_head, GPT-NeoX's layout: under tensor parallelism each rank's
// heads are then one contiguous block), regrouped into [q | k | v] right after the projection
// (kernels/qkv_layout.hpp) and their gradients back before its backward, so everything between
// sees the one layout the kernels read.
//
// Generation (layers/cached_forward.hpp): forward_cached runs the new tokens alone, turned by
// their absolute positions, and keeps every position's keys and values of this rank's key/value
// heads, [B, capacity, KV/t·d] each, until release_cache(); each new query attends to the cache
// (kernels/cached_attention.hpp).
#pragma once
#include <cstdint>
#include <optional>

#include "strata/core/profile.hpp"
#include "strata/core/tensor.hpp"
#include "strata/kernels/attention.hpp"
#include "strata/kernels/attention_shape.hpp"
#include "strata/kernels/cached_attention.hpp"
#include "strata/kernels/qkv_layout.hpp"
#include "strata/kernels/rope.hpp"
#include "strata/layers/cached_forward.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/linear.hpp"
#include "strata/layers/context_attention.hpp"

namespace strata {

// How a fused QKV projection orders its output features (its weight's rows): every query head,
// then every key head, then every value head (grouped: strata's and Llama's fused q|k|v), or
// each head's q, k and v together (per_head: GPT-NeoX's query_key_value, [heads, 3, d]).
enum class qkv_layout { grouped, per_head };

template <class P>
class attention {
 public:
  using policy = P;
  using T = typename P::storage;
  using A = typename P::accumulate;

  struct config {
    std::int64_t channels = 0, heads = 0;
    std::int64_t kv_heads = 0;   // key/value heads, dividing heads; 0: as many as heads
    double rope_theta = 0;       // rotary position embedding's base; 0: none (positions come from elsewhere)
    double scale = 0;            // softmax scale; 0: 1/sqrt(head size)
    bool bias = true;            // biases on the QKV and output projections
    double rotary_fraction = 1;  // the share of each head the rotary embedding turns (its first elements)
    qkv_layout fused_qkv = qkv_layout::grouped;  // per_head needs kv_heads = heads
    double init_std = 0.02;
    double proj_init_std = 0.02;  // GPT-2 scales the residual projection by 1/sqrt(2·layers)

    constexpr std::int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
    constexpr std::int64_t head_dim() const { return heads > 0 ? channels / heads : 0; }
    // The elements of each head the rotary embedding turns (GPT-NeoX rounds down likewise).
    constexpr std::int64_t rotary_dims() const {
      return static_cast<std::int64_t>(static_cast<double>(head_dim()) * rotary_fraction);
    }
  };

  static constexpr typename linear<P>::config qkv_config(const config& c) {
    typename linear<P>::config l{.in = c.channels,
                                 .out = (c.heads + 2 * c.kv()) * c.head_dim(),
                                 .bias = c.bias,
                                 .init_std = c.init_std,
                                 .split = tensor_split_kind::column,
                                 .blocks = 3};
    if (c.fused_qkv == qkv_layout::per_head) {
      l.blocks = 1;                  // rank r's heads are rows [r·3C/t, (r+1)·3C/t)
    } else if (c.kv() != c.heads) {  // q, k and v groups of unequal sizes, split by heads
      l.blocks = 1;
      l.block_sizes = {c.heads * c.head_dim(), c.kv() * c.head_dim(), c.kv() * c.head_dim(), 0};
      l.block_heads = {c.heads, c.kv(), c.kv(), 0};
    }
    return l;
  }
  static constexpr typename linear<P>::config proj_config(const config& c) {
    return {.in = c.channels,
            .out = c.channels,
            .bias = c.bias,
            .init_std = c.proj_init_std,
            .split = tensor_split_kind::row};
  }

  static constexpr tensor_extent_list tensor_extents(const config& c) {
    tensor_extent_list r{{"heads", c.heads}};
    if (c.kv() != c.heads) r.add(tensor_extent{"kv_heads", c.kv(), true});
    return r;
  }
  // q·kᵀ and probs·v: 2 x 2·T·T·C per sequence (the causal half is not subtracted, as in the usual
  // 6ND accounting), a 1/cp share per context rank. Keeps qkv, the logsumexps (the core), the
  // heads' output and the projection's output; the rotary embedding works in place in qkv. Under
  // all-to-all context parallelism the core keeps its heads' gathered qkv in place of this
  // rank's own (as many bytes; beside it for a moment in forward), and the context group carries
  // context_attention_traffic.
  static constexpr layer_cost cost(const config& c, const cost_scope& s) {
    const std::int64_t t = s.tp.degree, rows = s.rows();
    const kernels::attention_shape local = shape_of(c, t, s.batch, s.local_seq());
    layer_cost core;
    core.core_flops = core.forward_flops = 4 * s.batch * s.seq * s.seq * c.channels / t / s.cp;
    core.backward_flops = 2 * core.forward_flops;
    core.attention_forward_flops = double(core.forward_flops);
    core.attention_backward_flops = double(core.backward_flops);
    core.attention_forward_scores = core.attention_backward_scores =
        double(s.batch) * double(local.heads) * double(s.local_seq()) * double(s.seq);
    core.core_bytes =
        s.batch * local.heads * s.local_seq() * static_cast<std::int64_t>(sizeof(A));  // a logsumexp per row
    const context_traffic traffic = context_attention<T>::traffic(s.form, local, s.cp);
    core.context_forward_bytes = double(traffic.forward);
    core.context_backward_bytes = double(traffic.backward);
    core.output_bytes = rows * (c.channels / t) * static_cast<std::int64_t>(sizeof(T));
    core.activation_bytes = core.core_bytes + core.output_bytes;
    const layer_cost qkv = linear<P>::cost(qkv_config(c), s), proj = linear<P>::cost(proj_config(c), s);
    layer_cost r = qkv.then(core).then(proj);
    // Scratch: the per-head layout's copy while it is regrouped (forward), and in backward the
    // heads' output gradient and qkv's gradient (and its per-head copy) while the QKV
    // projection's backward runs; selective recomputation rebuilds the logsumexps beside them.
    const std::int64_t bytes = static_cast<std::int64_t>(sizeof(T)), qkv_bytes = rows * local.row_width() * bytes;
    const std::int64_t regroup = c.fused_qkv == qkv_layout::per_head ? qkv_bytes : 0;
    const std::int64_t dheads = rows * local.q_width() * bytes;
    const std::int64_t relse = s.recompute == recompute_mode::selective && s.cp == 1 ? core.core_bytes : 0;
    // Memory-bound work (the time model's): the rotary embedding reads and writes the turned part
    // of q and k, forward and on their gradients; the per-head layout is copied aside and
    // regrouped (qkv read and written twice), forward and back.
    const double rope =
        c.rope_theta > 0 ? 2.0 * double(rows * (local.heads + local.kv_heads) * c.rotary_dims() * bytes) : 0.0;
    const double moves = rope + 4.0 * double(regroup);
    r.memory_forward_bytes += moves;
    r.memory_backward_bytes += moves;
    const std::int64_t gathered = s.cp > 1 && s.form == context_form::all_to_all ? qkv_bytes : 0;
    r.forward_peak_bytes =
        layer_cost::max_of(r.forward_peak_bytes, qkv.activation_bytes + layer_cost::max_of(regroup, gathered));
    r.backward_peak_bytes = layer_cost::max_of(
        proj.backward_peak_bytes, dheads + qkv_bytes + layer_cost::max_of(relse, regroup + qkv.backward_peak_bytes));
    return r;
  }

  attention(module_scope<P> scope, const config& c)
      : scope_(scope),
        cfg_(validated(scope, c)),
        qkv_(scope / "qkv", qkv_config(c)),
        proj_(scope / "proj", proj_config(c)) {}

  // Selective recomputation: keep no logsumexps between forward and backward.
  void recompute_core(bool on) { recompute_core_ = on; }

  // x: [B, T, C], or [B, T/t, C] under sequence parallelism (the output likewise).
  tensor_view<const T> forward(tensor_view<const T> x) {
    STRATA_CHECK(x.shape.rank == 3 && x.shape[2] == cfg_.channels, scope_.qualify("forward"),
                 ": expected input [B, T, ", cfg_.channels, "], got ", x.shape.str());
    auto qkv = qkv_.forward(x);  // [B, T, (H + 2·KV)·d / t]: every token, this rank's heads
    const kernels::attention_shape shape = local_shape(qkv.shape[0], qkv.shape[1]);
    // The projection's output is this layer's to change: nothing else reads it.
    qkv_out_ = qkv_.output_data();
    if (cfg_.fused_qkv == qkv_layout::per_head) regroup(qkv_out_, shape);
    {
      STRATA_PROFILE("attention.forward");
      if (cfg_.rope_theta > 0) turn_by_positions(qkv_out_, shape, false);
      core_forward(shape);
    }
    tensor_view<const T> heads{heads_out_.data(), {shape.batch, shape.seq, shape.q_width()}};
    auto y = proj_.forward(heads);
    if (recompute_core_) {
      release_core();
    } else if (context_ && !context_->reads_local_qkv()) {
      // All-to-all: the core keeps its heads' gathered qkv, which backward reads in its place.
      qkv_.release_activations();
      qkv_out_ = nullptr;
    }
    return y;
  }

  buffer<T> backward(const buffer<T>& dout) {
    buffer<T> dheads = proj_.backward(dout);
    auto& ledger = scope_.ledger();
    // The same kernel on the same qkv: the logsumexps come back bit for bit (and the output, which
    // the projection still reads, is rewritten with the values it holds).
    const auto elements = static_cast<std::size_t>(shape_.batch * shape_.seq * shape_.row_width());
    buffer<T> dqkv(ledger, memory_category::activations, elements, uninitialized);  // attention_backward writes it all
    {
      STRATA_PROFILE("attention.backward");
      if (recompute_core_) core_forward(shape_);
      if (context_) context_->backward(dqkv.data(), dheads.data(), qkv_out_, heads_out_.data(), shape_);
      else
        kernels::attention_backward(device{}, dqkv.data(), dheads.data(), qkv_out_, lse_.data(), heads_out_.data(),
                                    shape_);
      if (recompute_core_) release_core();
      // q and k were turned by their positions: their gradients turn back.
      if (cfg_.rope_theta > 0) turn_by_positions(dqkv.data(), shape_, true);
    }
    if (cfg_.fused_qkv == qkv_layout::per_head) {
      buffer<T> per_head(ledger, memory_category::activations, elements, uninitialized);
      kernels::qkv_to_per_head(device{}, per_head.data(), dqkv.data(), shape_.batch * shape_.seq, shape_.heads,
                               shape_.head_dim);
      return qkv_.backward(per_head);
    }
    return qkv_.backward(dqkv);
  }

  // x: [B, n, C], the tokens at positions step.pos .. step.pos + n - 1 (never split by sequence:
  // the model pauses the split). The step at position 0 (the prompt) starts the cache afresh.
  tensor_view<const T> forward_cached(tensor_view<const T> x, const decode_step& step) {
    STRATA_CHECK(x.shape.rank == 3 && x.shape[2] == cfg_.channels, scope_.qualify("forward_cached"),
                 ": expected input [B, n, ", cfg_.channels, "], got ", x.shape.str());
    STRATA_CHECK(!scope_.tensor().sequence_parallel(), scope_.qualify("forward_cached"),
                 ": runs with the sequence split paused (tensor_parallel::pause_sequence_split)");
    auto qkv = qkv_.forward(x);
    const kernels::attention_shape shape = local_shape(qkv.shape[0], qkv.shape[1]);
    auto& ledger = scope_.ledger();
    if (step.pos == 0) {
      STRATA_CHECK(step.capacity >= shape.seq, scope_.qualify("forward_cached"), ": a cache of ", step.capacity,
                   " positions cannot hold the ", shape.seq, " given");
      ensure_size(k_cache_, ledger, memory_category::activations, shape.batch * step.capacity * shape.kv_width());
      ensure_size(v_cache_, ledger, memory_category::activations, shape.batch * step.capacity * shape.kv_width());
      cache_batch_ = shape.batch;
      cache_capacity_ = step.capacity;
    } else {
      STRATA_CHECK(step.pos == cached_ && shape.batch == cache_batch_ && step.pos + shape.seq <= cache_capacity_,
                   scope_.qualify("forward_cached"), ": the cache holds positions 0 .. ", cached_ - 1, " of ",
                   cache_batch_, " sequences (room for ", cache_capacity_, "); got ", shape.seq, " tokens at position ",
                   step.pos, " of ", shape.batch);
    }
    T* qkv_out = qkv_.output_data();
    if (cfg_.fused_qkv == qkv_layout::per_head) regroup(qkv_out, shape);
    if (cfg_.rope_theta > 0)
      kernels::rope_forward(device{}, qkv_out, shape, cfg_.rope_theta, step.pos, cfg_.rotary_dims());
    ensure_size(heads_out_, ledger, memory_category::activations, shape.batch * shape.seq * shape.q_width());
    kernels::cached_attention_forward(device{}, heads_out_.data(), k_cache_.data(), v_cache_.data(), qkv_out, shape,
                                      step.pos, cache_capacity_);
    cached_ = step.pos + shape.seq;
    return proj_.forward(tensor_view<const T>{heads_out_.data(), {shape.batch, shape.seq, shape.q_width()}});
  }
  void release_cache() {
    k_cache_ = buffer<T>();
    v_cache_ = buffer<T>();
    cached_ = cache_batch_ = cache_capacity_ = 0;
  }

  void release_activations() {
    qkv_.release_activations();
    proj_.release_activations();
    release_core();
    heads_out_ = buffer<T>();
  }

  template <class F>
  void visit_parameters(F&& f) const {
    qkv_.visit_parameters(f);
    proj_.visit_parameters(f);
  }
  const config& cfg() const { return cfg_; }

 private:
  using device = typename P::device;
  static const config& validated(const module_scope<P>& scope, const config& c) {
    STRATA_CHECK(c.heads > 0 && c.channels % c.heads == 0, scope.qualify_layer(), ": heads = ", c.heads,
                 " does not divide d_model = ", c.channels);
    STRATA_CHECK(c.kv_heads >= 0 && c.heads % c.kv() == 0, scope.qualify_layer(), ": kv_heads = ", c.kv_heads,
                 " does not divide heads = ", c.heads);
    STRATA_CHECK(c.rope_theta >= 0 && (c.rope_theta == 0 || c.head_dim() % 2 == 0), scope.qualify_layer(),
                 ": the rotary embedding needs an even head size and theta > 0, got head size ", c.head_dim(),
                 " and theta ", c.rope_theta);
    STRATA_CHECK(c.rotary_fraction > 0 && c.rotary_fraction <= 1 &&
                     (c.rope_theta == 0 || (c.rotary_dims() >= 2 && c.rotary_dims() % 2 == 0)),
                 scope.qualify_layer(), ": rotary_fraction = ", c.rotary_fraction, " of head size ", c.head_dim(),
                 " turns ", c.rotary_dims(), " elements; it must be in (0, 1] and turn an even number, at least 2");
    STRATA_CHECK(c.fused_qkv == qkv_layout::grouped || c.kv() == c.heads, scope.qualify_layer(),
                 ": the per-head fused QKV layout needs as many key/value heads as query heads, got kv_heads = ",
                 c.kv(), " and heads = ", c.heads);
    scope.check_tensor_extents(tensor_extents(c));
    auto& cp = scope.cp();
    if (cp.degree() > 1 && cp.form() == context_form::all_to_all) {
      const kernels::attention_shape local = shape_of(c, scope.tensor().degree(), 1, 1);
      STRATA_CHECK(context_attention<T>::heads_divide(local, cp.degree()), scope.qualify_layer(),
                   ": all-to-all context parallelism over cp=", cp.degree(), " needs this rank's ", local.heads,
                   " query heads and ", local.kv_heads, " key/value heads (of ", c.heads, " and ", c.kv(),
                   " over tp=", scope.tensor().degree(),
                   ") divisible by it; use the ring form (strata::ring, --cp-form ring)");
    }
    return c;
  }
  // A rank's heads under tp = t: H/t query heads and their key/value heads (one, when fewer than ranks).
  static constexpr kernels::attention_shape shape_of(const config& c, std::int64_t t, std::int64_t batch,
                                                     std::int64_t seq) {
    const std::int64_t kv = c.kv() >= t ? c.kv() / t : 1;
    return {batch, seq, c.heads / t, kv, c.head_dim(), c.scale};
  }
  kernels::attention_shape local_shape(std::int64_t batch, std::int64_t seq) const {
    return shape_of(cfg_, degree_, batch, seq);
  }
  void core_forward(const kernels::attention_shape& shape) {
    shape_ = shape;
    auto& ledger = scope_.ledger();
    ensure_size(heads_out_, ledger, memory_category::activations, shape.batch * shape.seq * shape.q_width());
    auto& cp = scope_.cp();
    if (cp.degree() > 1) {
      // The core over the context group: built for this sequence length, kept while it holds.
      if (!context_ || context_->split().local_seq() != shape.seq)
        context_.emplace(cp.group(), cp.split_local(shape.seq), cp.form(), ledger);
      context_->forward(heads_out_.data(), qkv_out_, shape);
      return;
    }
    ensure_size(lse_, ledger, memory_category::activations, shape.batch * shape.heads * shape.seq);
    kernels::attention_forward(device{}, heads_out_.data(), lse_.data(), qkv_out_, shape);
  }
  // qkv rows from the per-head layout into the grouped one the kernels read, in place (by way of a
  // copy that lives for this call only).
  void regroup(T* qkv, const kernels::attention_shape& shape) {
    const std::int64_t rows = shape.batch * shape.seq, n = rows * shape.row_width();
    buffer<T> per_head(scope_.ledger(), memory_category::activations, static_cast<std::size_t>(n), uninitialized);
    per_head.copy_within(qkv, static_cast<std::size_t>(n));
    kernels::qkv_from_per_head(device{}, qkv, per_head.data(), rows, shape.heads, shape.head_dim);
  }
  void release_core() {
    lse_ = buffer<A>();
    if (context_) context_->release();
  }
  // The rotary embedding (or its transpose) of qkv rows [B, T, W]: by position t at cp = 1, else
  // each chunk of this rank's rows from its first absolute position.
  void turn_by_positions(T* rows, const kernels::attention_shape& shape, bool backward) {
    const auto turn = [&](T* at, const kernels::attention_shape& s, std::int64_t pos0) {
      if (backward) kernels::rope_backward(device{}, at, s, cfg_.rope_theta, pos0, cfg_.rotary_dims());
      else kernels::rope_forward(device{}, at, s, cfg_.rope_theta, pos0, cfg_.rotary_dims());
    };
    auto& cp = scope_.cp();
    if (cp.degree() == 1) return turn(rows, shape, 0);
    cp.for_each_run(shape.seq, 0, shape.batch * shape.seq, [&](std::int64_t at, std::int64_t n, std::int64_t pos) {
      kernels::attention_shape run = shape;
      run.batch = 1;
      run.seq = n;
      turn(rows + at * shape.row_width(), run, pos);
    });
  }

  module_scope<P> scope_;
  config cfg_;
  std::int64_t degree_ = scope_.tensor().degree();
  linear<P> qkv_, proj_;
  kernels::attention_shape shape_;
  T* qkv_out_ = nullptr;
  bool recompute_core_ = false;
  buffer<A> lse_;
  std::optional<context_attention<T, device>> context_;  // the core under context parallelism (cp > 1)
  buffer<T> heads_out_;
  buffer<T> k_cache_, v_cache_;  // generation: [B, capacity, KV/t·d] by position
  std::int64_t cached_ = 0, cache_batch_ = 0, cache_capacity_ = 0;
};

}  // namespace strata
