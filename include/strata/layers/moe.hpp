// strata/layers/moe.hpp - a mixture-of-experts feed-forward block: a router and E expert MLPs,
// each token through the k experts the router picks (Mixtral, Qwen3-MoE, DeepSeek).
//
//   logits = x·Wrᵀ [N, E];  p = softmax(logits);  the k largest p pick the experts, weights w =
//   those p (divided by their sum with `renormalize`);  y = Σ_s w_s · expert_{e_s}(x)
//   (+ shared(x): a SwiGLU every token goes through, when shared_hidden > 0).
// An expert is a SwiGLU MLP (gate|up [2F, C], down [C, F]) or a GELU one (fc [F, C], proj [C, F]),
// without biases. The tokens are sorted by expert (the dispatch plan), run through one grouped
// GEMM per projection, and combined back with their weights.
//
// Auxiliary terms, added to the objective and their gradients taken here (auxiliary_loss.hpp):
//   balance = mean over sequences s of E · Σ_e f[s,e] · P[s,e]: f the share of s's tokens whose
//             k experts include e, P the mean of p[:, e] over s's tokens (Switch / Mixtral form,
//             k when balanced), times balance_coef. Per sequence, so it is the same function under
//             every data-parallel split and micro-batching (a batch-wide f, as Hugging Face's
//             Mixtral computes it, changes with the split; with one sequence they agree).
//   z       = mean over tokens of logsumexp(logits)², times z_coef (ST-MoE's router z-loss).
// Dropless by default. capacity_factor c > 0 keeps at most ceil(c · T · k / E) of each
// sequence's (token, slot) pairs per expert, the earliest tokens first; the others are dropped
// (their weight contributes nothing) and counted.
//
// Statistics, one row per block and micro-batch: balance, z, dropped pairs, then the (token,
// slot) pairs each expert received (layers/moe_statistics.hpp).
//
// Layouts: parameters replicated over tensor parallelism (every rank of the group routes the
// same tokens through the same experts), the shared SwiGLU split as an ordinary feed-forward
// block. Refused, by name, at start-up: sequence parallelism, context parallelism, the CUDA device.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/profile.hpp"
#include "strata/core/tensor.hpp"
#include "strata/kernels/gelu.hpp"
#include "strata/kernels/moe.hpp"
#include "strata/kernels/residual.hpp"
#include "strata/kernels/swiglu.hpp"
#include "strata/layers/cached_forward.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/linear.hpp"
#include "strata/layers/module.hpp"
#include "strata/layers/moe_statistics.hpp"
#include "strata/layers/swiglu.hpp"

namespace strata {

enum class expert_activation { swiglu, gelu };

// The router and experts of a block; a transformer_block takes them as its ffn options.
struct moe_options {
  std::int64_t experts = 0, top_k = 2;
  std::int64_t shared_hidden = 0;  // the shared SwiGLU's width; 0: none
  bool renormalize = true;         // the k weights divided by their sum (Mixtral, Qwen3-MoE)
  double balance_coef = 0.01;      // load-balancing loss coefficient; 0: off
  double z_coef = 0.0;             // router z-loss coefficient; 0: off
  double capacity_factor = 0.0;    // 0: dropless
  expert_activation activation = expert_activation::swiglu;
};

template <class P>
class moe {
 public:
  using policy = P;
  using T = typename P::storage;
  using A = acc_t<T>;

  struct config {
    std::int64_t channels = 0, hidden = 0;  // hidden: each expert's FFN width
    double init_std = 0.02;
    double proj_init_std = 0.02;  // the experts' down projections
    moe_options options{};
  };
  using options_type = moe_options;

  static constexpr typename linear<P>::config router_config(const config& c) {
    return {.in = c.channels, .out = c.options.experts, .bias = false, .init_std = c.init_std};
  }
  static constexpr typename swiglu<P>::config shared_config(const config& c) {
    return {.channels = c.channels,
            .hidden = c.options.shared_hidden,
            .init_std = c.init_std,
            .proj_init_std = c.proj_init_std};
  }
  static constexpr bool gated(const config& c) { return c.options.activation == expert_activation::swiglu; }
  // One expert's parameters: the first projection's rows (2F gated, F otherwise) and the down's.
  static constexpr std::int64_t first_rows(const config& c) { return (gated(c) ? 2 : 1) * c.hidden; }
  static constexpr std::int64_t expert_params(const config& c) { return (first_rows(c) + c.hidden) * c.channels; }
  // Pairs of one sequence of `seq` tokens an expert keeps; 0: all (dropless).
  static constexpr std::int64_t capacity(const config& c, std::int64_t seq) {
    if (c.options.capacity_factor <= 0) return 0;
    const double want = c.options.capacity_factor * double(seq * c.options.top_k) / double(c.options.experts);
    const auto whole = static_cast<std::int64_t>(want);
    return whole < want ? whole + 1 : whole;
  }

