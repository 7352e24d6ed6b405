// strata/layers/mlp.hpp - the Transformer feed-forward block: fc, tanh-GELU, projection.
//
// x [rows, C] -> h = GELU(x·W1ᵀ + b1) [rows, F] -> y = h·W2ᵀ + b2 [rows, C]; F is 4C in GPT-2.
// Tensor parallel over t ranks: fc column-parallel (F/t features each), GELU on them, the
// projection row-parallel: one region, entered and left once.
#pragma once
#include <cstdint>

#include "strata/core/profile.hpp"
#include "strata/core/tensor.hpp"
#include "strata/kernels/gelu.hpp"
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
  };

  // Each token alone: generation runs forward on the new tokens (layers/cached_forward.hpp).
  static constexpr bool position_wise = true;

  static constexpr typename linear<P>::config fc_config(const config& c) {
    return {.in = c.channels, .out = c.hidden, .init_std = c.init_std, .split = tensor_split_kind::column};
  }
  static constexpr typename linear<P>::config proj_config(const config& c) {
    return {.in = c.hidden, .out = c.channels, .init_std = c.proj_init_std, .split = tensor_split_kind::row};
  }
  static constexpr tensor_extent_list tensor_extents(const config& c) { return {{"FFN width", c.hidden}}; }
  // fc, then GELU (its output kept: the projection's input), then the projection.
  static constexpr layer_cost cost(const config& c, const cost_scope& s) {
    layer_cost gelu;
    gelu.output_bytes = gelu.activation_bytes =
        s.rows() * (c.hidden / s.tp.degree) * static_cast<std::int64_t>(sizeof(T));
    return linear<P>::cost(fc_config(c), s).then(gelu).then(linear<P>::cost(proj_config(c), s));
  }

  mlp(module_scope<P> scope, const config& c)
      : scope_(scope), cfg_(validated(scope, c)), fc_(scope / "fc", fc_config(c)), proj_(scope / "proj", proj_config(c)) {}

  tensor_view<const T> forward(tensor_view<const T> x) {
    auto pre = fc_.forward(x);
    pre_ = pre.data;
    ensure_size(act_, scope_.ledger(), memory_category::activations, pre.numel());
    {
      STRATA_PROFILE("gelu.forward");
      kernels::gelu_forward(device{}, act_.data(), pre.data, pre.numel());
    }
    return proj_.forward(tensor_view<const T>{act_.data(), pre.shape});
  }

  buffer<T> backward(const buffer<T>& dout) {
    buffer<T> dact = proj_.backward(dout);
    buffer<T> dpre(scope_.ledger(), memory_category::activations, dact.size(), uninitialized);
    {
      STRATA_PROFILE("gelu.backward");
      kernels::gelu_backward(device{}, dpre.data(), pre_, dact.data(), static_cast<std::int64_t>(dact.size()));
    }
    return fc_.backward(dpre);
  }

  void release_activations() {
    fc_.release_activations();
    proj_.release_activations();
    act_ = buffer<T>();
  }

  template <class F>
  void visit_parameters(F&& f) const {
    fc_.visit_parameters(f);
    proj_.visit_parameters(f);
  }
  const config& cfg() const { return cfg_; }

 private:
  using device = typename P::device;
  static const config& validated(const module_scope<P>& scope, const config& c) {
    scope.check_tensor_extents(tensor_extents(c));
    return c;
  }
  module_scope<P> scope_;
  config cfg_;
  linear<P> fc_, proj_;
  const T* pre_ = nullptr;
  buffer<T> act_;
};

}  // namespace strata
