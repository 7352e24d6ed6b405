// strata/layers/lm_head.hpp - the language-model head with its loss.
//
// x [B, T, C] -> logits = x·Wᵀ [B, T, V] -> mean cross-entropy against targets [B, T].
// The softmax and the loss are fused: the logits buffer is overwritten with dloss/dlogits in
// the same pass, so no probability buffer ever exists. W is either the head's own [V, C]
// matrix or, with tied_to, the token embedding's table (GPT-2 ties them).
#pragma once
#include <cstdint>

#include "strata/core/tensor.hpp"
#include "strata/kernels/host/cross_entropy.hpp"
#include "strata/kernels/host/linear.hpp"
#include "strata/layers/module.hpp"

namespace strata {

// Names an existing [V, C] parameter for the head to share.
struct tied_to {
  param_handle table;
};

template <class P>
class lm_head {
 public:
  using policy = P;
  using T = typename P::storage;
  using A = typename P::accumulate;

  struct config {
    std::int64_t vocab = 0, channels = 0;
    double init_std = 0.02;  // only when the head owns its matrix
  };

  // A tied head adds no parameters of its own.
  static constexpr std::int64_t param_count(const config& c, bool tied) { return tied ? 0 : c.vocab * c.channels; }
  static constexpr std::int64_t forward_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return 2 * batch * seq * c.channels * c.vocab + 5 * batch * seq * c.vocab;  // GEMM + softmax/loss
  }
  static constexpr std::int64_t backward_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return 4 * batch * seq * c.channels * c.vocab;
  }
  static constexpr std::int64_t activation_bytes(const config& c, std::int64_t batch, std::int64_t seq) {
    const std::int64_t rows = batch * seq;
    return rows * c.vocab * static_cast<std::int64_t>(sizeof(T)) +  // logits, then their gradient
           rows * static_cast<std::int64_t>(sizeof(A)) + rows * 4;  // per-position losses, targets
  }

  lm_head(module_scope<P> scope, config c) : scope_(scope), cfg_(c) {
    check_config();
    weight_ = scope_.add_parameter("weight", {c.vocab, c.channels}, init_rule::normal_with_std(c.init_std), true);
  }
  lm_head(module_scope<P> scope, config c, tied_to tie) : scope_(scope), cfg_(c), weight_(tie.table), tied_(true) {
    check_config();
    scope_.params().add_writer(weight_);  // its gradient is final only after both backwards
    const auto& shared = scope_.params().info(weight_);
    const strata::shape expected{c.vocab, c.channels};
    STRATA_CHECK(shared.shape == expected, scope_.qualify("lm_head"), ": tied table '",
                 shared.name, "' has shape ", shared.shape.str(), ", expected [", c.vocab, ", ", c.channels, "]");
  }

  // Mean loss over all positions; also leaves d(loss·loss_scale)/dlogits for backward.
  // `loss_scale` multiplies the gradient only (micro-batch averaging, fp16 loss scaling).
  double forward(tensor_view<const T> x, tensor_view<const std::int32_t> targets, double loss_scale = 1.0) {
    compute_logits(x);
    const strata::shape expected{batch_, seq_};
    STRATA_CHECK(targets.shape == expected, scope_.qualify("forward"), ": expected targets ", expected.str(), ", got ",
                 targets.shape.str());
    const std::int64_t rows = batch_ * seq_;
    auto& ledger = scope_.ledger();
    ensure_size(losses_, ledger, memory_category::activations, rows);
    ensure_size(targets_, ledger, memory_category::activations, rows);
    for (std::int64_t i = 0; i < rows; ++i) targets_[static_cast<std::size_t>(i)] = targets.data[i];
    kernels::cross_entropy_forward_backward(device{}, losses_.data(), logits_.data(), targets_.data(), rows,
                                            cfg_.vocab, cfg_.vocab, static_cast<A>(loss_scale / double(rows)));
    return mean_loss(rows);
  }

  // Mean loss without keeping gradients (evaluation).
  double evaluate(tensor_view<const T> x, tensor_view<const std::int32_t> targets) {
    compute_logits(x);
    const std::int64_t rows = batch_ * seq_;
    STRATA_CHECK(targets.numel() == rows, scope_.qualify("evaluate"), ": expected ", rows, " targets, got ",
                 targets.numel());
    ensure_size(losses_, scope_.ledger(), memory_category::activations, rows);
    kernels::cross_entropy_forward(device{}, losses_.data(), logits_.data(), targets.data, rows, cfg_.vocab,
                                   cfg_.vocab);
    return mean_loss(rows);
  }

  // Logits [B, T, V] for sampling; valid until the next call.
  tensor_view<const T> logits(tensor_view<const T> x) {
    compute_logits(x);
    return {logits_.data(), {batch_, seq_, cfg_.vocab}};
  }

  // dx [B, T, C] from the gradient forward() left; accumulates into W's gradient.
  buffer<T> backward() {
    const std::int64_t rows = batch_ * seq_;
    buffer<T> dx(scope_.ledger(), memory_category::activations, static_cast<std::size_t>(rows * cfg_.channels));
    auto& p = scope_.params();
    kernels::linear_backward(device{}, scope_.workspace(), dx.data(), p.grads(weight_), static_cast<T*>(nullptr),
                             logits_.data(), input_.data, p.weights(weight_), rows, cfg_.channels, cfg_.vocab);
    p.grad_written(weight_);
    return dx;
  }

  template <class F>
  void visit_parameters(F&& f) const {
    if (!tied_) f(weight_);
  }
  bool tied() const { return tied_; }
  const config& cfg() const { return cfg_; }

 private:
  using device = typename P::device;

  void check_config() const {
    STRATA_CHECK(cfg_.vocab > 0 && cfg_.channels > 0, scope_.qualify("lm_head"), ": vocab (", cfg_.vocab,
                 ") and channels (", cfg_.channels, ") must be positive");
  }
  void compute_logits(tensor_view<const T> x) {
    STRATA_CHECK(x.shape.rank == 3 && x.shape[2] == cfg_.channels, scope_.qualify("forward"),
                 ": expected input [B, T, ", cfg_.channels, "], got ", x.shape.str());
    input_ = x;
    batch_ = x.shape[0];
    seq_ = x.shape[1];
    ensure_size(logits_, scope_.ledger(), memory_category::activations, batch_ * seq_ * cfg_.vocab);
    auto& p = scope_.params();
    kernels::linear_forward(device{}, scope_.workspace(), logits_.data(), x.data, p.weights(weight_),
                            static_cast<const T*>(nullptr), batch_ * seq_, cfg_.channels, cfg_.vocab);
  }
  double mean_loss(std::int64_t rows) const {
    double sum = 0;  // sequential: the same loss bit for bit on every run
    for (std::int64_t i = 0; i < rows; ++i) sum += static_cast<double>(losses_[static_cast<std::size_t>(i)]);
    return sum / static_cast<double>(rows);
  }

  module_scope<P> scope_;
  config cfg_;
  param_handle weight_;
  bool tied_ = false;
  tensor_view<const T> input_;
  std::int64_t batch_ = 0, seq_ = 0;
  buffer<T> logits_;
  buffer<A> losses_;
  buffer<std::int32_t> targets_;
};

}  // namespace strata
