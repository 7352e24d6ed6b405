// strata/layers/embedding.hpp - token embedding, plus a learned position embedding unless the
// model places tokens otherwise (max_seq = 0: Llama's rotary embedding works inside attention).
//
// Shapes: tokens [B, T] (int32) -> x [B, T, C] = wte[token] (+ wpe[position]). wte is [V, C]
// and may be shared with the LM head (tied weights), which names it ("wte" under this layer's
// scope) in its config.
//
// Tensor parallel over t ranks: vocabulary-parallel. The vocabulary is padded to Vp, a multiple
// of t (padding rows start at zero and no token id reaches them), and each rank holds Vp/t rows
// of wte. A rank looks up the tokens in its rows (zeros for the rest), the pieces leave the
// tensor-parallel region summed (all-reduce, or reduce-scatter to this rank's tokens under
// sequence parallelism), and the position embedding, whole on every rank, is added after.
//
// Context parallel over cp ranks: the tokens are this rank's chunks of each sequence
// (layers/context_parallel.hpp), and each takes the position row of its absolute position.
//
// Generation (layers/cached_forward.hpp): forward_cached looks up the new tokens and adds the
// position rows of their absolute positions, step.pos onwards.
#pragma once
#include <cstdint>

#include "strata/core/profile.hpp"
#include "strata/core/tensor.hpp"
#include "strata/kernels/embedding.hpp"
#include "strata/layers/cached_forward.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/module.hpp"
#include "strata/layers/tensor_parallel.hpp"

namespace strata {

template <class P>
class embedding {
 public:
  using policy = P;
  using T = typename P::storage;

  struct config {
    std::int64_t vocab = 0;
    std::int64_t max_seq = 0;  // rows of the position table; 0: no position table
    std::int64_t channels = 0;
    double init_std = 0.02;
  };

  // The vocabulary rounded up to a multiple of the tensor-parallel degree.
  static constexpr std::int64_t padded_vocab(const config& c, int degree) {
    return (c.vocab + degree - 1) / degree * degree;
  }
  // The positions a sequence may reach: the position table's rows (0: no table, no limit).
  static constexpr std::int64_t max_positions(const config& c) { return c.max_seq; }
  // The vocabulary is padded, so any degree splits it: nothing to divide.
  static constexpr tensor_extent_list tensor_extents(const config&) { return {}; }
  // Keeps its output and the token ids; its rows of the table leave the region summed.
  static constexpr layer_cost cost(const config& c, const cost_scope& s) {
    const std::int64_t rows = s.rows(), t = s.tp.degree, bytes = static_cast<std::int64_t>(sizeof(T));
    layer_cost r;
    r.params = (padded_vocab(c, int(t)) / t + c.max_seq) * c.channels;
    r.forward_flops = rows * c.channels;
    r.backward_flops = 2 * rows * c.channels;
    r.output_bytes = s.local_rows() * c.channels * bytes;
    r.activation_bytes = r.output_bytes + rows * 4;
    // Token and position rows in, their sum out; backward adds dy into both tables' rows.
    r.memory_forward_bytes = r.memory_backward_bytes = double(3 * rows * c.channels * bytes);
    if (t > 1) {
      r.tensor_forward_bytes = tensor_edge_bytes::leave_forward(s.tp, double(rows * c.channels * bytes));
      r.tensor_backward_bytes = tensor_edge_bytes::leave_backward(s.tp, double(rows * c.channels * bytes));
    }
    // Under sequence parallelism every token's rows before the reduce-scatter, and every token's
    // output gradient (gathered) in backward.
    const std::int64_t whole = s.tp.sequence_parallel ? rows * c.channels * bytes : 0;
    r.forward_peak_bytes = r.activation_bytes + whole;
    r.backward_peak_bytes = whole;
    return r;
  }

