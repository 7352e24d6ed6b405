// strata/layers/layernorm.hpp - LayerNorm over the last dimension, with gain and bias.
//
// Shapes: x [rows, C] -> y [rows, C]; keeps y plus each row's mean and 1/std for backward.
// Under sequence parallelism the rows are this rank's tokens, so the gain and bias gradients
// are partial: they are summed over the tensor-parallel group before they are added.
#pragma once
#include <cstdint>
#include <span>

#include "strata/core/profile.hpp"
#include "strata/core/tensor.hpp"
#include "strata/kernels/layernorm.hpp"
#include "strata/kernels/residual.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/module.hpp"
#include "strata/layers/tensor_split.hpp"

namespace strata {

template <class P>
class layernorm {
 public:
  using policy = P;
  using T = typename P::storage;
  using A = typename P::accumulate;

  struct config {
    std::int64_t channels = 0;
    double eps = 1e-5;
  };

  // Each token alone: generation runs forward on the new tokens (layers/cached_forward.hpp).
  static constexpr bool position_wise = true;

  static constexpr tensor_extent_list tensor_extents(const config&) { return {}; }
  // ~8 flops per element forward (mean, variance, normalise, scale, shift), backward ~2x; keeps
  // its output and each row's mean and 1/std. Under sequence parallelism it sees rows/t tokens and
  // sums its partial gain and bias gradients over the group.
  static constexpr layer_cost cost(const config& c, const cost_scope& s) {
    const std::int64_t rows = s.local_rows();
    layer_cost r;
    r.params = 2 * c.channels;
    r.forward_flops = 8 * rows * c.channels;
    r.backward_flops = 2 * r.forward_flops;
    r.output_bytes = rows * c.channels * static_cast<std::int64_t>(sizeof(T));
    r.activation_bytes = r.output_bytes + 2 * rows * static_cast<std::int64_t>(sizeof(A));
    r.backward_peak_bytes = r.output_bytes;                // the input gradient
    r.memory_forward_bytes = double(2 * r.output_bytes);   // x in, y out
    r.memory_backward_bytes = double(3 * r.output_bytes);  // x and dy in, dx out
    if (s.tp.sequence_parallel)
      r.tensor_backward_bytes =
          ring_all_reduce_bytes(double(2 * c.channels * static_cast<std::int64_t>(sizeof(T))), s.tp.degree);
    return r;
  }

  layernorm(module_scope<P> scope, const config& c) : scope_(scope), cfg_(c) {
    STRATA_CHECK(c.channels > 0, scope.qualify_layer(), ": channels (", c.channels, ") must be positive");
    STRATA_CHECK(c.eps > 0, scope.qualify_layer(), ": eps (", c.eps, ") must be positive");
    weight_ = scope_.add_parameter("weight", {c.channels}, init_rule::ones(), false);
    bias_ = scope_.add_parameter("bias", {c.channels}, init_rule::zeros(), false);
  }

  tensor_view<const T> forward(tensor_view<const T> x) {
    STRATA_PROFILE("layernorm.forward");
    STRATA_CHECK(x.shape.rank >= 1 && x.shape[x.shape.rank - 1] == cfg_.channels, scope_.qualify("forward"),
                 ": expected input [..., ", cfg_.channels, "], got ", x.shape.str());
    input_ = x;
    rows_ = x.numel() / cfg_.channels;
    auto& ledger = scope_.ledger();
    ensure_size(out_, ledger, memory_category::activations, rows_ * cfg_.channels);
    ensure_size(mean_, ledger, memory_category::activations, rows_);
    ensure_size(rstd_, ledger, memory_category::activations, rows_);
    auto& p = scope_.params();
    kernels::layernorm_forward(device{}, out_.data(), mean_.data(), rstd_.data(), x.data, p.weights(weight_),
                               p.weights(bias_), rows_, cfg_.channels, static_cast<A>(cfg_.eps));
    return {out_.data(), x.shape};
  }

  buffer<T> backward(const buffer<T>& dout) {
    STRATA_PROFILE("layernorm.backward");
    STRATA_CHECK(static_cast<std::int64_t>(dout.size()) == rows_ * cfg_.channels, scope_.qualify("backward"),
                 ": expected ", rows_ * cfg_.channels, " output gradients, got ", dout.size());
    auto& ledger = scope_.ledger();
    buffer<T> dinp(ledger, memory_category::activations, dout.size(), uninitialized);  // the kernel writes it
    auto& p = scope_.params();
    auto& tp = scope_.tensor();
    if (tp.sequence_parallel()) {
      buffer<T> partial(ledger, memory_category::communication, static_cast<std::size_t>(2 * cfg_.channels));
      T* dweight = partial.data();
      T* dbias = dweight + cfg_.channels;
      kernels::layernorm_backward(device{}, dinp.data(), dweight, dbias, dout.data(), input_.data, p.weights(weight_),
                                  mean_.data(), rstd_.data(), rows_, cfg_.channels);
      tp.sum_partial_gradients(std::span<T>(partial.data(), partial.size()));
      kernels::residual_forward(device{}, p.grads(weight_), p.grads(weight_), dweight, cfg_.channels);
      kernels::residual_forward(device{}, p.grads(bias_), p.grads(bias_), dbias, cfg_.channels);
    } else {
      kernels::layernorm_backward(device{}, dinp.data(), p.grads(weight_), p.grads(bias_), dout.data(), input_.data,
                                  p.weights(weight_), mean_.data(), rstd_.data(), rows_, cfg_.channels);
    }
    p.grad_written(weight_);
    p.grad_written(bias_);
    return dinp;
  }

  void release_activations() {
    out_ = buffer<T>();
    mean_ = buffer<A>();
    rstd_ = buffer<A>();
  }

  template <class F>
  void visit_parameters(F&& f) const {
    f(weight_);
    f(bias_);
  }
  const config& cfg() const { return cfg_; }

 private:
  using device = typename P::device;
  module_scope<P> scope_;
  config cfg_;
  param_handle weight_, bias_;
  tensor_view<const T> input_;
  std::int64_t rows_ = 0;
  buffer<T> out_;
  buffer<A> mean_, rstd_;
};

}  // namespace strata
