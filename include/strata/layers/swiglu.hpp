// strata/layers/swiglu.hpp - the gated feed-forward block: SwiGLU (Llama's) by default, no biases.
//
// x [rows, C] -> gate|up = x·[Wgate; Wup]ᵀ [rows, 2F] (one fused GEMM) -> h = a(gate)·up
// [rows, F] -> y = h·Wdownᵀ [rows, C]. a is config.gate (kernels/activation.hpp): silu (SwiGLU),
// gelu_tanh or gelu_exact (GeGLU), relu (ReGLU) or relu_squared.
// Tensor parallel over t ranks: gate|up column-parallel with its two halves split separately
// (each rank gets F/t gate and the matching F/t up features), the gate on them, down
// row-parallel: one region, entered and left once, as GPT-2's MLP.
#pragma once
#include <cstdint>

#include "strata/core/profile.hpp"
#include "strata/core/tensor.hpp"
#include "strata/kernels/activation.hpp"
#include "strata/kernels/swiglu.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/linear.hpp"

namespace strata {

template <class P>
class swiglu {
 public:
  using policy = P;
  using T = typename P::storage;

  struct config {
    std::int64_t channels = 0, hidden = 0;
    double init_std = 0.02;
    double proj_init_std = 0.02;         // the down projection
    activation gate = activation::silu;  // the gate's activation
  };

  // Each token alone: generation runs forward on the new tokens (layers/cached_forward.hpp).
  static constexpr bool position_wise = true;

  static constexpr typename linear<P>::config gate_up_config(const config& c) {
    return {.in = c.channels,
            .out = 2 * c.hidden,
            .bias = false,
            .init_std = c.init_std,
            .split = tensor_split_kind::column,
            .blocks = 2};
  }
  static constexpr typename linear<P>::config down_config(const config& c) {
    return {
        .in = c.hidden, .out = c.channels, .bias = false, .init_std = c.proj_init_std, .split = tensor_split_kind::row};
  }
  static constexpr tensor_extent_list tensor_extents(const config& c) { return {{"FFN width", c.hidden}}; }
  // gate|up, then the gate (its output kept: the down projection's input), then down.
  static constexpr layer_cost cost(const config& c, const cost_scope& s) {
    layer_cost gate;
    const std::int64_t features = s.rows() * (c.hidden / s.tp.degree);
    gate.forward_flops = 4 * features;  // sigmoid, two products
    gate.backward_flops = 2 * gate.forward_flops;
    gate.output_bytes = gate.activation_bytes = features * static_cast<std::int64_t>(sizeof(T));
    gate.memory_forward_bytes = double(3 * gate.output_bytes);   // gate and up in, the product out
    gate.memory_backward_bytes = double(5 * gate.output_bytes);  // both and dy in, both gradients out
    const layer_cost gate_up = linear<P>::cost(gate_up_config(c), s), down = linear<P>::cost(down_config(c), s);
    layer_cost r = gate_up.then(gate).then(down);
    // Backward holds the gate's output gradient and its pre-activations' (twice as wide) while
    // gate|up's backward runs.
    r.backward_peak_bytes =
        layer_cost::max_of(down.backward_peak_bytes, 3 * gate.output_bytes + gate_up.backward_peak_bytes);
    return r;
  }

  swiglu(module_scope<P> scope, const config& c)
      : scope_(scope),
        cfg_(validated(scope, c)),
        gate_up_(scope / "gate_up", gate_up_config(c)),
        down_(scope / "down", down_config(c)) {}

  tensor_view<const T> forward(tensor_view<const T> x) {
    auto pre = gate_up_.forward(x);  // [..., 2F/t]: this rank's gate features, then its up features
    pre_ = pre.data;
    const std::int64_t hidden = pre.shape[pre.shape.rank - 1] / 2, rows = pre.numel() / (2 * hidden);
    ensure_size(act_, scope_.ledger(), memory_category::activations, rows * hidden);
    {
      STRATA_PROFILE("swiglu.forward");
      if (cfg_.gate == activation::silu) kernels::swiglu_forward(device{}, act_.data(), pre.data, rows, hidden);
      else kernels::glu_forward(device{}, act_.data(), pre.data, rows, hidden, cfg_.gate);
    }
    strata::shape s = pre.shape;
    s.dims[static_cast<std::size_t>(s.rank - 1)] = hidden;
    return down_.forward(tensor_view<const T>{act_.data(), s});
  }

  buffer<T> backward(const buffer<T>& dout) {
    buffer<T> dact = down_.backward(dout);
    const std::int64_t hidden = cfg_.hidden / scope_.tensor().degree(),
                       rows = static_cast<std::int64_t>(dact.size()) / hidden;
    buffer<T> dpre(scope_.ledger(), memory_category::activations, dact.size() * 2, uninitialized);
    {
      STRATA_PROFILE("swiglu.backward");
      if (cfg_.gate == activation::silu)
        kernels::swiglu_backward(device{}, dpre.data(), dact.data(), pre_, rows, hidden);
      else kernels::glu_backward(device{}, dpre.data(), dact.data(), pre_, rows, hidden, cfg_.gate);
    }
    return gate_up_.backward(dpre);
  }

  void release_activations() {
    gate_up_.release_activations();
    down_.release_activations();
    act_ = buffer<T>();
  }

  template <class F>
  void visit_parameters(F&& f) const {
    gate_up_.visit_parameters(f);
    down_.visit_parameters(f);
  }
  const config& cfg() const { return cfg_; }

 private:
  using device = typename P::device;
  static const config& validated(const module_scope<P>& scope, const config& c) {
    STRATA_CHECK(c.channels > 0 && c.hidden > 0, scope.qualify_layer(), ": channels (", c.channels, ") and hidden (",
                 c.hidden, ") must be positive");
    scope.check_tensor_extents(tensor_extents(c));
    return c;
  }
  module_scope<P> scope_;
  config cfg_;
  linear<P> gate_up_, down_;
  const T* pre_ = nullptr;
  buffer<T> act_;
};

}  // namespace strata
