// strata/layers/attention.hpp - causal multi-head self-attention.
//
// x [B, T, C] -> qkv = x·Wqkvᵀ + b [B, T, 3C] -> per head softmax(q·kᵀ/sqrt(C/H), causal)·v
// [B, T, C] -> y = ·Wprojᵀ + b [B, T, C]. Keeps what the device's attention kernel saves for
// backward: the probabilities [B, H, T, T] on the host (the term that grows with T²), one
// logsumexp per row on the GPU. With recompute_core(true) (selective recomputation) it drops
// them after forward and recomputes them from the kept qkv in backward.
//
// Tensor parallel over t ranks: sharded by heads. QKV is column-parallel (each rank gets its H/t
// heads' q, k and v), the core runs on those heads alone, the projection is row-parallel.
#pragma once
#include <cstdint>

#include "strata/core/tensor.hpp"
#include "strata/kernels/attention.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/linear.hpp"

namespace strata {

template <class P>
class attention {
 public:
  using policy = P;
  using T = typename P::storage;
  using A = typename P::accumulate;

  struct config {
    std::int64_t channels = 0, heads = 0;
    double init_std = 0.02;
    double proj_init_std = 0.02;  // GPT-2 scales the residual projection by 1/sqrt(2·layers)
  };

  static constexpr typename linear<P>::config qkv_config(const config& c) {
    return {.in = c.channels, .out = 3 * c.channels, .init_std = c.init_std, .split = tensor_split_kind::column, .blocks = 3};
  }
  static constexpr typename linear<P>::config proj_config(const config& c) {
    return {.in = c.channels, .out = c.channels, .init_std = c.proj_init_std, .split = tensor_split_kind::row};
  }

  static constexpr tensor_extent_list tensor_extents(const config& c) { return {{"heads", c.heads}}; }
  // What the attention kernel keeps per query row for backward, on this device: the
  // probabilities, or one logsumexp (kernels/attention.hpp).
  static constexpr std::int64_t saved_per_row(std::int64_t seq) { return kernels::attention_saved_per_row(device{}, seq); }
  // q·kᵀ and probs·v: 2 x 2·T·T·C per sequence (the causal half is not subtracted, as in the usual
  // 6ND accounting). Keeps qkv, the probabilities (the core), the heads' output and the
  // projection's output.
  static constexpr layer_cost cost(const config& c, const cost_scope& s) {
    const std::int64_t t = s.tp.degree, rows = s.rows();
    layer_cost core;
    core.core_flops = core.forward_flops = 4 * s.batch * s.seq * s.seq * c.channels / t;
    core.backward_flops = 2 * core.forward_flops;
    core.core_bytes = s.batch * (c.heads / t) * s.seq * saved_per_row(s.seq) * static_cast<std::int64_t>(sizeof(A));
    core.output_bytes = rows * (c.channels / t) * static_cast<std::int64_t>(sizeof(T));
    core.activation_bytes = core.core_bytes + core.output_bytes;
    return linear<P>::cost(qkv_config(c), s).then(core).then(linear<P>::cost(proj_config(c), s));
  }

  attention(module_scope<P> scope, const config& c)
      : scope_(scope), cfg_(validated(scope, c)), qkv_(scope / "qkv", qkv_config(c)), proj_(scope / "proj", proj_config(c)) {}

  // Selective recomputation: keep no probabilities between forward and backward.
  void recompute_core(bool on) { recompute_core_ = on; }

  // x: [B, T, C], or [B, T/t, C] under sequence parallelism (the output likewise).
  tensor_view<const T> forward(tensor_view<const T> x) {
    STRATA_CHECK(x.shape.rank == 3 && x.shape[2] == cfg_.channels, scope_.qualify("forward"),
                 ": expected input [B, T, ", cfg_.channels, "], got ", x.shape.str());
    auto qkv = qkv_.forward(x);  // [B, T, 3C/t]: every token, this rank's heads
    batch_ = qkv.shape[0];
    seq_ = qkv.shape[1];
    auto& ledger = scope_.ledger();
    const std::int64_t channels = cfg_.channels / degree_, heads = cfg_.heads / degree_;
    ensure_size(probs_, ledger, memory_category::activations, batch_ * heads * seq_ * saved_per_row(seq_));
    ensure_size(heads_out_, ledger, memory_category::activations, batch_ * seq_ * channels);
    kernels::attention_forward(device{}, heads_out_.data(), probs_.data(), qkv.data, batch_, seq_, channels, heads);
    if (recompute_core_) probs_ = buffer<A>();
    qkv_out_ = qkv.data;
    return proj_.forward(tensor_view<const T>{heads_out_.data(), {batch_, seq_, channels}});
  }

  buffer<T> backward(const buffer<T>& dout) {
    const std::int64_t channels = cfg_.channels / degree_, heads = cfg_.heads / degree_;
    buffer<T> dheads = proj_.backward(dout);
    auto& ledger = scope_.ledger();
    buffer<T> scratch;
    if (recompute_core_) {
      // The same kernel on the same qkv: the probabilities come back bit for bit.
      scratch = buffer<T>(ledger, memory_category::activations, static_cast<std::size_t>(batch_ * seq_ * channels));
      probs_ = buffer<A>(ledger, memory_category::activations,
                         static_cast<std::size_t>(batch_ * heads * seq_ * saved_per_row(seq_)));
      kernels::attention_forward(device{}, scratch.data(), probs_.data(), qkv_out_, batch_, seq_, channels, heads);
    }
    buffer<T> dqkv(ledger, memory_category::activations, static_cast<std::size_t>(batch_ * seq_ * 3 * channels));
    // The forward's output too: a kernel that keeps statistics rather than probabilities reads
    // rowsum(dO * O) from it instead of redoing the forward.
    const T* out = recompute_core_ ? scratch.data() : heads_out_.data();
    kernels::attention_backward(device{}, dqkv.data(), dheads.data(), qkv_out_, probs_.data(), batch_, seq_, channels,
                                heads, out);
    if (recompute_core_) probs_ = buffer<A>();
    return qkv_.backward(dqkv);
  }

  void release_activations() {
    qkv_.release_activations();
    proj_.release_activations();
    probs_ = buffer<A>();
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
    scope.check_tensor_extents(tensor_extents(c));
    return c;
  }
  module_scope<P> scope_;
  config cfg_;
  std::int64_t degree_ = scope_.tensor().degree();
  linear<P> qkv_, proj_;
  std::int64_t batch_ = 0, seq_ = 0;
  const T* qkv_out_ = nullptr;
  bool recompute_core_ = false;
  buffer<A> probs_;
  buffer<T> heads_out_;
};

}  // namespace strata
