// strata/layers/recompute.hpp - activation recomputation as a layer wrapper.
//
//   st::stack<st::recompute<st::selective, st::transformer_block<P>>> blocks;
//
// Trades FLOPs for activation memory (Korthikanti et al. 2022; the modes: policy/recompute.hpp):
//   full       keeps only the wrapped layer's output, which is the next layer's input; after
//              forward every activation inside the layer is released, and backward runs the
//              layer's forward again from its input before its backward. Costs one more forward.
//              Needs a layer with release_activations().
//   selective  keeps everything but the attention's logsumexps (one per query row); backward
//              recomputes them from the kept q, k, v.
//              Needs a layer with recompute_core(bool) (attention, transformer_block).
//   none       the layer as it is.
// recompute<recompute_from_context, L> takes the mode from the model context it is built in, at
// run time: an assembled model sets it from its options (a --recompute flag). The config is the
// wrapped layer's own: the mode is never part of it.
//
// Recomputation repeats the same kernels on the same inputs, so on the host the losses and
// gradients are bit-identical to a run without it. Under tensor parallelism the recomputed
// forward repeats its collectives too (they are counted).
#pragma once
#include <cstdint>

#include "strata/core/error.hpp"
#include "strata/layers/cached_forward.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/layer.hpp"
#include "strata/layers/module.hpp"
#include "strata/policy/recompute.hpp"

namespace strata {

// A layer whose quadratic core selective recomputation can drop.
template <class L>
concept has_recomputable_core = requires(L& l) {
  l.recompute_core(true);
};

// A layer that can let go of what it keeps between forward and backward.
template <class L>
concept releases_activations = requires(L& l) {
  l.release_activations();
};

template <class Mode, class L>
class recompute {
  static_assert(is_recompute_tag_v<Mode>,
                "strata::recompute<Mode, L>: Mode must be strata::no_recompute, "
                "strata::selective, strata::full or strata::recompute_from_context");
  static_assert(check_hidden_layer<L>());
  static_assert(!std::is_same_v<Mode, selective> || has_recomputable_core<L>,
                "strata::recompute<selective, L>: L has no recompute_core(bool), the member selective "
                "recomputation calls to drop its quadratic core");
  static_assert(!std::is_same_v<Mode, full> || releases_activations<L>,
                "strata::recompute<full, L>: L has no release_activations(), the member full recomputation calls "
                "to drop what forward kept");

 public:
  using policy = typename L::policy;
  using T = typename L::T;
  using config = typename L::config;
  using inner_type = L;

  static constexpr recompute_mode mode_in(const cost_scope& s) {
    if constexpr (std::is_same_v<Mode, recompute_from_context>) return s.recompute;
    else return Mode::mode;
  }

  static constexpr tensor_extent_list tensor_extents(const config& c) { return L::tensor_extents(c); }
  // Full: only the output stays, and backward runs forward again (its collectives too).
  // Selective: the core is dropped and recomputed in backward.
  static constexpr layer_cost cost(const config& c, const cost_scope& s) {
    layer_cost r = L::cost(c, s);
    switch (mode_in(s)) {
      case recompute_mode::full:
        // Forward copies the output out before letting go of the rest; backward runs forward
        // again, and its own backward on top of what that keeps.
        r.forward_peak_bytes = layer_cost::max_of(r.forward_high(), r.activation_bytes + r.output_bytes);
        r.backward_peak_bytes = layer_cost::max_of(r.forward_high(), r.activation_bytes + r.backward_peak_bytes);
        r.activation_bytes = r.output_bytes;
        r.backward_flops += r.forward_flops;
        r.tensor_backward_bytes += r.tensor_forward_bytes;
        r.context_backward_bytes += r.context_forward_bytes;
        r.expert_backward_bytes += r.expert_forward_bytes;
        r.backward_gemms += r.forward_gemms;
        r.attention_backward_flops += r.attention_forward_flops;
        r.attention_backward_scores += r.attention_forward_scores;
        r.memory_backward_bytes += r.memory_forward_bytes;
        r.core_bytes = r.core_flops = 0;
        break;
      case recompute_mode::selective:
        // The context group's traffic is attention's core (its ring or all-to-all): redone too.
        r.activation_bytes -= r.core_bytes;
        r.backward_flops += r.core_flops;
        r.attention_backward_flops += r.attention_forward_flops;
        r.attention_backward_scores += r.attention_forward_scores;
        r.context_backward_bytes += r.context_forward_bytes;
        r.core_bytes = r.core_flops = 0;
        break;
      case recompute_mode::none: break;
    }
    return r;
  }

  recompute(module_scope<policy> scope, const config& c) : mode_(mode_of(scope)), scope_(scope), inner_(scope, c) {
    if (mode_ == recompute_mode::selective) {
      if constexpr (has_recomputable_core<L>) inner_.recompute_core(true);
      else
        fail(scope.qualify_layer(),
             ": selective recomputation needs a layer with recompute_core(bool) (an attention core)");
    }
    if constexpr (!releases_activations<L>)
      STRATA_CHECK(mode_ != recompute_mode::full, scope.qualify_layer(),
                   ": full recomputation needs a layer with release_activations()");
  }

  tensor_view<const T> forward(tensor_view<const T> x) {
    if (mode_ != recompute_mode::full) return inner_.forward(x);
    input_ = x;
    auto y = inner_.forward(x);
    ensure_size(out_, scope_.ledger(), memory_category::activations, y.numel());
    out_.copy_within(y.data, static_cast<std::size_t>(y.numel()));
    if constexpr (releases_activations<L>) inner_.release_activations();
    return {out_.data(), y.shape};
  }

  // Generation keeps no activations for backward: the wrapped layer's cached forward, whatever the mode.
  tensor_view<const T> forward_cached(tensor_view<const T> x, const decode_step& step) {
    return run_cached(inner_, x, step);
  }
  void release_cache() { drop_cache(inner_); }

  buffer<T> backward(const buffer<T>& dout) {
    if (mode_ != recompute_mode::full) return inner_.backward(dout);
    inner_.forward(input_);  // the same kernels on the same input: the same activations
    buffer<T> dx = inner_.backward(dout);
    if constexpr (releases_activations<L>) inner_.release_activations();
    return dx;
  }

  void release_activations() {
    if constexpr (releases_activations<L>) inner_.release_activations();
    out_ = buffer<T>();
  }

  template <class F>
  void visit_parameters(F&& f) const {
    inner_.visit_parameters(f);
  }
  L& inner() { return inner_; }
  recompute_mode mode() const { return mode_; }

 private:
  static recompute_mode mode_of(const module_scope<policy>& scope) {
    if constexpr (std::is_same_v<Mode, recompute_from_context>) return scope.context().recompute();
    else return Mode::mode;
  }

  recompute_mode mode_;
  module_scope<policy> scope_;
  L inner_;
  tensor_view<const T> input_;
  buffer<T> out_;
};

}  // namespace strata
