// strata/layers/rmsnorm.hpp - RMSNorm over the last dimension, with a gain and no bias (Llama's
// norm): y = x · g / sqrt(mean(x²) + eps).
//
// Shapes: x [rows, C] -> y [rows, C]; keeps y plus each row's 1/rms for backward. Under sequence
// parallelism the rows are this rank's tokens, so the gain gradient is partial: it is summed over
// the tensor-parallel group before it is added.
#pragma once
#include <cstdint>
#include <span>

#include "strata/core/profile.hpp"
#include "strata/core/tensor.hpp"
#include "strata/kernels/residual.hpp"
#include "strata/kernels/rmsnorm.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/module.hpp"
#include "strata/layers/tensor_split.hpp"

namespace strata {

template <class P>
class rmsnorm {
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
  // ~4 flops per element forward (square, sum, scale, gain), backward ~2x; keeps its output and
  // each row's 1/rms. Under sequence parallelism it sees rows/t tokens and sums its partial gain
  // gradient over the group.
  static constexpr layer_cost cost(const config& c, const cost_scope& s) {
    const std::int64_t rows = s.local_rows();
    layer_cost r;
    r.params = c.channels;
    r.forward_flops = 4 * rows * c.channels;
    r.backward_flops = 2 * r.forward_flops;
    r.output_bytes = rows * c.channels * static_cast<std::int64_t>(sizeof(T));
    r.activation_bytes = r.output_bytes + rows * static_cast<std::int64_t>(sizeof(A));
    r.backward_peak_bytes = r.output_bytes;                // the input gradient
    r.memory_forward_bytes = double(2 * r.output_bytes);   // x in, y out
    r.memory_backward_bytes = double(3 * r.output_bytes);  // x and dy in, dx out
    if (s.tp.sequence_parallel)
      r.tensor_backward_bytes =
          ring_all_reduce_bytes(double(c.channels * static_cast<std::int64_t>(sizeof(T))), s.tp.degree);
    return r;
  }

  rmsnorm(module_scope<P> scope, const config& c) : scope_(scope), cfg_(c) {
    STRATA_CHECK(c.channels > 0, scope.qualify_layer(), ": channels (", c.channels, ") must be positive");
    STRATA_CHECK(c.eps > 0, scope.qualify_layer(), ": eps (", c.eps, ") must be positive");
    weight_ = scope_.add_parameter("weight", {c.channels}, init_rule::ones(), false);
  }

  tensor_view<const T> forward(tensor_view<const T> x) {
    STRATA_PROFILE("rmsnorm.forward");
    STRATA_CHECK(x.shape.rank >= 1 && x.shape[x.shape.rank - 1] == cfg_.channels, scope_.qualify("forward"),
                 ": expected input [..., ", cfg_.channels, "], got ", x.shape.str());
    input_ = x;
    rows_ = x.numel() / cfg_.channels;
    auto& ledger = scope_.ledger();
    ensure_size(out_, ledger, memory_category::activations, rows_ * cfg_.channels);
    ensure_size(rstd_, ledger, memory_category::activations, rows_);
    kernels::rmsnorm_forward(device{}, out_.data(), rstd_.data(), x.data, scope_.params().weights(weight_), rows_,
                             cfg_.channels, static_cast<A>(cfg_.eps));
    return {out_.data(), x.shape};
  }

  buffer<T> backward(const buffer<T>& dout) {
    STRATA_PROFILE("rmsnorm.backward");
    STRATA_CHECK(static_cast<std::int64_t>(dout.size()) == rows_ * cfg_.channels, scope_.qualify("backward"),
                 ": expected ", rows_ * cfg_.channels, " output gradients, got ", dout.size());
    auto& ledger = scope_.ledger();
    buffer<T> dinp(ledger, memory_category::activations, dout.size(), uninitialized);  // the kernel writes it
    auto& p = scope_.params();
    auto& tp = scope_.tensor();
    if (tp.sequence_parallel()) {
      buffer<T> partial(ledger, memory_category::communication, static_cast<std::size_t>(cfg_.channels));
      kernels::rmsnorm_backward(device{}, dinp.data(), partial.data(), dout.data(), input_.data, p.weights(weight_),
                                rstd_.data(), rows_, cfg_.channels);
      tp.sum_partial_gradients(std::span<T>(partial.data(), partial.size()));
      kernels::residual_forward(device{}, p.grads(weight_), p.grads(weight_), partial.data(), cfg_.channels);
    } else {
      kernels::rmsnorm_backward(device{}, dinp.data(), p.grads(weight_), dout.data(), input_.data, p.weights(weight_),
                                rstd_.data(), rows_, cfg_.channels);
    }
    p.grad_written(weight_);
    return dinp;
  }

  void release_activations() {
    out_ = buffer<T>();
    rstd_ = buffer<A>();
  }

  template <class F>
  void visit_parameters(F&& f) const {
    f(weight_);
  }
  const config& cfg() const { return cfg_; }

 private:
  using device = typename P::device;
  module_scope<P> scope_;
  config cfg_;
  param_handle weight_;
  tensor_view<const T> input_;
  std::int64_t rows_ = 0;
  buffer<T> out_;
  buffer<A> rstd_;
};

}  // namespace strata
