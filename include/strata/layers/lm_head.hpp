// strata/layers/lm_head.hpp - the language-model head with its loss.
//
// x [B, T, C] -> logits = x·Wᵀ [B, T, V] -> mean cross-entropy against targets [B, T].
// The softmax and the loss are fused: the logits buffer is overwritten with dloss/dlogits in
// the same pass, so no probability buffer ever exists. W is either the head's own [V, C]
// matrix or, with config.tied_to naming it, another layer's table (GPT-2 ties the head to the
// token embedding's "wte").
//
// Tensor parallel over t ranks: vocabulary-parallel, over the same padded rows as the embedding
// (Vp/t each). The head enters a tensor-parallel region like a column-parallel layer (under
// sequence parallelism it gathers the tokens, and gathers them again in backward), computes its
// [B·T, Vp/t] logits, and the loss comes from three small all-reduces per row (max, then the
// sum of exponentials with the target's logit): the full logits are never gathered. Padding
// columns take no part in the softmax and get zero gradient.
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "strata/core/profile.hpp"
#include "strata/core/tensor.hpp"
#include "strata/kernels/cross_entropy.hpp"
#include "strata/kernels/linear.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/module.hpp"
#include "strata/layers/tensor_parallel.hpp"

namespace strata {

template <class P>
class lm_head {
 public:
  using policy = P;
  using T = typename P::storage;
  using A = typename P::accumulate;

  struct config {
    std::int64_t vocab = 0, channels = 0;
    double init_std = 0.02;
    std::string_view tied_to{};  // the absolute name of a [V, C] table to share ("wte"); empty: own
  };

  // The vocabulary rounded up to a multiple of the degree, and a rank's share of it.
  static constexpr std::int64_t padded_vocab(const config& c, int degree) {
    return (c.vocab + degree - 1) / degree * degree;
  }
  static constexpr std::int64_t local_vocab(const config& c, int degree) { return padded_vocab(c, degree) / degree; }
  // The vocabulary is padded, so any degree splits it.
  static constexpr tensor_extent_list tensor_extents(const config&) { return {}; }
  static constexpr std::string_view tied_parameter(const config& c) { return c.tied_to; }
  // The GEMM, the fused softmax and loss; keeps the logits (then their gradient), the per-position
  // losses and the targets. Under tensor parallelism it enters a region like a column-parallel
  // layer and the loss takes three all-reduces of one value per row (max; sum and target logit).
  static constexpr layer_cost cost(const config& c, const cost_scope& s) {
    const int t = s.tp.degree;
    const std::int64_t rows = s.rows(), vl = local_vocab(c, t), bytes = static_cast<std::int64_t>(sizeof(T));
    layer_cost r;
    (c.tied_to.empty() ? r.params : r.tied_params) = vl * c.channels;
    r.forward_flops = 2 * rows * c.channels * vl + 5 * rows * vl;
    r.backward_flops = 4 * rows * c.channels * vl;
    add_linear_gemms(r.forward_gemms, r.backward_gemms, rows, c.channels, vl);
    // The loss reads the logits twice (maximum, then the sum of exponentials); backward reads
    // them again and writes their gradient.
    r.memory_forward_bytes = r.memory_backward_bytes = double(2 * rows * vl * bytes);
    r.activation_bytes = rows * vl * bytes + rows * static_cast<std::int64_t>(sizeof(A)) + rows * 4;
    // The input gathered under sequence parallelism (beside the logits in forward; again in
    // backward, beside the input gradient of every token and this rank's tokens' share of it).
    const std::int64_t gathered = s.tp.sequence_parallel ? rows * c.channels * bytes : 0;
    r.forward_peak_bytes = layer_cost::max_of(r.activation_bytes, gathered + rows * vl * bytes);
    const std::int64_t mine = s.tp.sequence_parallel ? s.tp.local_rows(rows) * c.channels * bytes : 0;
    r.backward_peak_bytes = rows * c.channels * bytes + gathered + mine;
    if (t > 1) {
      const double input = double(rows * c.channels * bytes);
      r.tensor_forward_bytes = tensor_edge_bytes::enter_forward(s.tp, input) +
                               ring_all_reduce_bytes(double(3 * rows * static_cast<std::int64_t>(sizeof(A))), t);
      r.tensor_backward_bytes =
          tensor_edge_bytes::enter_backward(s.tp, input) + tensor_edge_bytes::enter_forward(s.tp, input);
    }
    return r;
  }

