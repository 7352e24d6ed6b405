// strata/layers/attention.hpp - causal multi-head self-attention.
//
// x [B, T, C] -> qkv = x·Wqkvᵀ + b [B, T, 3C] -> per head softmax(q·kᵀ/sqrt(C/H), causal)·v
// [B, T, C] -> y = ·Wprojᵀ + b [B, T, C]. Keeps the attention probabilities [B, H, T, T] for
// backward: the term that grows with T² (selective recomputation will drop it).
#pragma once
#include <cstdint>

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
  };

  static constexpr typename linear<P>::config qkv_config(const config& c) {
    return {c.channels, 3 * c.channels, true, c.init_std};
  }
  static constexpr typename linear<P>::config proj_config(const config& c) {
    return {c.channels, c.channels, true, c.proj_init_std};
  }

  static constexpr std::int64_t param_count(const config& c) {
    return linear<P>::param_count(qkv_config(c)) + linear<P>::param_count(proj_config(c));
  }
  // q·kᵀ and probs·v: 2 x 2·T·T·C per sequence (the causal half is not subtracted, as in the
  // usual 6ND accounting).
  static constexpr std::int64_t core_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return 4 * batch * seq * seq * c.channels;
  }
  static constexpr std::int64_t forward_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return linear<P>::forward_flops(qkv_config(c), batch, seq) + core_flops(c, batch, seq) +
           linear<P>::forward_flops(proj_config(c), batch, seq);
  }
  static constexpr std::int64_t backward_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return 2 * forward_flops(c, batch, seq);
  }
  static constexpr std::int64_t activation_bytes(const config& c, std::int64_t batch, std::int64_t seq) {
    const std::int64_t rows = batch * seq;
    return linear<P>::activation_bytes(qkv_config(c), batch, seq) +                       // qkv
           batch * c.heads * seq * seq * static_cast<std::int64_t>(sizeof(A)) +     // probabilities
           rows * c.channels * static_cast<std::int64_t>(sizeof(T)) +              // heads' output
           linear<P>::activation_bytes(proj_config(c), batch, seq);                      // projection
  }

  attention(module_scope<P> scope, config c)
      : scope_(scope), cfg_(c), qkv_(scope / "qkv", qkv_config(c)), proj_(scope / "proj", proj_config(c)) {
    STRATA_CHECK(c.heads > 0 && c.channels % c.heads == 0, scope.qualify("attention"), ": heads = ", c.heads,
                 " does not divide d_model = ", c.channels);
  }

  tensor_view<const T> forward(tensor_view<const T> x) {
    STRATA_CHECK(x.shape.rank == 3 && x.shape[2] == cfg_.channels, scope_.qualify("forward"),
                 ": expected input [B, T, ", cfg_.channels, "], got ", x.shape.str());
    batch_ = x.shape[0];
    seq_ = x.shape[1];
    auto qkv = qkv_.forward(x);
    auto& ledger = scope_.ledger();
    ensure_size(probs_, ledger, memory_category::activations, batch_ * cfg_.heads * seq_ * seq_);
    ensure_size(heads_out_, ledger, memory_category::activations, batch_ * seq_ * cfg_.channels);
    kernels::attention_forward(device{}, heads_out_.data(), probs_.data(), qkv.data, batch_, seq_, cfg_.channels,
                               cfg_.heads);
    qkv_out_ = qkv.data;
    return proj_.forward(tensor_view<const T>{heads_out_.data(), x.shape});
  }

  buffer<T> backward(const buffer<T>& dout) {
    buffer<T> dheads = proj_.backward(dout);
    buffer<T> dqkv(scope_.ledger(), memory_category::activations,
                   static_cast<std::size_t>(batch_ * seq_ * 3 * cfg_.channels));
    kernels::attention_backward(device{}, dqkv.data(), dheads.data(), qkv_out_, probs_.data(), batch_, seq_,
                                cfg_.channels, cfg_.heads);
    return qkv_.backward(dqkv);
  }

  template <class F>
  void visit_parameters(F&& f) const {
    qkv_.visit_parameters(f);
    proj_.visit_parameters(f);
  }
  const config& cfg() const { return cfg_; }

 private:
  using device = typename P::device;
  module_scope<P> scope_;
  config cfg_;
  linear<P> qkv_, proj_;
  std::int64_t batch_ = 0, seq_ = 0;
  const T* qkv_out_ = nullptr;
  buffer<A> probs_;
  buffer<T> heads_out_;
};

}  // namespace strata