  static constexpr tensor_extent_list tensor_extents(const config& c) {
    if (c.options.shared_hidden > 0) return swiglu<P>::tensor_extents(shared_config(c));
    return {};
  }

  // Router (its logits kept), the routing (p, logsumexp, choices, weights, the dispatch plan,
  // the per-sequence statistics), then per (token, slot) pair: the permuted input, the first
  // projection's output, the activation and the expert's output; the combined output. Parameters
  // a token does not use: the E - k experts it is not routed to.
  static constexpr layer_cost cost(const config& c, const cost_scope& s) {
    const std::int64_t n = s.rows(), E = c.options.experts, k = c.options.top_k, C = c.channels, F = c.hidden;
    const std::int64_t pairs = n * k, st = sizeof(T), sa = sizeof(A), si = sizeof(std::int32_t), s64 = 8;
    layer_cost routing;
    routing.forward_flops = 4 * n * E;
    routing.backward_flops = 2 * routing.forward_flops;
    routing.activation_bytes =
        n * E * sa + n * sa + pairs * (2 * si + sa) + pairs * si + (2 * E + 1) * s64 + s.batch * (2 * E + 1) * sa;
    layer_cost experts;
    experts.params = E * expert_params(c);
    experts.idle_params = (E - k) * expert_params(c);
    experts.forward_flops = 2 * pairs * C * (first_rows(c) + F) + (gated(c) ? 4 : 8) * pairs * F + 2 * pairs * C;
    experts.backward_flops = 2 * experts.forward_flops;
    experts.output_bytes = n * C * st;
    experts.activation_bytes = pairs * (C + first_rows(c) + F + C) * st + experts.output_bytes;
    layer_cost r = linear<P>::cost(router_config(c), s).then(routing).then(experts);
    if (c.options.shared_hidden > 0) r = r + swiglu<P>::cost(shared_config(c), s);
    r.output_bytes = experts.output_bytes;
    return r;
  }

  moe(module_scope<P> scope, const config& c)
      : scope_(scope), cfg_(validated(scope, c)), router_(scope / "router", router_config(c)) {
    const auto experts = scope / "experts";
    for (std::int64_t e = 0; e < c.options.experts; ++e) {
      const auto one = experts / static_cast<int>(e);
      first_.push_back(
          (one / (gated(c) ? "gate_up" : "fc"))
              .add_parameter("weight", shape{first_rows(c), c.channels}, init_rule::normal_with_std(c.init_std), true));
      down_.push_back(
          (one / (gated(c) ? "down" : "proj"))
              .add_parameter("weight", shape{c.channels, c.hidden}, init_rule::normal_with_std(c.proj_init_std), true));
    }
    if (c.options.shared_hidden > 0) shared_.emplace(scope / "shared", shared_config(c));
  }