  embedding(module_scope<P> scope, const config& c) : scope_(scope), cfg_(c) {
    STRATA_CHECK(c.vocab > 0 && c.max_seq >= 0 && c.channels > 0, scope.qualify_layer(), ": vocab (", c.vocab,
                 ") and channels (", c.channels, ") must be positive and max_seq (", c.max_seq, ") not negative");
    auto& tp = scope.tensor();
    degree_ = tp.degree();
    const tensor_shard table = tensor_shard::padded_rows(c.vocab, c.channels, degree_, tp.rank());
    rows_here_ = padded_vocab(c, degree_) / degree_;
    first_row_ = rows_here_ * (degree_ > 1 ? tp.rank() : 0);
    wte_ = scope_.add_parameter("wte", table, init_rule::normal_with_std(c.init_std), true);
    if (c.max_seq > 0)
      // Its gradient comes from every token's (backward gathers them under sequence parallelism).
      wpe_ = scope_.add_parameter("wpe", {c.max_seq, c.channels}, init_rule::normal_with_std(c.init_std), true,
                                  tensor_gradient::own);
  }

  // tokens: [B, T] with T <= max_seq and every id < vocab (checked; the error names it).
  tensor_view<const T> forward(tensor_view<const std::int32_t> tokens) {
    STRATA_PROFILE("embedding.forward");
    STRATA_CHECK(tokens.shape.rank == 2, scope_.qualify("forward"), ": expected tokens [B, T], got ",
                 tokens.shape.str());
    STRATA_CHECK(!positions() || tokens.shape[1] * scope_.cp().degree() <= cfg_.max_seq, scope_.qualify("forward"),
                 ": sequence length ", tokens.shape[1] * scope_.cp().degree(),
                 " exceeds the position table (max_seq = ", cfg_.max_seq, ")");
    batch_ = tokens.shape[0];
    seq_ = tokens.shape[1];
    auto& ledger = scope_.ledger();
    const std::int64_t rows = batch_ * seq_;
    ensure_size(tokens_, ledger, memory_category::activations, rows);
    tokens_.upload(tokens.data, static_cast<std::size_t>(rows));  // token batches come from the host
    auto& p = scope_.params();
    auto& tp = scope_.tensor();
    const bool context = scope_.cp().degree() > 1;
    if (degree_ == 1 && positions() && !context) {
      ensure_size(out_, ledger, memory_category::activations, rows * cfg_.channels);
      kernels::embedding_forward(device{}, out_.data(), tokens_.data(), p.weights(wte_), p.weights(wpe_), batch_, seq_,
                                 cfg_.channels, cfg_.vocab);
      return {out_.data(), {batch_, seq_, cfg_.channels}};
    }
    STRATA_CHECK(!tp.sequence_parallel() || seq_ % degree_ == 0, scope_.qualify("embedding"),
                 ": sequence parallelism over tp=", degree_, " needs a sequence length divisible by it, got ", seq_);
    // This rank's rows of the table, the pieces summed over the group, then the positions.
    buffer<T> partial;
    buffer<T>& looked_up = tp.sequence_parallel() ? partial : out_;
    ensure_size(looked_up, ledger, memory_category::activations, rows * cfg_.channels);
    kernels::embedding_lookup_range(device{}, looked_up.data(), tokens_.data(), p.weights(wte_), rows, cfg_.channels,
                                    first_row_, rows_here_, cfg_.vocab);
    tensor_view<const T> y{out_.data(), {batch_, seq_, cfg_.channels}};
    if (degree_ > 1) y = tp.leave_forward(looked_up, {batch_, seq_, cfg_.channels}, out_, ledger);
    if (!positions()) return y;
    const std::int64_t local = y.numel() / cfg_.channels, first = tp.sequence_parallel() ? tp.rank() * local : 0;
    if (!context) {
      kernels::position_embedding_add(device{}, out_.data(), p.weights(wpe_), local, seq_, first, cfg_.channels);
      return y;
    }
    // A context rank's tokens are two chunks of each sequence: each run of positions in turn.
    scope_.cp().for_each_run(seq_, first, local, [&](std::int64_t at, std::int64_t n, std::int64_t pos) {
      kernels::position_embedding_add(device{}, out_.data() + at * cfg_.channels, p.weights(wpe_) + pos * cfg_.channels,
                                      n, n, 0, cfg_.channels);
    });
    return y;
  }

