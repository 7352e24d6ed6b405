// strata/layers/linear.hpp - y = x·Wᵀ + b over the last dimension, whole or tensor-parallel.
//
// Shapes: x [rows, in], W [out, in] (the layout PyTorch and GPT-2 checkpoints use), b [out],
// y [rows, out]. Keeps a view of its input (owned by the layer before it) and owns its output.
// With config.gelu the output is GELU(x·Wᵀ + b) (the MLP's first projection; config.gelu_kind
// says tanh or exact, kernels/gelu_form.hpp): bias and GELU run
// fused (kernels linear_gelu_forward, and bias_gelu_backward for the bias gradient), and the layer
// keeps the pre-activation as well.
//
// Under tensor parallelism over t ranks (config.split says which half; the degree comes from
// where the layer is built):
//   column  W [out/t, in] and b [out/t]: this rank's output features. The layer enters a
//           tensor-parallel region (tensor_parallel.hpp): under sequence parallelism it gathers
//           the tokens first, and gathers them again in backward rather than keeping them, so
//           what it holds stays a 1/t share. `blocks` > 1 splits each of that many equal groups
//           of output features separately (a fused QKV weight: every rank gets its heads' q, k, v);
//           `block_sizes` does the same for unequal groups (grouped-query QKV: {H·d, KV·d, KV·d}).
//           With `block_heads`, a degree that is a multiple of a block's heads gives each of those
//           heads to degree/heads neighbouring ranks (fewer key/value heads than ranks): their
//           weight gradients are partial, and are summed over the ranks sharing them.
//   row     W [out, in/t], b [out] whole: this rank's input features; the products are partial
//           sums that leave the region (all-reduce, or reduce-scatter to this rank's tokens).
//           The bias joins rank 0's partial sum, so it is counted once.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "strata/core/profile.hpp"
#include "strata/core/tensor.hpp"
#include "strata/kernels/gelu.hpp"
#include "strata/kernels/linear.hpp"
#include "strata/kernels/residual.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/module.hpp"
#include "strata/layers/parameters.hpp"
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
    // Column split only, instead of `blocks` equal groups: groups of these sizes (adding up to
    // out), each split separately.
    std::array<std::int64_t, tensor_shard::max_blocks> block_sizes{};
    // With block_sizes: the heads in each group (0: any split), for degrees above a group's heads.
    std::array<std::int64_t, tensor_shard::max_blocks> block_heads{};
    // GELU on the output, fused with the bias. Not with a row split, whose output is a partial sum.
    bool gelu = false;
    gelu_form gelu_kind = gelu_form::tanh;  // with gelu: the tanh approximation or the exact form

    constexpr int block_count() const {
      if (block_sizes[0] <= 0) return blocks;
      int n = 0;
      while (n < tensor_shard::max_blocks && block_sizes[std::size_t(n)] > 0) ++n;
      return n;
    }
    constexpr std::int64_t block_size(int b) const {
      return block_sizes[0] > 0 ? block_sizes[std::size_t(b)] : out / blocks;
    }
  };

  // Each token alone: generation runs forward on the new tokens (layers/cached_forward.hpp).
  static constexpr bool position_wise = true;

  // What a tensor-parallel degree must divide: the output features of each block (column), or
  // the input features (row).
  static constexpr tensor_extent_list tensor_extents(const config& c) {
    if (c.split == tensor_split_kind::column && c.block_sizes[0] > 0) {
      tensor_extent_list r;
      for (int b = 0; b < c.block_count(); ++b) {
        const std::int64_t heads = c.block_heads[std::size_t(b)];
        r.add(heads > 0 ? tensor_extent{"heads of a fused block", heads, true}
                        : tensor_extent{"out features per block", c.block_size(b)});
      }
      return r;
    }
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
    else r.params = (c.in + (c.bias ? 1 : 0)) * local_out(c, int(t));
    r.forward_flops = 2 * rows * c.in * (c.split == tensor_split_kind::row ? c.out / t : local_out(c, int(t)));
    r.backward_flops = 2 * r.forward_flops;
    r.output_bytes =
        (c.split == tensor_split_kind::column ? rows * local_out(c, int(t)) : s.tp.local_rows(rows) * c.out) * bytes;
    r.activation_bytes = (c.gelu ? 2 : 1) * r.output_bytes;  // with GELU, the pre-activation too
    {
      const std::int64_t n = c.split == tensor_split_kind::row ? c.out : local_out(c, int(t));
      const std::int64_t k = c.split == tensor_split_kind::row ? c.in / t : c.in;
      add_linear_gemms(r.forward_gemms, r.backward_gemms, rows, k, n);
      if (c.gelu) {  // GELU reads the pre-activation and writes the output; backward reads it and dy, writes dx
        r.memory_forward_bytes = double(2 * rows * n * bytes);
        r.memory_backward_bytes = double(3 * rows * n * bytes);
      }
    }
    if (c.split == tensor_split_kind::column) {
      const double input = double(rows * c.in * bytes);
      r.tensor_forward_bytes = tensor_edge_bytes::enter_forward(tp, input);
      // backward: the input gradient's partial sums leave, and the input is gathered again
      r.tensor_backward_bytes =
          tensor_edge_bytes::enter_backward(tp, input) + tensor_edge_bytes::enter_forward(tp, input);
    } else if (c.split == tensor_split_kind::row) {
      const double output = double(rows * c.out * bytes);
      r.tensor_forward_bytes = tensor_edge_bytes::leave_forward(tp, output);
      r.tensor_backward_bytes = tensor_edge_bytes::leave_backward(tp, output);
    }
    if (c.split == tensor_split_kind::column && t > 1)  // the weight gradients of shared heads, summed
      r.tensor_backward_bytes += ring_all_reduce_bytes(double(shared_gradient_elements(c, int(t)) * bytes), int(t));
    // Memory beyond the kept output, over the calls (backward's scratch included).
    if (c.split == tensor_split_kind::row) {
      // Under sequence parallelism forward's partial sums and backward's gathered output gradient
      // are whole; the input gradient has this rank's features of every token.
      const std::int64_t whole_out = tp.sequence_parallel ? rows * c.out * bytes : 0;
      r.forward_peak_bytes = r.activation_bytes + whole_out;
      r.backward_peak_bytes = whole_out + rows * (c.in / t) * bytes;
    } else {
      // The input gathered under sequence parallelism (forward, and again in backward), the input
      // gradient of every token, GELU's pre-activation gradient or, under sequence parallelism,
      // this rank's tokens' input gradient (reduce-scattered) - the two never at once.
      const std::int64_t rows_in = c.split == tensor_split_kind::column ? rows : s.tp.local_rows(rows);
      const std::int64_t gathered = tp.sequence_parallel ? rows * c.in * bytes : 0;
      const std::int64_t dpre = c.gelu ? rows_in * local_out(c, int(t)) * bytes : 0;
      const std::int64_t mine = tp.sequence_parallel ? tp.local_rows(rows) * c.in * bytes : 0;
      r.forward_peak_bytes = r.activation_bytes + gathered;
      r.backward_peak_bytes = gathered + rows_in * c.in * bytes + (dpre > mine ? dpre : mine);
    }
    return r;
  }

  // A column-parallel layer's output features on one of `t` ranks.
  static constexpr std::int64_t local_out(const config& c, int t) {
    if (c.split != tensor_split_kind::column) return c.out;
    std::int64_t n = 0;
    for (int b = 0; b < c.block_count(); ++b) n += c.block_size(b) / pieces(c, b, t);
    return n;
  }

  linear(module_scope<P> scope, const config& c) : scope_(scope), cfg_(c) {
    STRATA_CHECK(c.in > 0 && c.out > 0, scope.qualify_layer(), ": in (", c.in, ") and out (", c.out,
                 ") must be positive");
    STRATA_CHECK(c.blocks >= 1 && c.out % c.blocks == 0, scope.qualify_layer(), ": ", c.blocks,
                 " blocks do not split out = ", c.out);
    if (c.block_sizes[0] > 0) {
      std::int64_t sum = 0;
      for (int b = 0; b < c.block_count(); ++b) sum += c.block_size(b);
      STRATA_CHECK(c.split == tensor_split_kind::column && sum == c.out, scope.qualify_layer(),
                   ": block sizes (a column split's groups) add up to ", sum, ", not out = ", c.out);
    }
    scope.check_tensor_extents(tensor_extents(c));
    auto& tp = scope.tensor();
    const int t = c.split == tensor_split_kind::none ? 1 : tp.degree();
    out_local_ = local_out(c, t);
    in_local_ = c.split == tensor_split_kind::row ? c.in / t : c.in;
    const int r = c.split == tensor_split_kind::none ? 0 : tp.rank();
    tensor_shard w{{c.out, c.in}};
    tensor_shard b{{c.out}};
    if (c.split == tensor_split_kind::row) {
      w.parts = t;
      w.index = r;
      w.dim = 1;
    } else if (c.split == tensor_split_kind::column) {
      for (tensor_shard* s : {&w, &b}) {
        s->parts = t;
        s->index = r;
        s->blocks = c.block_count();
        for (int k = 0; k < s->blocks && c.block_sizes[0] > 0; ++k) {
          s->block_sizes[std::size_t(k)] = c.block_size(k);
          s->block_parts[std::size_t(k)] = pieces(c, k, t);
        }
      }
      shared_ = w.has_shared_pieces();
      weight_shard_ = w;
    }
    STRATA_CHECK(!c.gelu || c.split != tensor_split_kind::row, scope.qualify_layer(),
                 ": GELU needs whole outputs, and a row-parallel layer's output is a partial sum");
    STRATA_CHECK(!c.gelu || !shared_, scope.qualify_layer(),
                 ": GELU with heads shared between tensor-parallel ranks (block_heads) is not supported");
    weight_ = scope_.add_parameter("weight", w, init_rule::normal_with_std(c.init_std), true);
    if (c.bias) bias_ = scope_.add_parameter("bias", b, init_rule::zeros(), false);
  }

  // x: [..., in] -> [..., out] with the same leading dimensions (under sequence parallelism a
  // column-parallel layer's output covers every token: [B, T/t, in] -> [B, T, out/t]).
  tensor_view<const T> forward(tensor_view<const T> x) {
    STRATA_PROFILE(cfg_.gelu ? "linear_gelu.forward" : "linear.forward");
    STRATA_CHECK(x.shape.rank >= 1 && x.shape[x.shape.rank - 1] == in_local_, scope_.qualify("forward"),
                 ": expected input [..., ", in_local_, "], got ", x.shape.str());
    input_ = x;
    auto& tp = scope_.tensor();
    auto& p = scope_.params();
    const T* bias = cfg_.bias ? p.weights(bias_) : nullptr;
    if (cfg_.split == tensor_split_kind::column) {
      buffer<T> gathered;
      auto whole = tp.enter_forward(x, gathered, scope_.ledger());
      return cfg_.gelu ? product_gelu(whole, bias) : product(whole, out_, bias);
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
    return cfg_.gelu ? product_gelu(x, bias) : product(x, out_, bias);
  }

  // dout: the gradient of forward's output -> the gradient of its input; accumulates into the
  // weight and bias gradients.
  buffer<T> backward(const buffer<T>& dout) {
    STRATA_PROFILE(cfg_.gelu ? "linear_gelu.backward" : "linear.backward");
    auto& tp = scope_.tensor();
    auto& ledger = scope_.ledger();
    auto& p = scope_.params();
    buffer<T> gathered_dout;
    const buffer<T>& dy = cfg_.split == tensor_split_kind::row ? tp.leave_backward(dout, gathered_dout, ledger) : dout;
    STRATA_CHECK(static_cast<std::int64_t>(dy.size()) == rows_ * out_local_, scope_.qualify("backward"), ": expected ",
                 rows_ * out_local_, " output gradients, got ", dy.size());
    buffer<T> gathered_input;
    const T* x =
        cfg_.split == tensor_split_kind::column ? tp.enter_forward(input_, gathered_input, ledger).data : input_.data;
    buffer<T> dinp(ledger, memory_category::activations, static_cast<std::size_t>(rows_ * in_local_), uninitialized);
    if (shared_) {
      backward_shared(dinp.data(), dy.data(), x);
    } else if (cfg_.gelu) {
      // dy is GELU's output gradient: the pre-activation's, and the bias gradient in the same pass.
      buffer<T> dpre(ledger, memory_category::activations, dy.size(), uninitialized);
      kernels::bias_gelu_backward(device{}, dpre.data(), cfg_.bias ? p.grads(bias_) : nullptr, out_.data(), dy.data(),
                                  rows_, out_local_, cfg_.gelu_kind);
      kernels::linear_backward(device{}, scope_.workspace(), dinp.data(), p.grads(weight_), nullptr, dpre.data(), x,
                               p.weights(weight_), rows_, in_local_, out_local_);
    } else {
      kernels::linear_backward(device{}, scope_.workspace(), dinp.data(), p.grads(weight_),
                               cfg_.bias ? p.grads(bias_) : nullptr, dy.data(), x, p.weights(weight_), rows_, in_local_,
                               out_local_);
    }
    p.grad_written(weight_);
    if (cfg_.bias) p.grad_written(bias_);
    if (cfg_.split == tensor_split_kind::column) return tp.enter_backward(std::move(dinp), ledger);
    return dinp;
  }

  // The output forward just returned, writable, for a column-parallel or whole layer: the layer
  // that owns what follows may transform it in place (attention turns q and k by position).
  T* output_data() {
    STRATA_CHECK(cfg_.split != tensor_split_kind::row, scope_.qualify("output_data"),
                 ": a row-parallel layer's output is the group's sum, not its own");
    STRATA_CHECK(!cfg_.gelu, scope_.qualify("output_data"), ": the output of GELU is not the layer's to change");
    return out_.data();
  }

  // Lets go of what forward kept (full recomputation runs forward again before backward).
  void release_activations() {
    out_ = buffer<T>();
    act_ = buffer<T>();
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

  // GELU(x·Wᵀ + bias) over this rank's features into act_, the pre-activation into out_.
  tensor_view<const T> product_gelu(tensor_view<const T> x, const T* bias) {
    rows_ = x.numel() / in_local_;
    ensure_size(out_, scope_.ledger(), memory_category::activations, rows_ * out_local_);
    ensure_size(act_, scope_.ledger(), memory_category::activations, rows_ * out_local_);
    kernels::linear_gelu_forward(device{}, scope_.workspace(), act_.data(), out_.data(), x.data,
                                 scope_.params().weights(weight_), bias, rows_, in_local_, out_local_, cfg_.gelu_kind);
    strata::shape s = x.shape;
    s.dims[static_cast<std::size_t>(s.rank - 1)] = out_local_;
    return {act_.data(), s};
  }

  // Pieces block b of a column split is cut into on t ranks: t, or its heads when they are fewer.
  static constexpr int pieces(const config& c, int b, int t) {
    const std::int64_t heads = c.block_sizes[0] > 0 ? c.block_heads[std::size_t(b)] : 0;
    return heads > 0 && heads < t ? int(heads) : t;
  }
  // Weight (and bias) elements of the shared blocks, whole: what their gradient sum carries.
  static constexpr std::int64_t shared_gradient_elements(const config& c, int t) {
    std::int64_t n = 0;
    for (int b = 0; b < c.block_count(); ++b)
      if (pieces(c, b, t) < t) n += c.block_size(b) * (c.in + (c.bias ? 1 : 0));
    return n;
  }

  // Backward when some output features are shared with other ranks: this microbatch's weight and
  // bias gradients go to scratch; the shared blocks' are summed over the group (every rank puts
  // its piece at that piece's place in the whole blocks, zeros elsewhere, so the sum at a place
  // is over the ranks holding it), then all are added to the parameters' gradients.
  void backward_shared(T* dinp, const T* dy, const T* x) {
    auto& p = scope_.params();
    auto& ledger = scope_.ledger();
    const int t = scope_.tensor().degree();
    const std::int64_t in = in_local_,
                       shared_rows = shared_gradient_elements(cfg_, t) / (cfg_.in + (cfg_.bias ? 1 : 0));
    buffer<T> dw(ledger, memory_category::activations, std::size_t(out_local_ * in));
    buffer<T> db(ledger, memory_category::activations, std::size_t(cfg_.bias ? out_local_ : 0));
    buffer<T> whole_w(ledger, memory_category::activations, std::size_t(shared_rows * in));
    buffer<T> whole_b(ledger, memory_category::activations, std::size_t(cfg_.bias ? shared_rows : 0));
    kernels::linear_backward(device{}, scope_.workspace(), dinp, dw.data(), cfg_.bias ? db.data() : nullptr, dy, x,
                             p.weights(weight_), rows_, in, out_local_);
    // (this rank's first feature of a shared piece, its row in the whole blocks, how many)
    std::vector<std::array<std::int64_t, 3>> runs;
    std::int64_t local = 0, row = 0;
    for (int b = 0; b < cfg_.block_count(); ++b) {
      const std::int64_t piece = weight_shard_.block_size(b) / weight_shard_.pieces(b);
      if (weight_shard_.pieces(b) < t) {
        runs.push_back({local, row + weight_shard_.piece_index(b) * piece, piece});
        row += weight_shard_.block_size(b);
      }
      local += piece;
    }
    for (const auto& [from, to, n] : runs) {
      whole_w.copy_within(dw.data() + from * in, std::size_t(n * in), std::size_t(to * in));
      if (cfg_.bias) whole_b.copy_within(db.data() + from, std::size_t(n), std::size_t(to));
    }
    scope_.tensor().sum_over_group(std::span<T>(whole_w.data(), whole_w.size()));
    if (cfg_.bias) scope_.tensor().sum_over_group(std::span<T>(whole_b.data(), whole_b.size()));
    for (const auto& [from, to, n] : runs) {
      dw.copy_within(whole_w.data() + to * in, std::size_t(n * in), std::size_t(from * in));
      if (cfg_.bias) db.copy_within(whole_b.data() + to, std::size_t(n), std::size_t(from));
    }
    kernels::residual_forward(device{}, p.grads(weight_), p.grads(weight_), dw.data(), out_local_ * in);
    if (cfg_.bias) kernels::residual_forward(device{}, p.grads(bias_), p.grads(bias_), db.data(), out_local_);
  }

  module_scope<P> scope_;
  config cfg_;
  bool shared_ = false;
  tensor_shard weight_shard_;
  std::int64_t in_local_ = 0, out_local_ = 0;
  param_handle weight_, bias_;
  tensor_view<const T> input_;
  std::int64_t rows_ = 0;
  buffer<T> out_;  // the output; with GELU, the pre-activation
  buffer<T> act_;  // with GELU, the output
};

}  // namespace strata