  lm_head(module_scope<P> scope, const config& c) : scope_(scope), cfg_(c) {
    STRATA_CHECK(c.vocab > 0 && c.channels > 0, scope_.qualify_layer(), ": vocab (", c.vocab, ") and channels (",
                 c.channels, ") must be positive");
    auto& tp = scope.tensor();
    degree_ = tp.degree();
    const tensor_shard table = tensor_shard::padded_rows(c.vocab, c.channels, degree_, tp.rank());
    const auto init = init_rule::normal_with_std(c.init_std);
    tied_ = !c.tied_to.empty();
    weight_ =
        tied_ ? scope_.tied_parameter(c.tied_to, table, init, true) : scope_.add_parameter("weight", table, init, true);
  }

  // Mean loss over all positions; also leaves d(loss·loss_scale)/dlogits for backward.
  // `loss_scale` multiplies the gradient only (micro-batch averaging, fp16 loss scaling).
  double forward(tensor_view<const T> x, tensor_view<const std::int32_t> targets, double loss_scale = 1.0) {
    compute_logits(x);
    STRATA_PROFILE("cross_entropy");
    const strata::shape expected{batch_, seq_};
    STRATA_CHECK(targets.shape == expected, scope_.qualify("forward"), ": expected targets ", expected.str(), ", got ",
                 targets.shape.str());
    const std::int64_t rows = batch_ * seq_;
    auto& ledger = scope_.ledger();
    ensure_size(losses_, ledger, memory_category::activations, rows);
    ensure_size(targets_, ledger, memory_category::activations, rows);
    targets_.upload(targets.data, static_cast<std::size_t>(rows));  // targets come from the host
    if (degree_ == 1)
      kernels::cross_entropy_forward_backward(device{}, losses_.data(), logits_.data(), targets_.data(), rows,
                                              cfg_.vocab, cfg_.vocab, static_cast<A>(loss_scale / double(rows)));
    else vocab_parallel_loss(targets_.data(), logits_.data(), static_cast<A>(loss_scale / double(rows)));
    return mean_loss(rows);
  }

  // Mean loss without keeping gradients (evaluation).
  double evaluate(tensor_view<const T> x, tensor_view<const std::int32_t> targets) {
    compute_logits(x);
    const std::int64_t rows = batch_ * seq_;
    STRATA_CHECK(targets.numel() == rows, scope_.qualify("evaluate"), ": expected ", rows, " targets, got ",
                 targets.numel());
    ensure_size(losses_, scope_.ledger(), memory_category::activations, rows);
    ensure_size(targets_, scope_.ledger(), memory_category::activations, rows);
    targets_.upload(targets.data, static_cast<std::size_t>(rows));
    if (degree_ == 1)
      kernels::cross_entropy_forward(device{}, losses_.data(), logits_.data(), targets_.data(), rows, cfg_.vocab,
                                     cfg_.vocab);
    else vocab_parallel_loss(targets_.data(), nullptr, A(0));
    return mean_loss(rows);
  }

  // Logits [B, T, V] for sampling; valid until the next call. Under tensor parallelism they are
  // gathered from every rank (sampling only: training never does this).
  tensor_view<const T> logits(tensor_view<const T> x) {
    compute_logits(x);
    if (degree_ == 1) return {logits_.data(), {batch_, seq_, cfg_.vocab}};
    const std::int64_t rows = batch_ * seq_, vl = local_vocab(cfg_, degree_);
    buffer<T> pieces(scope_.ledger(), memory_category::communication,
                     static_cast<std::size_t>(rows * padded_vocab(cfg_, degree_)));
    scope_.tensor().group().all_gather(std::span<const T>(logits_.data(), logits_.size()),
                                       std::span<T>(pieces.data(), pieces.size()));
    ensure_size(whole_logits_, scope_.ledger(), memory_category::activations, rows * cfg_.vocab);
    // Rank q's piece is [rows, vl]: row i's columns q·vl ... go to row i of the whole logits
    // (copies within the run's memory, which the host may not read), padding columns dropped.
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t q = 0; q * vl < cfg_.vocab; ++q)
        whole_logits_.copy_within(pieces.data() + q * rows * vl + i * vl,
                                  static_cast<std::size_t>(std::min(vl, cfg_.vocab - q * vl)),
                                  static_cast<std::size_t>(i * cfg_.vocab + q * vl));
    return {whole_logits_.data(), {batch_, seq_, cfg_.vocab}};
  }

