// strata/layers/mlp.hpp - the Transformer feed-forward block: fc, GELU, projection.
//
// x [rows, C] -> h = GELU(x·W1ᵀ + b1) [rows, F] -> y = h·W2ᵀ + b2 [rows, C]; F is 4C in GPT-2.
// GELU is the tanh approximation (GPT-2) unless config.gelu says exact (GPT-NeoX, Pythia).
// fc applies GELU itself (linear's config.gelu), fused with its bias. Tensor parallel over t
// ranks: fc column-parallel (F/t features each), GELU on them, the projection row-parallel: one
// region, entered and left once.
#pragma once
#include <cstdint>

#include "strata/core/tensor.hpp"
#include "strata/kernels/gelu_form.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/linear.hpp"

namespace strata {

template <class P>
class mlp {
 public:
  using policy = P;
  using T = typename P::storage;

  struct config {
    std::int64_t channels = 0, hidden = 0;
    double init_std = 0.02;
    double proj_init_std = 0.02;
    gelu_form gelu = gelu_form::tanh;
  };

  // Each token alone: generation runs forward on the new tokens (layers/cached_forward.hpp).
  static constexpr bool position_wise = true;

  static constexpr typename linear<P>::config fc_config(const config& c) {
    return {.in = c.channels,
            .out = c.hidden,
            .init_std = c.init_std,
            .split = tensor_split_kind::column,
            .gelu = true,
            .gelu_kind = c.gelu};
  }
  static constexpr typename linear<P>::config proj_config(const config& c) {
    return {.in = c.hidden, .out = c.channels, .init_std = c.proj_init_std, .split = tensor_split_kind::row};
  }
  static constexpr tensor_extent_list tensor_extents(const config& c) { return {{"FFN width", c.hidden}}; }
  // fc with GELU (keeping the pre-activation and GELU's output, the projection's input), then the
  // projection.
  static constexpr layer_cost cost(const config& c, const cost_scope& s) {
    return linear<P>::cost(fc_config(c), s).then(linear<P>::cost(proj_config(c), s));
  }

  mlp(module_scope<P> scope, const config& c)
      : cfg_(validated(scope, c)), fc_(scope / "fc", fc_config(c)), proj_(scope / "proj", proj_config(c)) {}

  tensor_view<const T> forward(tensor_view<const T> x) { return proj_.forward(fc_.forward(x)); }

  buffer<T> backward(const buffer<T>& dout) { return fc_.backward(proj_.backward(dout)); }

  void release_activations() {
    fc_.release_activations();
    proj_.release_activations();
  }

  template <class F>
  void visit_parameters(F&& f) const {
    fc_.visit_parameters(f);
    proj_.visit_parameters(f);
  }
  const config& cfg() const { return cfg_; }

 private:
  static const config& validated(const module_scope<P>& scope, const config& c) {
    scope.check_tensor_extents(tensor_extents(c));
    return c;
  }
  config cfg_;
  linear<P> fc_, proj_;
};

}  // namespace strata