  tensor_view<const T> forward(tensor_view<const T> x) {
    STRATA_PROFILE("moe.forward");
    const auto& o = cfg_.options;
    STRATA_CHECK(x.shape.rank == 3 && x.shape[2] == cfg_.channels, scope_.qualify("forward"),
                 ": expected [batch, seq, ", cfg_.channels, "], got ", x.shape.str());
    batch_ = x.shape[0];
    seq_ = x.shape[1];
    rows_ = batch_ * seq_;
    input_ = x;
    grad_scale_ = scope_.context().auxiliary().grad_scale();
    const std::int64_t E = o.experts, k = o.top_k, C = cfg_.channels, F = cfg_.hidden, pairs = rows_ * k;
    auto& ledger = scope_.ledger();
    constexpr auto act = memory_category::activations;

    auto logits = router_.forward(x);
    ensure_size(probs_, ledger, act, rows_ * E);
    ensure_size(lse_, ledger, act, rows_);
    ensure_size(choice_, ledger, act, pairs);
    ensure_size(weight_, ledger, act, pairs);
    ensure_size(slot_row_, ledger, act, pairs);
    ensure_size(row_token_, ledger, act, pairs);
    ensure_size(offsets_, ledger, act, E + 1);
    ensure_size(dropped_, ledger, act, E);
    ensure_size(stats_, ledger, act, batch_ * (2 * E + 1));
    kernels::moe_route_forward(device{}, probs_.data(), lse_.data(), choice_.data(), weight_.data(), logits.data, rows_,
                               E, k, o.renormalize);
    kernels::moe_sequence_stats(device{}, stats_.data(), probs_.data(), lse_.data(), choice_.data(), rows_, seq_, E, k);
    kernels::moe_dispatch_plan(device{}, offsets_.data(), slot_row_.data(), row_token_.data(), dropped_.data(),
                               choice_.data(), rows_, k, E, seq_, generating_ ? 0 : capacity(cfg_, seq_));
    offsets_.download(&kept_, 1, std::size_t(E));

    ensure_size(permuted_, ledger, act, pairs * C);
    ensure_size(first_out_, ledger, act, pairs * first_rows(cfg_));
    ensure_size(hidden_, ledger, act, pairs * F);
    ensure_size(expert_out_, ledger, act, pairs * C);
    ensure_size(out_, ledger, act, rows_ * C);
    kernels::moe_permute_forward(device{}, permuted_.data(), x.data, row_token_.data(), kept_, C);
    experts_forward(first_, first_out_.data(), permuted_.data(), C, first_rows(cfg_));
    experts_forward(down_, expert_out_.data(), activate(), F, C);
    kernels::moe_combine_forward(device{}, out_.data(), expert_out_.data(), weight_.data(), slot_row_.data(), rows_, k,
                                 C);
    if (shared_) {
      auto s = shared_->forward(x);
      kernels::residual_forward(device{}, out_.data(), out_.data(), s.data, rows_ * C);
    }
    return {out_.data(), x.shape};
  }

  // Generation: the new tokens through their experts, dropless whatever the capacity (a capacity
  // is a training budget over whole sequences; a step's new tokens are none). Nothing is cached.
  tensor_view<const T> forward_cached(tensor_view<const T> x, const decode_step&) {
    generating_ = true;
    const auto y = forward(x);
    generating_ = false;
    return y;
  }
  void release_cache() {}

  buffer<T> backward(const buffer<T>& dout) {
    STRATA_PROFILE("moe.backward");
    const auto& o = cfg_.options;
    const std::int64_t E = o.experts, k = o.top_k, C = cfg_.channels, F = cfg_.hidden, pairs = rows_ * k;
    STRATA_CHECK(static_cast<std::int64_t>(dout.size()) == rows_ * C, scope_.qualify("backward"), ": expected ",
                 rows_ * C, " output gradients, got ", dout.size());
    auto& ledger = scope_.ledger();
    auto& p = scope_.params();
    constexpr auto act = memory_category::activations;

    buffer<T> dexpert(ledger, act, std::size_t(pairs * C), uninitialized);
    buffer<A> dweight(ledger, act, std::size_t(pairs), uninitialized);
    kernels::moe_combine_backward(device{}, dexpert.data(), dweight.data(), dout.data(), expert_out_.data(),
                                  weight_.data(), slot_row_.data(), rows_, k, C);
    buffer<T> dhidden(ledger, act, std::size_t(pairs * F), uninitialized);
    experts_backward(down_, dhidden.data(), dexpert.data(), hidden_.data(), F, C);
    buffer<T> dfirst(ledger, act, std::size_t(pairs * first_rows(cfg_)), uninitialized);
    if (gated(cfg_)) kernels::swiglu_backward(device{}, dfirst.data(), dhidden.data(), first_out_.data(), kept_, F);
    else kernels::gelu_backward(device{}, dfirst.data(), first_out_.data(), dhidden.data(), kept_ * F);
    buffer<T> dpermuted(ledger, act, std::size_t(pairs * C), uninitialized);
    experts_backward(first_, dpermuted.data(), dfirst.data(), permuted_.data(), C, first_rows(cfg_));
    for (std::size_t e = 0; e < first_.size(); ++e) {
      p.grad_written(first_[e]);
      p.grad_written(down_[e]);
    }
    buffer<T> dx(ledger, act, std::size_t(rows_ * C), uninitialized);
    kernels::moe_permute_backward(device{}, dx.data(), dpermuted.data(), slot_row_.data(), rows_, k, C);

    // The router: the weights' gradient, and the auxiliary terms' (report them once, here).
    const auto balance_grad = balance_gradient();
    const A dlse_per_lse = A(grad_scale_ * o.z_coef * 2.0 / double(rows_));
    buffer<T> dlogits(ledger, act, std::size_t(rows_ * E), uninitialized);
    kernels::moe_route_backward(device{}, dlogits.data(), dweight.data(),
                                o.balance_coef > 0 ? balance_grad.data() : nullptr, seq_,
                                o.z_coef > 0 ? dlse_per_lse : A(0), probs_.data(), lse_.data(), choice_.data(),
                                weight_.data(), rows_, E, k, o.renormalize);
    report();
    buffer<T> drouter = router_.backward(dlogits);
    kernels::residual_forward(device{}, dx.data(), dx.data(), drouter.data(), rows_ * C);
    if (shared_) {
      buffer<T> dshared = shared_->backward(dout);
      kernels::residual_forward(device{}, dx.data(), dx.data(), dshared.data(), rows_ * C);
    }
    return dx;
  }

