// strata/layers/mlp.hpp - the Transformer feed-forward block: fc, tanh-GELU, projection.
//
// x [rows, C] -> h = GELU(x·W1ᵀ + b1) [rows, F] -> y = h·W2ᵀ + b2 [rows, C]; F is 4C in GPT-2.
// Tensor parallel over t ranks: fc column-parallel (F/t features each), GELU on them, the
// projection row-parallel: one region, entered and left once.
#pragma once
#include <cstdint>

#include "strata/core/tensor.hpp"
#include "strata/kernels/host/gelu.hpp"
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
    tensor_split tp{};
  };

  static constexpr typename linear<P>::config fc_config(const config& c) {
    return {c.channels, c.hidden, true, c.init_std, tensor_split_kind::column, c.tp, 1};
  }
  static constexpr typename linear<P>::config proj_config(const config& c) {
    return {c.hidden, c.channels, true, c.proj_init_std, tensor_split_kind::row, c.tp, 1};
  }
  static constexpr std::int64_t param_count(const config& c) {
    return linear<P>::param_count(fc_config(c)) + linear<P>::param_count(proj_config(c));
  }
  static constexpr std::int64_t forward_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return linear<P>::forward_flops(fc_config(c), batch, seq) + linear<P>::forward_flops(proj_config(c), batch, seq);
  }
  static constexpr std::int64_t backward_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return 2 * forward_flops(c, batch, seq);
  }
  static constexpr std::int64_t activation_bytes(const config& c, std::int64_t batch, std::int64_t seq) {
    return linear<P>::activation_bytes(fc_config(c), batch, seq) +  // pre-activation
           batch * seq * (c.hidden / c.tp.degree) * static_cast<std::int64_t>(sizeof(T)) +  // GELU output
           linear<P>::activation_bytes(proj_config(c), batch, seq);
  }

  mlp(module_scope<P> scope, config c)
      : scope_(scope), cfg_(validated(scope, c)), fc_(scope / "fc", fc_config(c)), proj_(scope / "proj", proj_config(c)) {}

  tensor_view<const T> forward(tensor_view<const T> x) {
    auto pre = fc_.forward(x);
    pre_ = pre.data;
    ensure_size(act_, scope_.ledger(), memory_category::activations, pre.numel());
    kernels::gelu_forward(device{}, act_.data(), pre.data, pre.numel());
    return proj_.forward(tensor_view<const T>{act_.data(), pre.shape});
  }

  buffer<T> backward(const buffer<T>& dout) {
    buffer<T> dact = proj_.backward(dout);
    buffer<T> dpre(scope_.ledger(), memory_category::activations, dact.size());
    kernels::gelu_backward(device{}, dpre.data(), pre_, dact.data(), static_cast<std::int64_t>(dact.size()));
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
    STRATA_CHECK(c.tp.degree >= 1 && c.hidden % c.tp.degree == 0, scope.qualify("mlp"), ": tensor parallelism tp=",
                 c.tp.degree, " does not divide the FFN width hidden = ", c.hidden);
    return c;
  }
  module_scope<P> scope_;
  config cfg_;
  linear<P> fc_, proj_;
  const T* pre_ = nullptr;
  buffer<T> act_;
};

}  // namespace strata
