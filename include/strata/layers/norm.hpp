// strata/layers/norm.hpp - normalization over the last dimension, with a gain: LayerNorm (each
// row centred, a bias added) or RMSNorm (neither; Llama's).
//
//   layer:  y = (x - mean(x)) / sqrt(var(x) + eps) · g + b     keeps y, each row's mean and 1/std
//   rms:    y = x / sqrt(mean(x²) + eps) · g                   keeps y and each row's 1/rms
//
// Shapes: x [rows, C] -> y [rows, C]. The gain and bias are whole on every rank and registered as
// token shares (layers/tensor_gradients.hpp): under sequence parallelism the rows are this rank's
// tokens, and the library sums their gradients over the tensor group.
#pragma once
#include <cstdint>

#include "strata/core/profile.hpp"
#include "strata/core/tensor.hpp"
#include "strata/kernels/layernorm.hpp"
#include "strata/kernels/rmsnorm.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/module.hpp"
#include "strata/layers/tensor_gradients.hpp"
#include "strata/layers/tensor_split.hpp"

namespace strata {

// Whether a norm centres each row and adds a bias (LayerNorm) or does neither (RMSNorm): the two
// forms strata's kernels compute.
enum class norm_form { layer, rms };

template <class P, norm_form Form>
class norm {
 public:
  using policy = P;
  using T = typename P::storage;
  using A = typename P::accumulate;
  static constexpr bool centered = Form == norm_form::layer;  // subtracts the mean, adds a bias

  struct config {
    std::int64_t channels = 0;
    double eps = 1e-5;
  };

  // Each token alone: generation runs forward on the new tokens (layers/cached_forward.hpp).
  static constexpr bool position_wise = true;

  static constexpr tensor_extent_list tensor_extents(const config&) { return {}; }
  // Forward ~8 flops per element centred (mean, variance, normalise, scale, shift), ~4 not
  // (square, sum, scale, gain); backward ~2x. Keeps its output and one (or, centred, two)
  // numbers per row; under sequence parallelism it sees rows/t tokens and the group sums its
  // parameters' gradients.
  static constexpr layer_cost cost(const config& c, const cost_scope& s) {
    const std::int64_t rows = s.local_rows(), per_row = centered ? 2 : 1;
    layer_cost r;
    r.params = per_row * c.channels;
    r.forward_flops = (centered ? 8 : 4) * rows * c.channels;
    r.backward_flops = 2 * r.forward_flops;
    r.output_bytes = rows * c.channels * static_cast<std::int64_t>(sizeof(T));
    r.activation_bytes = r.output_bytes + per_row * rows * static_cast<std::int64_t>(sizeof(A));
    r.backward_peak_bytes = r.output_bytes;                // the input gradient
    r.memory_forward_bytes = double(2 * r.output_bytes);   // x in, y out
    r.memory_backward_bytes = double(3 * r.output_bytes);  // x and dy in, dx out
    r.tensor_backward_bytes =
        tensor_gradient_bytes(tensor_gradient::token_share, s.tp, r.params, static_cast<std::int64_t>(sizeof(T)));
    return r;
  }

  norm(module_scope<P> scope, const config& c) : scope_(scope), cfg_(c) {
    STRATA_CHECK(c.channels > 0, scope.qualify_layer(), ": channels (", c.channels, ") must be positive");
    STRATA_CHECK(c.eps > 0, scope.qualify_layer(), ": eps (", c.eps, ") must be positive");
    weight_ = scope_.add_parameter("weight", {c.channels}, init_rule::ones(), false, tensor_gradient::token_share);
    if constexpr (centered)
      bias_ = scope_.add_parameter("bias", {c.channels}, init_rule::zeros(), false, tensor_gradient::token_share);
  }

  tensor_view<const T> forward(tensor_view<const T> x) {
    STRATA_PROFILE(centered ? "layernorm.forward" : "rmsnorm.forward");
    STRATA_CHECK(x.shape.rank >= 1 && x.shape[x.shape.rank - 1] == cfg_.channels, scope_.qualify("forward"),
                 ": expected input [..., ", cfg_.channels, "], got ", x.shape.str());
    input_ = x;
    rows_ = x.numel() / cfg_.channels;
    auto& ledger = scope_.ledger();
    ensure_size(out_, ledger, memory_category::activations, rows_ * cfg_.channels);
    ensure_size(rstd_, ledger, memory_category::activations, rows_);
    auto& p = scope_.params();
    if constexpr (centered) {
      ensure_size(mean_, ledger, memory_category::activations, rows_);
      kernels::layernorm_forward(device{}, out_.data(), mean_.data(), rstd_.data(), x.data, p.weights(weight_),
                                 p.weights(bias_), rows_, cfg_.channels, static_cast<A>(cfg_.eps));
    } else {
      kernels::rmsnorm_forward(device{}, out_.data(), rstd_.data(), x.data, p.weights(weight_), rows_, cfg_.channels,
                               static_cast<A>(cfg_.eps));
    }
    return {out_.data(), x.shape};
  }

  buffer<T> backward(const buffer<T>& dout) {
    STRATA_PROFILE(centered ? "layernorm.backward" : "rmsnorm.backward");
    STRATA_CHECK(static_cast<std::int64_t>(dout.size()) == rows_ * cfg_.channels, scope_.qualify("backward"),
                 ": expected ", rows_ * cfg_.channels, " output gradients, got ", dout.size());
    buffer<T> dinp(scope_.ledger(), memory_category::activations, dout.size(), uninitialized);  // the kernel writes it
    auto& p = scope_.params();
    if constexpr (centered) {
      auto g = scope_.gradients(weight_, bias_);
      kernels::layernorm_backward(device{}, dinp.data(), g[0], g[1], dout.data(), input_.data, p.weights(weight_),
                                  mean_.data(), rstd_.data(), rows_, cfg_.channels);
      g.written();
    } else {
      auto g = scope_.gradients(weight_);
      kernels::rmsnorm_backward(device{}, dinp.data(), g[0], dout.data(), input_.data, p.weights(weight_), rstd_.data(),
                                rows_, cfg_.channels);
      g.written();
    }
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
    if constexpr (centered) f(bias_);
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
  buffer<A> mean_, rstd_;  // mean_: centred only
};

}  // namespace strata
