// strata/layers/embedding.hpp - token plus learned position embedding.
//
// Shapes: tokens [B, T] (int32) -> x [B, T, C] = wte[token] + wpe[position]. wte is [V, C]
// and may be shared with the LM head (tied weights): its handle is token_table().
#pragma once
#include <cstdint>

#include "strata/core/tensor.hpp"
#include "strata/kernels/host/embedding.hpp"
#include "strata/layers/module.hpp"

namespace strata {

template <class P>
class embedding {
 public:
  using policy = P;
  using T = typename P::storage;

  struct config {
    std::int64_t vocab = 0, max_seq = 0, channels = 0;
    double init_std = 0.02;
  };

  static constexpr std::int64_t param_count(const config& c) { return (c.vocab + c.max_seq) * c.channels; }
  static constexpr std::int64_t forward_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return batch * seq * c.channels;
  }
  static constexpr std::int64_t backward_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return 2 * batch * seq * c.channels;
  }
  static constexpr std::int64_t activation_bytes(const config& c, std::int64_t batch, std::int64_t seq) {
    const std::int64_t rows = batch * seq;
    return rows * c.channels * static_cast<std::int64_t>(sizeof(T)) + rows * 4;  // output + token ids
  }

  embedding(module_scope<P> scope, config c) : scope_(scope), cfg_(c) {
    STRATA_CHECK(c.vocab > 0 && c.max_seq > 0 && c.channels > 0, scope.qualify("embedding"), ": vocab (", c.vocab,
                 "), max_seq (", c.max_seq, ") and channels (", c.channels, ") must be positive");
    wte_ = scope_.add_parameter("wte", {c.vocab, c.channels}, init_rule::normal_with_std(c.init_std), true);
    wpe_ = scope_.add_parameter("wpe", {c.max_seq, c.channels}, init_rule::normal_with_std(c.init_std), true);
  }

  // tokens: [B, T] with T <= max_seq and every id < vocab (checked; the error names it).
  tensor_view<const T> forward(tensor_view<const std::int32_t> tokens) {
    STRATA_CHECK(tokens.shape.rank == 2, scope_.qualify("forward"), ": expected tokens [B, T], got ",
                 tokens.shape.str());
    STRATA_CHECK(tokens.shape[1] <= cfg_.max_seq, scope_.qualify("forward"), ": sequence length ", tokens.shape[1],
                 " exceeds the position table (max_seq = ", cfg_.max_seq, ")");
    batch_ = tokens.shape[0];
    seq_ = tokens.shape[1];
    auto& ledger = scope_.ledger();
    ensure_size(tokens_, ledger, memory_category::activations, batch_ * seq_);
    ensure_size(out_, ledger, memory_category::activations, batch_ * seq_ * cfg_.channels);
    for (std::int64_t i = 0; i < batch_ * seq_; ++i) tokens_[static_cast<std::size_t>(i)] = tokens.data[i];
    auto& p = scope_.params();
    kernels::embedding_forward(device{}, out_.data(), tokens_.data(), p.weights(wte_), p.weights(wpe_), batch_, seq_,
                               cfg_.channels, cfg_.vocab);
    return {out_.data(), {batch_, seq_, cfg_.channels}};
  }

  void backward(const buffer<T>& dout) {
    STRATA_CHECK(static_cast<std::int64_t>(dout.size()) == batch_ * seq_ * cfg_.channels, scope_.qualify("backward"),
                 ": expected ", batch_ * seq_ * cfg_.channels, " output gradients, got ", dout.size());
    auto& p = scope_.params();
    kernels::embedding_backward(device{}, p.grads(wte_), p.grads(wpe_), dout.data(), tokens_.data(), batch_, seq_,
                                cfg_.channels);
    p.grad_written(wte_);
    p.grad_written(wpe_);
  }

  template <class F>
  void visit_parameters(F&& f) const {
    f(wte_);
    f(wpe_);
  }
  param_handle token_table() const { return wte_; }
  const config& cfg() const { return cfg_; }

 private:
  using device = typename P::device;
  module_scope<P> scope_;
  config cfg_;
  param_handle wte_, wpe_;
  std::int64_t batch_ = 0, seq_ = 0;
  buffer<std::int32_t> tokens_;
  buffer<T> out_;
};

}  // namespace strata
