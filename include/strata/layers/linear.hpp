// strata/layers/linear.hpp - y = x·Wᵀ + b over the last dimension, whole or tensor-parallel.
//
// Shapes: x [rows, in], W [out, in] (the layout PyTorch and GPT-2 checkpoints use), b [out],
// y [rows, out]. Keeps a view of its input (owned by the layer before it) and owns its output.
//
// Under tensor parallelism over t ranks (config.split says which half; the degree comes from
// where the layer is built):
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

#include "strata/core/tensor.hpp"
#include "strata/kernels/linear.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/module.hpp"
#include "strata/layers/tensor_split.hpp"

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
    int blocks = 1;  // column split only: equal groups of output features split separately
  };

  // What a tensor-parallel degree must divide: the output features of each block (column), or
  // the input features (row).
  static constexpr tensor_extent_list tensor_extents(const config& c) {
    if (c.split == tensor_split_kind::column) return {{"out features per block", c.out / c.blocks}};
    if (c.split == tensor_split_kind::row) return {{"in features", c.in}};
    return {};
  }
  // For `batch` sequences of `seq` tokens on one rank. A column-parallel output covers every
  // token; a row-parallel (or whole) one this rank's tokens. The input belongs to the layer before.
  static constexpr layer_cost cost(const config& c, const cost_scope& s) {
    const tensor_split tp = c.split == tensor_split_kind::none ? tensor_split{} : s.tp;
    const std::int64_t t = tp.degree, rows = s.rows(), bytes = static_cast<std::int64_t>(sizeof(T));
    layer_cost r;
    if (c.split == tensor_split_kind::row) r.params = c.in / t * c.out + (c.bias ? c.out : 0);
    else r.params = c.in * (c.out / t) + (c.bias ? c.out / t : 0);
    r.forward_flops = 2 * rows * c.in * c.out / t;
    r.backward_flops = 2 * r.forward_flops;
    r.output_bytes = (c.split == tensor_split_kind::column ? rows * (c.out / t) : s.tp.local_rows(rows) * c.out) * bytes;
    r.activation_bytes = r.output_bytes;
    if (c.split == tensor_split_kind::column) {
      const double input = double(rows * c.in * bytes);
      r.tensor_forward_bytes = tensor_edge_bytes::enter_forward(tp, input);
      // backward: the input gradient's partial sums leave, and the input is gathered again
      r.tensor_backward_bytes = tensor_edge_bytes::enter_backward(tp, input) + tensor_edge_bytes::enter_forward(tp, input);
    } else if (c.split == tensor_split_kind::row) {
      const double output = double(rows * c.out * bytes);
      r.tensor_forward_bytes = tensor_edge_bytes::leave_forward(tp, output);
      r.tensor_backward_bytes = tensor_edge_bytes::leave_backward(tp, output);
    }
    return r;
  }

  linear(module_scope<P> scope, const config& c) : scope_(scope), cfg_(c) {
    STRATA_CHECK(c.in > 0 && c.out > 0, scope.qualify_layer(), ": in (", c.in, ") and out (", c.out,
                 ") must be positive");
    STRATA_CHECK(c.blocks >= 1 && c.out % c.blocks == 0, scope.qualify_layer(), ": ", c.blocks,
                 " blocks do not split out = ", c.out);
    scope.check_tensor_extents(tensor_extents(c));
    auto& tp = scope.tensor();
    const int t = c.split == tensor_split_kind::none ? 1 : tp.degree();
    const std::int64_t groups = c.split == tensor_split_kind::column ? c.blocks : 1;
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
