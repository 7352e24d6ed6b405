// strata/layers/linear.hpp - y = x·Wᵀ + b over the last dimension, whole or tensor-parallel.
//
// Shapes: x [rows, in], W [out, in] (the layout PyTorch and GPT-2 checkpoints use), b [out],
// y [rows, out]. Keeps a view of its input (owned by the layer before it) and owns its output.
//
// Under tensor parallelism over t ranks (config.split):
//   column  W [out/t, in] and b [out/t]: this rank's output features. The layer enters a
//           tensor-parallel region (tensor_parallel.hpp): under sequence parallelism it gathers
//           the tokens first, and gathers them again in backward rather than keeping them, so
//           what it holds stays a 1/t share. `blocks` > 1 splits each of that many equal groups
//           of output features separately (a fused QKV weight: every rank gets its heads' q, k, v).
//   row     W [out, in/t], b [out] whole: this rank's input features; the products are partial
//           sums that leave the region (all-reduce, or reduce-scatter to this rank's tokens).
//           The bias joins rank 0's partial sum, so it is counted once.
#pragma once
#include <cstdint>
#include <string>

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
    tensor_split_kind split = tensor_split_kind::none;
    tensor_split tp{};
    int blocks = 1;  // column split only: equal groups of output features split separately
  };

  static constexpr std::int64_t degree(const config& c) { return c.split == tensor_split_kind::none ? 1 : c.tp.degree; }
  // Costs per rank for `batch` sequences of `seq` tokens.
  static constexpr std::int64_t param_count(const config& c) {
    const std::int64_t t = degree(c);
    if (c.split == tensor_split_kind::row) return c.in / t * c.out + (c.bias ? c.out : 0);
    return c.in * (c.out / t) + (c.bias ? c.out / t : 0);
  }
  static constexpr std::int64_t forward_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return 2 * batch * seq * c.in * c.out / degree(c);
  }
  static constexpr std::int64_t backward_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return 2 * forward_flops(c, batch, seq);
  }
  // Bytes kept from forward to backward: the output (the input belongs to the layer before).
  // A column-parallel output covers every token; a row-parallel (or whole) one this rank's tokens.
  static constexpr std::int64_t activation_bytes(const config& c, std::int64_t batch, std::int64_t seq) {
    const std::int64_t rows = batch * seq;
    if (c.split == tensor_split_kind::column) return rows * (c.out / c.tp.degree) * static_cast<std::int64_t>(sizeof(T));
    return c.tp.local_rows(rows) * c.out * static_cast<std::int64_t>(sizeof(T));
  }

  linear(module_scope<P> scope, config c) : scope_(scope), cfg_(c) {
    STRATA_CHECK(c.in > 0 && c.out > 0, scope.qualify("linear"), ": in (", c.in, ") and out (", c.out,
                 ") must be positive");
    auto& tp = scope.tensor();
    if (c.split != tensor_split_kind::none) tp.check(c.tp, scope.qualify("linear"));
    const int t = static_cast<int>(degree(c));
    const std::int64_t split_extent = c.split == tensor_split_kind::row ? c.in : c.out;
    const std::int64_t groups = c.split == tensor_split_kind::column ? c.blocks : 1;
    STRATA_CHECK(split_extent % (t * groups) == 0, scope.qualify("linear"), ": tensor parallelism tp=", t,
                 " does not divide ", c.split == tensor_split_kind::row ? "in" : "out", " = ", split_extent,
                 groups > 1 ? " (split in groups of " + std::to_string(split_extent / groups) + ")" : std::string());
    out_local_ = c.split == tensor_split_kind::column ? c.out / t : c.out;
    in_local_ = c.split == tensor_split_kind::row ? c.in / t : c.in;
    const int r = c.split == tensor_split_kind::none ? 0 : tp.rank();
    tensor_shard w{{c.out, c.in}};
    if (c.split != tensor_split_kind::none) {
      w.parts = t;
      w.index = r;
      w.dim = c.split == tensor_split_kind::row ? 1 : 0;
      w.blocks = static_cast<int>(groups);
    }
    weight_ = scope_.add_parameter("weight", w, init_rule::normal_with_std(c.init_std), true);
    if (c.bias) {
      tensor_shard b{{c.out}};
      if (c.split == tensor_split_kind::column) b = {{c.out}, 0, t, r, static_cast<int>(groups)};
      bias_ = scope_.add_parameter("bias", b, init_rule::zeros(), false);
    }
  }

  // x: [..., in] -> [..., out] with the same leading dimensions (under sequence parallelism a
  // column-parallel layer's output covers every token: [B, T/t, in] -> [B, T, out/t]).
  tensor_view<const T> forward(tensor_view<const T> x) {
    STRATA_CHECK(x.shape.rank >= 1 && x.shape[x.shape.rank - 1] == in_local_, scope_.qualify("forward"),
                 ": expected input [..., ", in_local_, "], got ", x.shape.str());
    input_ = x;
    auto& tp = scope_.tensor();
    auto& p = scope_.params();
    const T* bias = cfg_.bias ? p.weights(bias_) : nullptr;
    if (cfg_.split == tensor_split_kind::column) {
      buffer<T> gathered;
      auto whole = tp.enter_forward(x, gathered, scope_.ledger());
      return product(whole, out_, bias);
    }
    if (cfg_.split == tensor_split_kind::row && tp.degree() > 1) {
      if (!tp.sequence_parallel()) {
        auto y = product(x, out_, tp.rank() == 0 ? bias : nullptr);
        return tp.leave_forward(out_, y.shape, out_, scope_.ledger());
      }
      buffer<T> partial;
      auto y = product(x, partial, tp.rank() == 0 ? bias : nullptr);
      return tp.leave_forward(partial, y.shape, out_, scope_.ledger());
    }
    return product(x, out_, bias);
  }

  // dout: the gradient of forward's output -> the gradient of its input; accumulates into the
  // weight and bias gradients.
  buffer<T> backward(const buffer<T>& dout) {
    auto& tp = scope_.tensor();
    auto& ledger = scope_.ledger();
    auto& p = scope_.params();
    buffer<T> gathered_dout;
    const buffer<T>& dy = cfg_.split == tensor_split_kind::row ? tp.leave_backward(dout, gathered_dout, ledger) : dout;
    STRATA_CHECK(static_cast<std::int64_t>(dy.size()) == rows_ * out_local_, scope_.qualify("backward"),
                 ": expected ", rows_ * out_local_, " output gradients, got ", dy.size());
    buffer<T> gathered_input;
    const T* x = cfg_.split == tensor_split_kind::column ? tp.enter_forward(input_, gathered_input, ledger).data
                                                          : input_.data;
    buffer<T> dinp(ledger, memory_category::activations, static_cast<std::size_t>(rows_ * in_local_));
    kernels::linear_backward(device{}, scope_.workspace(), dinp.data(), p.grads(weight_),
                             cfg_.bias ? p.grads(bias_) : nullptr, dy.data(), x, p.weights(weight_), rows_, in_local_,
                             out_local_);
    p.grad_written(weight_);
    if (cfg_.bias) p.grad_written(bias_);
    if (cfg_.split == tensor_split_kind::column) return tp.enter_backward(std::move(dinp), ledger);
    return dinp;
  }

  // Lets go of what forward kept (full recomputation runs forward again before backward).
  void release_activations() { out_ = buffer<T>(); }

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

  // out = x·Wᵀ (+ bias) over this rank's features, into `dest` (resized); rows_ from x.
  tensor_view<const T> product(tensor_view<const T> x, buffer<T>& dest, const T* bias) {
    rows_ = x.numel() / in_local_;
    ensure_size(dest, scope_.ledger(), memory_category::activations, rows_ * out_local_);
    auto& p = scope_.params();
    kernels::linear_forward(device{}, scope_.workspace(), dest.data(), x.data, p.weights(weight_), bias, rows_,
                            in_local_, out_local_);
    strata::shape s = x.shape;
    s.dims[static_cast<std::size_t>(s.rank - 1)] = out_local_;
    return {dest.data(), s};
  }

  module_scope<P> scope_;
  config cfg_;
  std::int64_t in_local_ = 0, out_local_ = 0;
  param_handle weight_, bias_;
  tensor_view<const T> input_;
  std::int64_t rows_ = 0;
  buffer<T> out_;
};

}  // namespace strata
