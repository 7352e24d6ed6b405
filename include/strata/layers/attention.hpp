// strata/layers/attention.hpp - causal multi-head self-attention.
//
// x [B, T, C] -> qkv = x·Wqkvᵀ + b [B, T, 3C] -> per head softmax(q·kᵀ/sqrt(C/H), causal)·v
// [B, T, C] -> y = ·Wprojᵀ + b [B, T, C]. Keeps the attention probabilities [B, H, T, T] for
// backward: the term that grows with T². With recompute_core(true) (selective recomputation)
// it drops them after forward and recomputes them from the kept qkv in backward.
//
// Tensor parallel over t ranks: sharded by heads. QKV is column-parallel (each rank gets its H/t
// heads' q, k and v), the core runs on those heads alone, the projection is row-parallel.
#pragma once
#include <cstdint>
#include <type_traits>

#include "strata/core/tensor.hpp"
#include "strata/kernels/host/attention.hpp"
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
    tensor_split tp{};
  };

  static constexpr typename linear<P>::config qkv_config(const config& c) {
    return {c.channels, 3 * c.channels, true, c.init_std, tensor_split_kind::column, c.tp, 3};
  }
  static constexpr typename linear<P>::config proj_config(const config& c) {
    return {c.channels, c.channels, true, c.proj_init_std, tensor_split_kind::row, c.tp, 1};
  }

  static constexpr std::int64_t param_count(const config& c) {
    return linear<P>::param_count(qkv_config(c)) + linear<P>::param_count(proj_config(c));
  }
  // q·kᵀ and probs·v: 2 x 2·T·T·C per sequence (the causal half is not subtracted, as in the
  // usual 6ND accounting).
  static constexpr std::int64_t core_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return 4 * batch * seq * seq * c.channels / c.tp.degree;
  }
  static constexpr std::int64_t forward_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return linear<P>::forward_flops(qkv_config(c), batch, seq) + core_flops(c, batch, seq) +
           linear<P>::forward_flops(proj_config(c), batch, seq);
  }
  static constexpr std::int64_t backward_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return 2 * forward_flops(c, batch, seq);
  }
  // What the attention kernel keeps per query row for backward: the probabilities (seq of them)
  // on the host; one logsumexp on the GPU, whose kernels never form the score matrix and
  // recompute it in backward (kernels/cuda/attention.cuh).
  static constexpr std::int64_t kept_per_row(std::int64_t seq) {
    return std::is_same_v<typename P::device, strata::cuda> ? 1 : seq;
  }
  // The attention probabilities (or statistics) of this rank's heads: what selective
  // recomputation drops.
  static constexpr std::int64_t core_activation_bytes(const config& c, std::int64_t batch, std::int64_t seq) {
    return batch * (c.heads / c.tp.degree) * seq * kept_per_row(seq) * static_cast<std::int64_t>(sizeof(A));
  }
  static constexpr std::int64_t activation_bytes(const config& c, std::int64_t batch, std::int64_t seq) {
    const std::int64_t rows = batch * seq;
    return linear<P>::activation_bytes(qkv_config(c), batch, seq) +                        // qkv
           core_activation_bytes(c, batch, seq) +                                          // probabilities
           rows * (c.channels / c.tp.degree) * static_cast<std::int64_t>(sizeof(T)) +     // heads' output
           linear<P>::activation_bytes(proj_config(c), batch, seq);                       // projection
  }

  attention(module_scope<P> scope, config c)
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
    const std::int64_t channels = cfg_.channels / cfg_.tp.degree, heads = cfg_.heads / cfg_.tp.degree;
    ensure_size(probs_, ledger, memory_category::activations, batch_ * heads * seq_ * kept_per_row(seq_));
    ensure_size(heads_out_, ledger, memory_category::activations, batch_ * seq_ * channels);
    kernels::attention_forward(device{}, heads_out_.data(), probs_.data(), qkv.data, batch_, seq_, channels, heads);
    if (recompute_core_) probs_ = buffer<A>();
    qkv_out_ = qkv.data;
    return proj_.forward(tensor_view<const T>{heads_out_.data(), {batch_, seq_, channels}});
  }

  buffer<T> backward(const buffer<T>& dout) {
    const std::int64_t channels = cfg_.channels / cfg_.tp.degree, heads = cfg_.heads / cfg_.tp.degree;
    buffer<T> dheads = proj_.backward(dout);
    auto& ledger = scope_.ledger();
    buffer<T> scratch;
    if (recompute_core_) {
      // The same kernel on the same qkv: the probabilities come back bit for bit.
      scratch = buffer<T>(ledger, memory_category::activations, static_cast<std::size_t>(batch_ * seq_ * channels));
      probs_ = buffer<A>(ledger, memory_category::activations,
                         static_cast<std::size_t>(batch_ * heads * seq_ * kept_per_row(seq_)));
      kernels::attention_forward(device{}, scratch.data(), probs_.data(), qkv_out_, batch_, seq_, channels, heads);
    }
    buffer<T> dqkv(ledger, memory_category::activations, static_cast<std::size_t>(batch_ * seq_ * 3 * channels));
    if constexpr (std::is_same_v<device, strata::cuda>) {
      // The GPU backward reads the forward's output too (rowsum(dO * O)) instead of redoing it.
      const T* out = recompute_core_ ? scratch.data() : heads_out_.data();
      kernels::attention_backward(device{}, dqkv.data(), dheads.data(), qkv_out_, probs_.data(), batch_, seq_,
                                  channels, heads, out);
    } else {
      kernels::attention_backward(device{}, dqkv.data(), dheads.data(), qkv_out_, probs_.data(), batch_, seq_,
                                  channels, heads);
    }
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
    STRATA_CHECK(c.heads > 0 && c.channels % c.heads == 0, scope.qualify("attention"), ": heads = ", c.heads,
                 " does not divide d_model = ", c.channels);
    STRATA_CHECK(c.tp.degree >= 1 && c.heads % c.tp.degree == 0, scope.qualify("attention"),
                 ": tensor parallelism tp=", c.tp.degree, " does not divide heads = ", c.heads);
    return c;
  }
  module_scope<P> scope_;
  config cfg_;
  linear<P> qkv_, proj_;
  std::int64_t batch_ = 0, seq_ = 0;
  const T* qkv_out_ = nullptr;
  bool recompute_core_ = false;
  buffer<A> probs_;
  buffer<T> heads_out_;
};

}  // namespace strata