  void release_activations() {
    router_.release_activations();
    if (shared_) shared_->release_activations();
    for (auto* b : {&probs_, &lse_, &weight_, &stats_}) *b = buffer<A>();
    for (auto* b : {&choice_, &slot_row_, &row_token_}) *b = buffer<std::int32_t>();
    offsets_ = buffer<std::int64_t>();
    dropped_ = buffer<std::int64_t>();
    for (auto* b : {&permuted_, &first_out_, &hidden_, &expert_out_, &out_}) *b = buffer<T>();
  }

  template <class Fn>
  void visit_parameters(Fn&& f) const {
    router_.visit_parameters(f);
    for (std::size_t e = 0; e < first_.size(); ++e) {
      f(first_[e]);
      f(down_[e]);
    }
    if (shared_) shared_->visit_parameters(f);
  }
  const config& cfg() const { return cfg_; }

  // This micro-batch's statistics (host memory): balance and z before their coefficients, pairs
  // dropped, pairs per expert. What backward reports.
  std::vector<double> statistics() const {
    const std::int64_t E = cfg_.options.experts;
    std::vector<double> row(std::size_t(moe_row_tokens + E), 0.0);
    std::vector<A> st(stats_.size());
    stats_.download(st.data(), st.size());
    double balance = 0, zsum = 0;
    for (std::int64_t b = 0; b < batch_; ++b) {
      const A* s = st.data() + b * (2 * E + 1);
      double seq_balance = 0;
      for (std::int64_t e = 0; e < E; ++e) {
        seq_balance += double(s[E + e]) / double(seq_) * double(s[e]) / double(seq_);
        row[std::size_t(moe_row_tokens + e)] += double(s[E + e]);
      }
      balance += double(E) * seq_balance / double(batch_);
      zsum += double(s[2 * E]);
    }
    std::vector<std::int64_t> dropped(static_cast<std::size_t>(E), 0);
    dropped_.download(dropped.data(), dropped.size());
    row[moe_row_balance] = balance;
    row[moe_row_z] = zsum / double(rows_);
    for (const std::int64_t d : dropped) row[moe_row_dropped] += double(d);
    return row;
  }

 private:
  using device = typename P::device;

  static const config& validated(const module_scope<P>& scope, const config& c) {
    const auto& o = c.options;
    STRATA_CHECK(c.channels > 0 && c.hidden > 0, scope.qualify_layer(), ": channels (", c.channels, ") and hidden (",
                 c.hidden, ") must be positive");
    STRATA_CHECK(o.experts >= 1 && o.top_k >= 1 && o.top_k <= o.experts, scope.qualify_layer(), ": top_k (", o.top_k,
                 ") must be between 1 and the experts (", o.experts, ")");
    STRATA_CHECK(o.balance_coef >= 0 && o.z_coef >= 0 && o.capacity_factor >= 0 && o.shared_hidden >= 0,
                 scope.qualify_layer(), ": balance_coef (", o.balance_coef, "), z_coef (", o.z_coef,
                 "), capacity_factor (", o.capacity_factor, ") and shared_hidden (", o.shared_hidden,
                 ") must not be negative");
    STRATA_CHECK(!scope.tensor().split().sequence_parallel, scope.qualify_layer(),
                 ": a mixture of experts under sequence parallelism is not supported yet (its router statistics "
                 "would be partial over the tensor group); run tensor parallelism without --sp");
    STRATA_CHECK(scope.cp().degree() == 1, scope.qualify_layer(),
                 ": a mixture of experts under context parallelism (cp=", scope.cp().degree(),
                 ") is not supported yet (its per-sequence statistics would be split over the context group)");
    if constexpr (!std::is_same_v<typename P::device, host>)
      fail(scope.qualify_layer(), ": the mixture-of-experts kernels run on the host only so far");
    scope.check_tensor_extents(tensor_extents(c));
    return c;
  }

