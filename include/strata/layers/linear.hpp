// strata/layers/linear.hpp - y = x·Wᵀ + b over the last dimension.
//
// Shapes: x [rows, in], W [out, in] (the layout PyTorch and GPT-2 checkpoints use), b [out],
// y [rows, out]. Keeps a view of its input (owned by the layer before it) and owns its output.
#pragma once
#include <cstdint>

#include "strata/core/tensor.hpp"
#include "strata/kernels/host/linear.hpp"
#include "strata/layers/module.hpp"

namespace strata {

template <class P>
class linear {
 public:
  using policy = P;
  using T = typename P::storage;

  struct config {
    std::int64_t in = 0, out = 0;
    bool bias = true;
    double init_std = 0.02;
  };

  // Costs for `batch` sequences of `seq` tokens.
  static constexpr std::int64_t param_count(const config& c) { return c.in * c.out + (c.bias ? c.out : 0); }
  static constexpr std::int64_t forward_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return 2 * batch * seq * c.in * c.out;
  }
  static constexpr std::int64_t backward_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return 2 * forward_flops(c, batch, seq);
  }
  // Bytes kept from forward to backward: the output (the input belongs to the layer before).
  static constexpr std::int64_t activation_bytes(const config& c, std::int64_t batch, std::int64_t seq) {
    return batch * seq * c.out * static_cast<std::int64_t>(sizeof(T));
  }

  linear(module_scope<P> scope, config c) : scope_(scope), cfg_(c) {
    STRATA_CHECK(c.in > 0 && c.out > 0, scope.qualify("linear"), ": in (", c.in, ") and out (", c.out,
                 ") must be positive");
    weight_ = scope_.add_parameter("weight", {c.out, c.in}, init_rule::normal_with_std(c.init_std), true);
    if (c.bias) bias_ = scope_.add_parameter("bias", {c.out}, init_rule::zeros(), false);
  }

  // x: [..., in] -> [..., out] with the same leading dimensions.
  tensor_view<const T> forward(tensor_view<const T> x) {
    STRATA_CHECK(x.shape.rank >= 1 && x.shape[x.shape.rank - 1] == cfg_.in, scope_.qualify("forward"),
                 ": expected input [..., ", cfg_.in, "], got ", x.shape.str());
    input_ = x;
    rows_ = x.numel() / cfg_.in;
    ensure_size(out_, scope_.ledger(), memory_category::activations, rows_ * cfg_.out);
    auto& p = scope_.params();
    kernels::linear_forward(device{}, scope_.workspace(), out_.data(), x.data, p.weights(weight_),
                            cfg_.bias ? p.weights(bias_) : nullptr, rows_, cfg_.in, cfg_.out);
    strata::shape s = x.shape;
    s.dims[static_cast<std::size_t>(s.rank - 1)] = cfg_.out;
    return {out_.data(), s};
  }

  // dout: [rows, out] -> dinp [rows, in]; accumulates into the weight and bias gradients.
  buffer<T> backward(const buffer<T>& dout) {
    STRATA_CHECK(static_cast<std::int64_t>(dout.size()) == rows_ * cfg_.out, scope_.qualify("backward"),
                 ": expected ", rows_ * cfg_.out, " output gradients, got ", dout.size());
    buffer<T> dinp(scope_.ledger(), memory_category::activations, static_cast<std::size_t>(rows_ * cfg_.in));
    auto& p = scope_.params();
    kernels::linear_backward(device{}, scope_.workspace(), dinp.data(), p.grads(weight_),
                             cfg_.bias ? p.grads(bias_) : nullptr, dout.data(), input_.data,
                             p.weights(weight_), rows_, cfg_.in, cfg_.out);
    p.grad_written(weight_);
    if (cfg_.bias) p.grad_written(bias_);
    return dinp;
  }

  template <class F>
  void visit_parameters(F&& f) const {
    f(weight_);
    if (cfg_.bias) f(bias_);
  }

  const config& cfg() const { return cfg_; }
  param_handle weight() const { return weight_; }
  param_handle bias() const { return bias_; }

 private:
  using device = typename P::device;
  module_scope<P> scope_;
  config cfg_;
  param_handle weight_, bias_;
  tensor_view<const T> input_;
  std::int64_t rows_ = 0;
  buffer<T> out_;
};

}  // namespace strata