  // tokens [B, n] at positions step.pos .. step.pos + n - 1 (the model pauses any sequence split,
  // so every rank holds every token): wte[token] + wpe[position], the same sums forward makes.
  tensor_view<const T> forward_cached(tensor_view<const std::int32_t> tokens, const decode_step& step) {
    STRATA_CHECK(tokens.shape.rank == 2, scope_.qualify("forward_cached"), ": expected tokens [B, n], got ",
                 tokens.shape.str());
    STRATA_CHECK(!scope_.tensor().sequence_parallel(), scope_.qualify("forward_cached"),
                 ": runs with the sequence split paused (tensor_parallel::pause_sequence_split)");
    const std::int64_t batch = tokens.shape[0], n = tokens.shape[1], rows = batch * n;
    STRATA_CHECK(!positions() || step.pos + n <= cfg_.max_seq, scope_.qualify("forward_cached"),
                 ": generation reaches position ", step.pos + n - 1,
                 ", past the position table (max_seq = ", cfg_.max_seq, ")");
    auto& ledger = scope_.ledger();
    ensure_size(tokens_, ledger, memory_category::activations, rows);
    tokens_.upload(tokens.data, static_cast<std::size_t>(rows));
    ensure_size(out_, ledger, memory_category::activations, rows * cfg_.channels);
    auto& p = scope_.params();
    kernels::embedding_lookup_range(device{}, out_.data(), tokens_.data(), p.weights(wte_), rows, cfg_.channels,
                                    first_row_, rows_here_, cfg_.vocab);
    if (degree_ > 1) scope_.tensor().leave_forward(out_, {batch, n, cfg_.channels}, out_, ledger);
    // Row i of each sequence takes position row step.pos + i.
    if (positions())
      kernels::position_embedding_add(device{}, out_.data(), p.weights(wpe_) + step.pos * cfg_.channels, rows, n, 0,
                                      cfg_.channels);
    return {out_.data(), {batch, n, cfg_.channels}};
  }

  void backward(const buffer<T>& dout) {
    STRATA_PROFILE("embedding.backward");
    auto& tp = scope_.tensor();
    buffer<T> gathered;
    // Every token's gradient: this rank's rows of wte may be used anywhere in the batch.
    const buffer<T>& dy = tp.leave_backward(dout, gathered, scope_.ledger());
    STRATA_CHECK(static_cast<std::int64_t>(dy.size()) == batch_ * seq_ * cfg_.channels, scope_.qualify("backward"),
                 ": expected ", batch_ * seq_ * cfg_.channels, " output gradients, got ", dy.size());
    auto& p = scope_.params();
    const bool context = scope_.cp().degree() > 1;
    if (degree_ == 1 && positions() && !context) {
      kernels::embedding_backward(device{}, p.grads(wte_), p.grads(wpe_), dy.data(), tokens_.data(), batch_, seq_,
                                  cfg_.channels);
    } else {
      kernels::token_embedding_backward(device{}, p.grads(wte_), dy.data(), tokens_.data(), batch_ * seq_,
                                        cfg_.channels, first_row_, rows_here_);
      if (positions() && !context)
        kernels::position_embedding_backward(device{}, p.grads(wpe_), dy.data(), batch_, seq_, cfg_.channels);
      if (positions() && context)
        scope_.cp().for_each_run(seq_, 0, batch_ * seq_, [&](std::int64_t at, std::int64_t n, std::int64_t pos) {
          kernels::position_embedding_backward(device{}, p.grads(wpe_) + pos * cfg_.channels,
                                               dy.data() + at * cfg_.channels, 1, n, cfg_.channels);
        });
    }
    p.grad_written(wte_);
    if (positions()) p.grad_written(wpe_);
  }

  void release_activations() {
    out_ = buffer<T>();
    tokens_ = buffer<std::int32_t>();
  }

  template <class F>
  void visit_parameters(F&& f) const {
    f(wte_);
    if (positions()) f(wpe_);
  }
  param_handle token_table() const { return wte_; }
  const config& cfg() const { return cfg_; }

 private:
  using device = typename P::device;
  bool positions() const { return cfg_.max_seq > 0; }
  module_scope<P> scope_;
  config cfg_;
  param_handle wte_, wpe_;
  int degree_ = 1;
  std::int64_t rows_here_ = 0, first_row_ = 0;  // this rank's rows of the (padded) token table
  std::int64_t batch_ = 0, seq_ = 0;
  buffer<std::int32_t> tokens_;
  buffer<T> out_;
};

}  // namespace strata