  // dx [B, T, C] (this rank's [B, T/t, C] under sequence parallelism) from the gradient
  // forward() left; accumulates into W's gradient.
  buffer<T> backward() {
    STRATA_PROFILE("lm_head.backward");
    const std::int64_t rows = batch_ * seq_;
    auto& ledger = scope_.ledger();
    auto& tp = scope_.tensor();
    buffer<T> dx(ledger, memory_category::activations, static_cast<std::size_t>(rows * cfg_.channels), uninitialized);
    auto& p = scope_.params();
    buffer<T> gathered;
    const T* x = tp.enter_forward(input_, gathered, ledger).data;
    kernels::linear_backward(device{}, scope_.workspace(), dx.data(), p.grads(weight_), static_cast<T*>(nullptr),
                             logits_.data(), x, p.weights(weight_), rows, cfg_.channels, local_vocab(cfg_, degree_));
    p.grad_written(weight_);
    return tp.enter_backward(std::move(dx), ledger);
  }

  void release_activations() {
    logits_ = buffer<T>();
    whole_logits_ = buffer<T>();
    losses_ = buffer<A>();
    targets_ = buffer<std::int32_t>();
  }

  template <class F>
  void visit_parameters(F&& f) const {
    if (!tied_) f(weight_);
  }
  bool tied() const { return tied_; }
  const config& cfg() const { return cfg_; }

 private:
  using device = typename P::device;

  void compute_logits(tensor_view<const T> x) {
    STRATA_PROFILE("lm_head.forward");
    STRATA_CHECK(x.shape.rank == 3 && x.shape[2] == cfg_.channels, scope_.qualify("forward"),
                 ": expected input [B, T, ", cfg_.channels, "], got ", x.shape.str());
    input_ = x;
    buffer<T> gathered;
    auto whole = scope_.tensor().enter_forward(x, gathered, scope_.ledger());
    batch_ = whole.shape[0];
    seq_ = whole.shape[1];
    const std::int64_t vl = local_vocab(cfg_, degree_);
    ensure_size(logits_, scope_.ledger(), memory_category::activations, batch_ * seq_ * vl);
    auto& p = scope_.params();
    kernels::linear_forward(device{}, scope_.workspace(), logits_.data(), whole.data, p.weights(weight_),
                            static_cast<const T*>(nullptr), batch_ * seq_, cfg_.channels, vl);
  }
  // The loss of every position from this rank's logits and two all-reduces; with `dlogits`
  // (the logits buffer) also its gradient.
  void vocab_parallel_loss(const std::int32_t* targets, T* dlogits, A dloss) {
    const std::int64_t rows = batch_ * seq_, vl = local_vocab(cfg_, degree_), first = vl * scope_.tensor().rank();
    auto& group = scope_.tensor().group();
    buffer<A> row_max(scope_.ledger(), memory_category::communication, static_cast<std::size_t>(rows));
    buffer<A> sums(scope_.ledger(), memory_category::communication, static_cast<std::size_t>(2 * rows));
    kernels::vocab_parallel_max(device{}, row_max.data(), logits_.data(), targets, rows, vl, first, cfg_.vocab);
    group.all_reduce(std::span<A>(row_max.data(), row_max.size()), reduce_op::max);
    kernels::vocab_parallel_sums(device{}, sums.data(), logits_.data(), row_max.data(), targets, rows, vl, first,
                                 cfg_.vocab);
    group.all_reduce(std::span<A>(sums.data(), sums.size()));
    kernels::vocab_parallel_finish(device{}, losses_.data(), dlogits, row_max.data(), sums.data(), targets, rows, vl,
                                   first, cfg_.vocab, dloss);
  }
  double mean_loss(std::int64_t rows) const {
    std::vector<A> losses(static_cast<std::size_t>(rows));
    losses_.download(losses.data(), losses.size());
    double sum = 0;  // sequential: the same loss bit for bit on every run
    for (const A l : losses) sum += static_cast<double>(l);
    return sum / static_cast<double>(rows);
  }

  module_scope<P> scope_;
  config cfg_;
  int degree_ = 1;
  param_handle weight_;
  bool tied_ = false;
  tensor_view<const T> input_;
  std::int64_t batch_ = 0, seq_ = 0;
  buffer<T> logits_, whole_logits_;
  buffer<A> losses_;
  buffer<std::int32_t> targets_;
};

}  // namespace strata
