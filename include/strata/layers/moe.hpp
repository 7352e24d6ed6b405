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
// block. Under sequence parallelism a rank's tokens are gathered over the tensor group first
// (and the output gradients in backward), so every rank runs the whole micro-batch as without
// it - whole sequences for the per-sequence statistics and the capacity, the same gradients on
// every rank - and keeps its own rows of the output and of the input gradient. Expert parallelism (the scope's expert
// group of ep ranks): a rank holds experts [r·E/ep, (r+1)·E/ep), named as in the serial model. Each rank routes its own
// tokens; the sorted pairs of each expert travel to its rank (an all-to-all of the per-expert counts, then an
// all_to_all_v of the rows), are regrouped there expert by expert for the grouped GEMMs, and go
// back the same way; backward sends the output gradients along the same path. Refused by the table
// of supported combinations (policy/support.hpp), at compile time where the policy fixes it and
// at start-up otherwise: context parallelism, the CUDA device.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
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
#include "strata/layers/tensor_parallel.hpp"
#include "strata/layers/swiglu.hpp"
#include "strata/policy/support.hpp"

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
  // a token does not use: the E - k experts it is not routed to. Under expert parallelism (ep > 1)
  // the rank holds E/ep experts and, routing taken as even (each rank's experts run as many
  // pairs as it routes), also keeps the arrived rows and the two row maps; it sends a share
  // (ep-1)/ep of its pairs' rows out and as many back, forward and backward, and the counts once.
  static constexpr layer_cost cost(const config& c, const cost_scope& s) {
    const std::int64_t n = s.rows(), E = c.options.experts, k = c.options.top_k, C = c.channels, F = c.hidden;
    const std::int64_t L = E / s.ep;
    const std::int64_t pairs = n * k, st = sizeof(T), sa = sizeof(A), si = sizeof(std::int32_t), s64 = 8;
    layer_cost routing;
    routing.forward_flops = 4 * n * E;
    routing.backward_flops = 2 * routing.forward_flops;
    routing.activation_bytes =
        n * E * sa + n * sa + pairs * (2 * si + sa) + pairs * si + (2 * E + 1) * s64 + s.batch * (2 * E + 1) * sa;
    layer_cost experts;
    experts.params = L * expert_params(c);
    experts.idle_params = std::max<std::int64_t>(L - k, 0) * expert_params(c);
    experts.forward_flops = 2 * pairs * C * (first_rows(c) + F) + (gated(c) ? 4 : 8) * pairs * F + 2 * pairs * C;
    experts.backward_flops = 2 * experts.forward_flops;
    // Each of this rank's L experts takes pairs/L rows under even routing: its two products,
    // and the activation between them (read the first's output, write the second's input).
    if (L > 0) {
      const std::int64_t rows_each = pairs / L;
      add_linear_gemms(experts.forward_gemms, experts.backward_gemms, rows_each, C, first_rows(c), L);
      add_linear_gemms(experts.forward_gemms, experts.backward_gemms, rows_each, F, C, L);
    }
    experts.memory_forward_bytes = double(pairs * (first_rows(c) + F + 2 * C) * st);
    experts.memory_backward_bytes = 2 * experts.memory_forward_bytes;
    experts.output_bytes = n * C * st;
    experts.activation_bytes = pairs * (C + first_rows(c) + F + C) * st + experts.output_bytes;
    experts.expert_params = experts.params;
    if (s.ep > 1) {
      experts.activation_bytes += pairs * C * st + 2 * pairs * si + (L + 1) * s64;
      const double rows_out = double(pairs) * double(s.ep - 1) / double(s.ep);
      experts.expert_backward_bytes = 2 * rows_out * double(C * st);
      experts.expert_forward_bytes = experts.expert_backward_bytes + double((s.ep - 1) * L * 8);
    }
    layer_cost r = linear<P>::cost(router_config(c), s).then(routing).then(experts);
    if (s.tp.sequence_parallel) {
      // The gathered input, kept (the router reads it in backward), and the two gathers.
      const double whole = double(n * C * st);
      r.activation_bytes += n * C * st;
      r.tensor_forward_bytes += tensor_edge_bytes::enter_forward(s.tp, whole);
      r.tensor_backward_bytes += tensor_edge_bytes::leave_backward(s.tp, whole);
    }
    if (c.options.shared_hidden > 0) r = r + swiglu<P>::cost(shared_config(c), s);
    r.output_bytes = experts.output_bytes;
    return r;
  }

  moe(module_scope<P> scope, const config& c)
      : scope_(scope),
        cfg_(validated(scope, c)),
        router_(scope / "router", router_config(c)),
        ep_(scope.experts().size()),
        local_experts_(c.options.experts / ep_),
        first_expert_(scope.experts().rank() * local_experts_) {
    const auto experts = scope / "experts";
    auto& params = scope.params();
    for (std::int64_t e = first_expert_; e < first_expert_ + local_experts_; ++e) {
      const auto one = experts / static_cast<int>(e);
      first_.push_back((one / (gated(c) ? "gate_up" : "fc"))
                           .add_parameter("weight", shape{first_rows(c), c.channels},
                                          init_rule::normal_with_std(c.init_std), true, tensor_gradient::own));
      down_.push_back((one / (gated(c) ? "down" : "proj"))
                          .add_parameter("weight", shape{c.channels, c.hidden},
                                         init_rule::normal_with_std(c.proj_init_std), true, tensor_gradient::own));
      if (ep_ > 1) {
        params.mark_expert(first_.back());
        params.mark_expert(down_.back());
      }
    }
    if (c.options.shared_hidden > 0) shared_.emplace(scope / "shared", shared_config(c));
  }

  tensor_view<const T> forward(tensor_view<const T> x) {
    STRATA_PROFILE("moe.forward");
    const auto& o = cfg_.options;
    STRATA_CHECK(x.shape.rank == 3 && x.shape[2] == cfg_.channels, scope_.qualify("forward"),
                 ": expected [batch, seq, ", cfg_.channels, "], got ", x.shape.str());
    const tensor_view<const T> local = x;
    auto& tp = scope_.tensor();
    x = tp.enter_forward(x, gathered_, scope_.ledger());  // every token, under sequence parallelism
    batch_ = x.shape[0];
    seq_ = x.shape[1];
    rows_ = batch_ * seq_;
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
    if (ep_ == 1) {
      ensure_size(first_out_, ledger, act, pairs * first_rows(cfg_));
      ensure_size(hidden_, ledger, act, pairs * F);
    }
    ensure_size(expert_out_, ledger, act, pairs * C);
    ensure_size(out_, ledger, act, rows_ * C);
    kernels::moe_permute_forward(device{}, permuted_.data(), x.data, row_token_.data(), kept_, C);
    if (ep_ == 1) {
      expert_rows_ = kept_;
      experts_forward(first_, first_out_.data(), permuted_.data(), C, first_rows(cfg_), offsets_.data());
      experts_forward(down_, expert_out_.data(), activate(), F, C, offsets_.data());
    } else {
      // The pairs to their experts' ranks, through the local experts, and back.
      plan_exchange();
      const std::int64_t R = expert_rows_;
      ensure_size(received_, ledger, act, R * C);
      ensure_size(first_out_, ledger, act, R * first_rows(cfg_));
      ensure_size(hidden_, ledger, act, R * F);
      exchange_to_experts(received_.data(), permuted_.data());
      experts_forward(first_, first_out_.data(), received_.data(), C, first_rows(cfg_), local_offsets_.data());
      buffer<T> local_out(ledger, act, std::size_t(R * C), uninitialized);
      experts_forward(down_, local_out.data(), activate(), F, C, local_offsets_.data());
      exchange_from_experts(expert_out_.data(), local_out.data());
    }
    kernels::moe_combine_forward(device{}, out_.data(), expert_out_.data(), weight_.data(), slot_row_.data(), rows_, k,
                                 C);
    // This rank's rows: all of them, or its slice under sequence parallelism.
    T* mine = out_.data() + (local.data == x.data ? 0 : tp.rank() * local.numel());
    if (shared_) {
      auto s = shared_->forward(local);  // the shared SwiGLU takes the split as any feed-forward block
      kernels::residual_forward(device{}, mine, mine, s.data, local.numel());
    }
    return {mine, local.shape};
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

  buffer<T> backward(const buffer<T>& dlocal) {
    STRATA_PROFILE("moe.backward");
    const auto& o = cfg_.options;
    const std::int64_t E = o.experts, k = o.top_k, C = cfg_.channels, F = cfg_.hidden, pairs = rows_ * k;
    auto& ledger = scope_.ledger();
    auto& tp = scope_.tensor();
    buffer<T> gathered;
    const buffer<T>& dout = tp.leave_backward(dlocal, gathered, ledger);  // every token's
    STRATA_CHECK(static_cast<std::int64_t>(dout.size()) == rows_ * C, scope_.qualify("backward"), ": expected ",
                 rows_ * C, " output gradients, got ", dout.size());
    auto& p = scope_.params();
    constexpr auto act = memory_category::activations;

    buffer<T> dexpert(ledger, act, std::size_t(pairs * C), uninitialized);
    buffer<A> dweight(ledger, act, std::size_t(pairs), uninitialized);
    kernels::moe_combine_backward(device{}, dexpert.data(), dweight.data(), dout.data(), expert_out_.data(),
                                  weight_.data(), slot_row_.data(), rows_, k, C);
    // Under expert parallelism the output gradients go to the experts' ranks and the input
    // gradients come back, as the rows did in forward.
    const std::int64_t R = expert_rows_;
    buffer<T> dlocal_out;
    if (ep_ > 1) {
      dlocal_out = buffer<T>(ledger, act, std::size_t(R * C), uninitialized);
      exchange_to_experts(dlocal_out.data(), dexpert.data());
    }
    const std::int64_t* offsets = ep_ == 1 ? offsets_.data() : local_offsets_.data();
    buffer<T> dhidden(ledger, act, std::size_t(std::max(pairs, R) * F), uninitialized);
    experts_backward(down_, dhidden.data(), ep_ == 1 ? dexpert.data() : dlocal_out.data(), hidden_.data(), F, C,
                     offsets);
    dlocal_out = buffer<T>();
    buffer<T> dfirst(ledger, act, std::size_t(std::max(pairs, R) * first_rows(cfg_)), uninitialized);
    if (gated(cfg_)) kernels::swiglu_backward(device{}, dfirst.data(), dhidden.data(), first_out_.data(), R, F);
    else kernels::gelu_backward(device{}, dfirst.data(), first_out_.data(), dhidden.data(), R * F);
    buffer<T> dpermuted(ledger, act, std::size_t(pairs * C), uninitialized);
    if (ep_ == 1) {
      experts_backward(first_, dpermuted.data(), dfirst.data(), permuted_.data(), C, first_rows(cfg_), offsets);
    } else {
      buffer<T> dreceived(ledger, act, std::size_t(R * C), uninitialized);
      experts_backward(first_, dreceived.data(), dfirst.data(), received_.data(), C, first_rows(cfg_), offsets);
      exchange_from_experts(dpermuted.data(), dreceived.data());
    }
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
    // Every rank computed the whole input gradient alike: under sequence parallelism it keeps its rows.
    if (&dout != &dlocal) {
      buffer<T> mine(ledger, act, dlocal.size(), uninitialized);
      mine.copy_within(dx.data() + tp.rank() * std::int64_t(dlocal.size()), dlocal.size());
      dx = std::move(mine);
    }
    if (shared_) {
      buffer<T> dshared = shared_->backward(dlocal);
      kernels::residual_forward(device{}, dx.data(), dx.data(), dshared.data(), std::int64_t(dlocal.size()));
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
    for (auto* b : {&permuted_, &first_out_, &hidden_, &expert_out_, &out_, &received_, &gathered_}) *b = buffer<T>();
    local_offsets_ = buffer<std::int64_t>();
    to_expert_major_ = buffer<std::int32_t>();
    to_source_major_ = buffer<std::int32_t>();
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
  // Under expert parallelism: the experts this rank holds, [first, first + count).
  std::int64_t first_local_expert() const { return first_expert_; }
  std::int64_t local_experts() const { return local_experts_; }
  // The last forward's (token, slot) pairs per expert (all E) from this rank's tokens: what it
  // sent to each expert's rank.
  std::vector<std::int64_t> routed_pairs() const {
    std::vector<std::int64_t> off(std::size_t(cfg_.options.experts + 1));
    offsets_.download(off.data(), off.size());
    std::vector<std::int64_t> n(std::size_t(cfg_.options.experts));
    for (std::size_t e = 0; e < n.size(); ++e) n[e] = off[e + 1] - off[e];
    return n;
  }

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

  // Built, not planned (the planner reads cost() under any policy): the table of supported
  // combinations at compile time where P fixes the combination, at start-up otherwise.
  static const config& validated(const module_scope<P>& scope, const config& c) {
    static_assert(check_static_support<P, layer_kind::experts>());
    const auto& o = c.options;
    STRATA_CHECK(c.channels > 0 && c.hidden > 0, scope.qualify_layer(), ": channels (", c.channels, ") and hidden (",
                 c.hidden, ") must be positive");
    STRATA_CHECK(o.experts >= 1 && o.top_k >= 1 && o.top_k <= o.experts, scope.qualify_layer(), ": top_k (", o.top_k,
                 ") must be between 1 and the experts (", o.experts, ")");
    STRATA_CHECK(o.balance_coef >= 0 && o.z_coef >= 0 && o.capacity_factor >= 0 && o.shared_hidden >= 0,
                 scope.qualify_layer(), ": balance_coef (", o.balance_coef, "), z_coef (", o.z_coef,
                 "), capacity_factor (", o.capacity_factor, ") and shared_hidden (", o.shared_hidden,
                 ") must not be negative");
    STRATA_CHECK(o.experts % scope.experts().size() == 0, scope.qualify_layer(),
                 ": expert parallelism ep=", scope.experts().size(), " does not divide the experts (", o.experts, ")");
    combination here{.device = device_kind_of<device>(), .precision = precision_kind_of<typename P::precision>()};
    here.with(layer_kind::experts)
        .with(mesh_axis::cp, scope.cp().degree())
        .with(expert_parallel, scope.experts().size());
    check_supported(here, scope.qualify_layer());
    scope.check_tensor_extents(tensor_extents(c));
    return c;
  }

  // One projection of every expert over the kept pairs: one grouped GEMM where the weights stay
  // put, one expert at a time where they are gathered on demand (ZeRO-3 holds a few buckets at
  // once, and E experts' weights may span more).
  // `offsets`: where each of this rank's experts' rows start in x (and y), and the end.
  void experts_forward(const std::vector<param_handle>& hs, T* y, const T* x, std::int64_t in, std::int64_t out,
                       const std::int64_t* offsets) {
    auto& p = scope_.params();
    auto& ws = scope_.workspace();
    const auto E = static_cast<std::int64_t>(hs.size());
    if (p.weights_resident()) {
      std::vector<const T*> w;
      for (const param_handle h : hs) w.push_back(p.weights(h));
      kernels::grouped_linear_forward(device{}, ws, y, x, w.data(), offsets, E, in, out);
      return;
    }
    for (std::int64_t e = 0; e < E; ++e) {
      const T* w = p.weights(hs[std::size_t(e)]);
      kernels::grouped_linear_forward(device{}, ws, y, x, &w, offsets + e, 1, in, out);
    }
  }
  void experts_backward(const std::vector<param_handle>& hs, T* dx, const T* dy, const T* x, std::int64_t in,
                        std::int64_t out, const std::int64_t* offsets) {
    auto& p = scope_.params();
    auto& ws = scope_.workspace();
    const auto E = static_cast<std::int64_t>(hs.size());
    if (p.weights_resident()) {
      std::vector<const T*> w;
      std::vector<T*> g;
      for (const param_handle h : hs) {
        w.push_back(p.weights(h));
        g.push_back(p.grads(h));
      }
      kernels::grouped_linear_backward(device{}, ws, dx, g.data(), dy, x, w.data(), offsets, E, in, out);
      return;
    }
    for (std::int64_t e = 0; e < E; ++e) {
      const T* w = p.weights(hs[std::size_t(e)]);
      T* g = p.grads(hs[std::size_t(e)]);
      kernels::grouped_linear_backward(device{}, ws, dx, &g, dy, x, &w, offsets + e, 1, in, out);
    }
  }
  // The experts' activation on the rows this rank's experts ran (its input stays, for
  // backward): the down projection's input.
  const T* activate() {
    const std::int64_t R = expert_rows_;
    if (gated(cfg_)) kernels::swiglu_forward(device{}, hidden_.data(), first_out_.data(), R, cfg_.hidden);
    else kernels::gelu_forward(device{}, hidden_.data(), first_out_.data(), R * cfg_.hidden);
    return hidden_.data();
  }

  // Expert parallelism: who sends how many rows to whom, from this forward's dispatch plan. The
  // counts per expert go around first (an all-to-all of ep blocks of E/ep counts), then each
  // rank knows what it receives: from source s, its rows for local expert j, source-major. The
  // grouped GEMMs want them expert-major, so two row maps go between the orders.
  void plan_exchange() {
    auto& group = scope_.experts();
    const std::int64_t L = local_experts_, C = cfg_.channels;
    const auto routed = routed_pairs();
    if (scope_.block() >= 0) scope_.context().dispatch_log().add(scope_.block(), routed);
    std::vector<double> mine(routed.begin(), routed.end()), theirs(mine.size());
    group.all_to_all(std::span<const double>(mine), std::span<double>(theirs));
    send_counts_.assign(std::size_t(ep_), 0);
    recv_counts_.assign(std::size_t(ep_), 0);
    for (int r = 0; r < ep_; ++r)
      for (std::int64_t j = 0; j < L; ++j) {
        send_counts_[std::size_t(r)] += std::size_t(routed[std::size_t(r * L + j)] * C);
        recv_counts_[std::size_t(r)] += std::size_t(theirs[std::size_t(r * L + j)]) * std::size_t(C);
      }
    // Source-major: source s's block at source_start[s], its expert j's rows after its j' < j.
    std::vector<std::int64_t> source_start(std::size_t(ep_) + 1, 0);
    for (int s = 0; s < ep_; ++s)
      source_start[std::size_t(s) + 1] = source_start[std::size_t(s)] + std::int64_t(recv_counts_[std::size_t(s)]) / C;
    const std::int64_t R = source_start.back();
    expert_rows_ = R;
    std::vector<std::int64_t> local_offsets(std::size_t(L) + 1, 0);
    std::vector<std::int32_t> to_expert(static_cast<std::size_t>(R)), to_source(static_cast<std::size_t>(R));
    std::int64_t row = 0;
    for (std::int64_t j = 0; j < L; ++j) {
      for (int s = 0; s < ep_; ++s) {
        std::int64_t at = source_start[std::size_t(s)];
        for (std::int64_t jj = 0; jj < j; ++jj) at += std::int64_t(theirs[std::size_t(s * L + jj)]);
        const auto n = std::int64_t(theirs[std::size_t(s * L + j)]);
        for (std::int64_t i = 0; i < n; ++i, ++row) {
          to_expert[std::size_t(row)] = std::int32_t(at + i);
          to_source[std::size_t(at + i)] = std::int32_t(row);
        }
      }
      local_offsets[std::size_t(j) + 1] = row;
    }
    auto& ledger = scope_.ledger();
    constexpr auto act = memory_category::activations;
    ensure_size(local_offsets_, ledger, act, L + 1);
    ensure_size(to_expert_major_, ledger, act, R);
    ensure_size(to_source_major_, ledger, act, R);
    local_offsets_.upload(local_offsets.data(), local_offsets.size());
    if (R > 0) {
      to_expert_major_.upload(to_expert.data(), to_expert.size());
      to_source_major_.upload(to_source.data(), to_source.size());
    }
  }
  // [kept, C] rows sorted by expert here -> [R, C] rows of this rank's experts, expert-major.
  void exchange_to_experts(T* to, const T* from) {
    const std::int64_t C = cfg_.channels, R = expert_rows_;
    buffer<T> arrived(scope_.ledger(), memory_category::activations, std::size_t(R * C), uninitialized);
    scope_.experts().all_to_all_v(std::span<const T>(from, std::size_t(kept_ * C)), std::span(send_counts_),
                                  std::span<T>(arrived.data(), arrived.size()), std::span(recv_counts_));
    kernels::moe_permute_forward(device{}, to, arrived.data(), to_expert_major_.data(), R, C);
  }
  // The inverse: [R, C] expert-major rows here -> [kept, C] rows sorted by expert on their ranks.
  void exchange_from_experts(T* to, const T* from) {
    const std::int64_t C = cfg_.channels, R = expert_rows_;
    buffer<T> leaving(scope_.ledger(), memory_category::activations, std::size_t(R * C), uninitialized);
    kernels::moe_permute_forward(device{}, leaving.data(), from, to_source_major_.data(), R, C);
    scope_.experts().all_to_all_v(std::span<const T>(leaving.data(), leaving.size()), std::span(recv_counts_),
                                  std::span<T>(to, std::size_t(kept_ * C)), std::span(send_counts_));
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
  int ep_ = 1;                                         // the expert group's size
  std::int64_t local_experts_ = 0, first_expert_ = 0;  // the experts this rank holds
  std::int64_t batch_ = 0, seq_ = 0, rows_ = 0, kept_ = 0;
  std::int64_t expert_rows_ = 0;  // rows this rank's experts ran: kept_, or what the exchange brought
  std::vector<std::size_t> send_counts_, recv_counts_;  // elements to and from each expert rank
  double grad_scale_ = 1.0;
  bool generating_ = false;
  buffer<A> probs_, lse_, weight_, stats_;
  buffer<std::int32_t> choice_, slot_row_, row_token_;
  buffer<std::int64_t> offsets_, dropped_;
  buffer<T> permuted_, first_out_, hidden_, expert_out_, out_;
  buffer<T> gathered_;                                      // sp: every token's input
  buffer<T> received_;                                      // ep: the rows this rank's experts ran
  buffer<std::int64_t> local_offsets_;                      // ep: where each local expert's rows start
  buffer<std::int32_t> to_expert_major_, to_source_major_;  // ep: the row maps between the orders
};

}  // namespace strata
