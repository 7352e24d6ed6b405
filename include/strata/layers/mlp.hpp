// strata/layers/mlp.hpp - the Transformer feed-forward block: fc, an activation, projection.
//
// x [rows, C] -> h = a(x·W1ᵀ + b1) [rows, F] -> y = h·W2ᵀ + b2 [rows, C]; F is 4C in GPT-2.
// a is config.act (kernels/activation.hpp): the tanh GELU by default (GPT-2), the exact GELU
// (GPT-NeoX, Pythia), SiLU, ReLU or ReLU². A GELU runs inside fc, fused with its bias (linear's
// config.gelu); the others as their own element-wise kernel on fc's output. Either way the
// pre-activation and a's output (the projection's input) are kept. Tensor parallel over t ranks:
// fc column-parallel (F/t features each), the activation on them, the projection row-parallel:
// one region, entered and left once.
#pragma once
#include <cstdint>

#include "strata/core/profile.hpp"
#include "strata/core/tensor.hpp"
#include "strata/kernels/activation.hpp"
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
    activation act = activation::gelu_tanh;
  };

  // Each token alone: generation runs forward on the new tokens (layers/cached_forward.hpp).
  static constexpr bool position_wise = true;

  static constexpr typename linear<P>::config fc_config(const config& c) {
    return {.in = c.channels,
            .out = c.hidden,
            .init_std = c.init_std,
            .split = tensor_split_kind::column,
            .gelu = is_gelu(c.act),
            .gelu_kind = gelu_form_of(c.act)};
  }
  static constexpr typename linear<P>::config proj_config(const config& c) {
    return {.in = c.hidden, .out = c.channels, .init_std = c.proj_init_std, .split = tensor_split_kind::row};
  }
  static constexpr tensor_extent_list tensor_extents(const config& c) { return {{"FFN width", c.hidden}}; }
  // fc (a GELU inside it, keeping the pre-activation and its output), or fc then the activation
  // (its output kept; its backward writes the pre-activation's gradient), then the projection.
  static constexpr layer_cost cost(const config& c, const cost_scope& s) {
    const layer_cost fc = linear<P>::cost(fc_config(c), s), proj = linear<P>::cost(proj_config(c), s);
    if (is_gelu(c.act)) return fc.then(proj);
    layer_cost act;
    act.forward_flops = 4 * (fc.output_bytes / static_cast<std::int64_t>(sizeof(T)));
    act.backward_flops = 2 * act.forward_flops;
    act.output_bytes = act.activation_bytes = act.backward_peak_bytes = fc.output_bytes;
    act.memory_forward_bytes = double(2 * fc.output_bytes);
    act.memory_backward_bytes = double(3 * fc.output_bytes);
    return fc.then(act).then(proj);
  }

  mlp(module_scope<P> scope, const config& c)
      : scope_(scope),
        cfg_(validated(scope, c)),
        fc_(scope / "fc", fc_config(c)),
        proj_(scope / "proj", proj_config(c)) {}

  tensor_view<const T> forward(tensor_view<const T> x) {
    auto h = fc_.forward(x);
    if (is_gelu(cfg_.act)) return proj_.forward(h);
    pre_ = h.data;
    ensure_size(act_, scope_.ledger(), memory_category::activations, h.numel());
    {
      STRATA_PROFILE("activation.forward");
      kernels::activation_forward(device{}, act_.data(), h.data, h.numel(), cfg_.act);
    }
    return proj_.forward(tensor_view<const T>{act_.data(), h.shape});
  }

  buffer<T> backward(const buffer<T>& dout) {
    if (is_gelu(cfg_.act)) return fc_.backward(proj_.backward(dout));
    buffer<T> dpre;
    {
      const buffer<T> dact = proj_.backward(dout);
      dpre = buffer<T>(scope_.ledger(), memory_category::activations, dact.size(), uninitialized);
      STRATA_PROFILE("activation.backward");
      kernels::activation_backward(device{}, dpre.data(), pre_, dact.data(), static_cast<std::int64_t>(dact.size()),
                                   cfg_.act);
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
  const T* pre_ = nullptr;  // fc's output (the pre-activation), without a fused GELU
  buffer<T> act_;           // the activation's output, without a fused GELU
};

}  // namespace strata