  // One projection of every expert over the kept pairs: one grouped GEMM where the weights stay
  // put, one expert at a time where they are gathered on demand (ZeRO-3 holds a few buckets at
  // once, and E experts' weights may span more).
  void experts_forward(const std::vector<param_handle>& hs, T* y, const T* x, std::int64_t in, std::int64_t out) {
    auto& p = scope_.params();
    auto& ws = scope_.workspace();
    const std::int64_t E = cfg_.options.experts;
    if (p.weights_resident()) {
      std::vector<const T*> w;
      for (const param_handle h : hs) w.push_back(p.weights(h));
      kernels::grouped_linear_forward(device{}, ws, y, x, w.data(), offsets_.data(), E, in, out);
      return;
    }
    for (std::int64_t e = 0; e < E; ++e) {
      const T* w = p.weights(hs[std::size_t(e)]);
      kernels::grouped_linear_forward(device{}, ws, y, x, &w, offsets_.data() + e, 1, in, out);
    }
  }
  void experts_backward(const std::vector<param_handle>& hs, T* dx, const T* dy, const T* x, std::int64_t in,
                        std::int64_t out) {
    auto& p = scope_.params();
    auto& ws = scope_.workspace();
    const std::int64_t E = cfg_.options.experts;
    if (p.weights_resident()) {
      std::vector<const T*> w;
      std::vector<T*> g;
      for (const param_handle h : hs) {
        w.push_back(p.weights(h));
        g.push_back(p.grads(h));
      }
      kernels::grouped_linear_backward(device{}, ws, dx, g.data(), dy, x, w.data(), offsets_.data(), E, in, out);
      return;
    }
    for (std::int64_t e = 0; e < E; ++e) {
      const T* w = p.weights(hs[std::size_t(e)]);
      T* g = p.grads(hs[std::size_t(e)]);
      kernels::grouped_linear_backward(device{}, ws, dx, &g, dy, x, &w, offsets_.data() + e, 1, in, out);
    }
  }
  // The experts' activation on the kept pairs (its input stays, for backward): the down
  // projection's input.
  const T* activate() {
    if (gated(cfg_)) kernels::swiglu_forward(device{}, hidden_.data(), first_out_.data(), kept_, cfg_.hidden);
    else kernels::gelu_forward(device{}, hidden_.data(), first_out_.data(), kept_ * cfg_.hidden);
    return hidden_.data();
  }

  // d objective / d p for every token of sequence s: balance_coef · E · f[s,e] / (B · T), f the
  // share of s's tokens routed to e, times the step's gradient scale.
  std::vector<A> balance_gradient() const {
    const std::int64_t E = cfg_.options.experts;
    std::vector<A> st(stats_.size());
    stats_.download(st.data(), st.size());
    std::vector<A> g(std::size_t(batch_ * E));
    const double c =
        grad_scale_ * cfg_.options.balance_coef * double(E) / (double(batch_) * double(seq_) * double(seq_));
    for (std::int64_t b = 0; b < batch_; ++b)
      for (std::int64_t e = 0; e < E; ++e)
        g[std::size_t(b * E + e)] = A(c * double(st[std::size_t(b * (2 * E + 1) + E + e)]));
    return g;
  }
  void report() {
    const std::vector<double> row = statistics();
    auto& aux = scope_.context().auxiliary();
    aux.add_objective(cfg_.options.balance_coef * row[moe_row_balance] + cfg_.options.z_coef * row[moe_row_z]);
    if (scope_.block() >= 0) aux.add_row(scope_.block(), scope_.context().block_count(), row, moe_row_dropped);
  }

  module_scope<P> scope_;
  config cfg_;
  linear<P> router_;
  std::vector<param_handle> first_, down_;
  std::optional<swiglu<P>> shared_;
  tensor_view<const T> input_;
  std::int64_t batch_ = 0, seq_ = 0, rows_ = 0, kept_ = 0;
  double grad_scale_ = 1.0;
  bool generating_ = false;
  buffer<A> probs_, lse_, weight_, stats_;
  buffer<std::int32_t> choice_, slot_row_, row_token_;
  buffer<std::int64_t> offsets_, dropped_;
  buffer<T> permuted_, first_out_, hidden_, expert_out_, out_;
};

}  // namespace strata
