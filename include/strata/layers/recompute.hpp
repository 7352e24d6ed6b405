// strata/layers/recompute.hpp - activation recomputation as a layer wrapper.
//
//   st::stack<st::recompute<st::selective, st::transformer_block<P>>> blocks;
//
// Trades FLOPs for activation memory (Korthikanti et al. 2022):
//   full       keeps only the wrapped layer's output, which is the next layer's input; after
//              forward every activation inside the layer is released, and backward runs the
//              layer's forward again from its input before its backward. Costs one more forward.
//   selective  keeps everything but the attention probabilities, the activations that grow with
//              the square of the sequence; backward recomputes them from the kept q, k, v.
//              Needs a layer with recompute_core(bool) (attention, transformer_block).
//   none       the layer as it is.
// recompute<recompute_mode_by_config, L> takes the mode from its config at run time (a flag).
//
// Recomputation repeats the same kernels on the same inputs, so on the host the losses and
// gradients are bit-identical to a run without it. Under tensor parallelism the recomputed
// forward repeats its collectives too (they are counted).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "strata/core/error.hpp"
#include "strata/layers/layer.hpp"
#include "strata/layers/module.hpp"

namespace strata {

enum class recompute_mode { none, selective, full };

inline recompute_mode parse_recompute_mode(const std::string& s) {
  if (s == "none") return recompute_mode::none;
  if (s == "selective") return recompute_mode::selective;
  if (s == "full") return recompute_mode::full;
  fail("recompute: unknown mode '", s, "' (none, selective or full)");
}

// The mode tags.
struct no_recompute { static constexpr recompute_mode mode = recompute_mode::none; };
struct selective { static constexpr recompute_mode mode = recompute_mode::selective; };
struct full { static constexpr recompute_mode mode = recompute_mode::full; };
struct recompute_mode_by_config {};

template <class L>
concept has_recomputable_core = requires(L& l, const typename L::config& c, std::int64_t n) {
  l.recompute_core(true);
  { L::core_activation_bytes(c, n, n) } -> std::convertible_to<std::int64_t>;
};

// A layer that can let go of what it keeps between forward and backward, and says how big its
// output is (what a fully recomputed layer still keeps).
template <class L>
concept releases_activations = requires(L& l, const typename L::config& c, std::int64_t n) {
  l.release_activations();
  { L::output_bytes(c, n, n) } -> std::convertible_to<std::int64_t>;
};

template <class Mode, class L>
class recompute {
 public:
  using policy = typename L::policy;
  using T = typename L::T;
  using inner_type = L;
  static constexpr bool by_config = std::is_same_v<Mode, recompute_mode_by_config>;

  // The wrapped layer's config; with recompute_mode_by_config it also carries the mode.
  struct config_with_mode : L::config {
    recompute_mode recompute = recompute_mode::none;
  };
  using config = std::conditional_t<by_config, config_with_mode, typename L::config>;

  static constexpr recompute_mode mode_of(const config& c) {
    if constexpr (by_config) return c.recompute;
    else return Mode::mode;
  }

  static constexpr std::int64_t param_count(const config& c) { return L::param_count(c); }
  static constexpr std::int64_t forward_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return L::forward_flops(c, batch, seq);
  }
  // Full recomputation runs forward again in backward (selective: the core's share, ignored).
  static constexpr std::int64_t backward_flops(const config& c, std::int64_t batch, std::int64_t seq) {
    return L::backward_flops(c, batch, seq) + (mode_of(c) == recompute_mode::full ? L::forward_flops(c, batch, seq) : 0);
  }
  // What stays from forward to backward. Full: the output alone, which has the shape of the input.
  static constexpr std::int64_t activation_bytes(const config& c, std::int64_t batch, std::int64_t seq) {
    switch (mode_of(c)) {
      case recompute_mode::full:
        if constexpr (releases_activations<L>) return L::output_bytes(c, batch, seq);
        else return L::activation_bytes(c, batch, seq);
      case recompute_mode::selective:
        if constexpr (has_recomputable_core<L>) return L::activation_bytes(c, batch, seq) - L::core_activation_bytes(c, batch, seq);
        else return L::activation_bytes(c, batch, seq);
      case recompute_mode::none: break;
    }
    return L::activation_bytes(c, batch, seq);
  }

  recompute(module_scope<policy> scope, config c) : mode_(mode_of(c)), scope_(scope), inner_(scope, c) {
    static_assert(hidden_layer<L>, "strata::recompute: the wrapped type must be a hidden layer (layer.hpp)");
    static_assert(!std::is_same_v<Mode, selective> || has_recomputable_core<L>,
                  "strata::recompute<selective, L>: L has no recompute_core(bool) / core_activation_bytes to drop");
    if (mode_ == recompute_mode::selective) {
      if constexpr (has_recomputable_core<L>) inner_.recompute_core(true);
      else fail(scope.qualify("recompute"), ": selective recomputation needs a layer with an attention core");
    }
    if (mode_ == recompute_mode::full) {
      static_assert(!std::is_same_v<Mode, full> || releases_activations<L>,
                    "strata::recompute<full, L>: L has no release_activations()");
      if constexpr (!releases_activations<L>) fail(scope.qualify("recompute"), ": full recomputation needs release_activations()");
    }
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

  buffer<T> backward(const buffer<T>& dout) {
    if (mode_ != recompute_mode::full) return inner_.backward(dout);
    inner_.forward(input_);  // the same kernels on the same input: the same activations
    buffer<T> dx = inner_.backward(dout);
    if constexpr (releases_activations<L>) inner_.release_activations();
    return dx;
  }

  void release_activations() {
    if constexpr (requires(L& l) { l.release_activations(); }) inner_.release_activations();
    out_ = buffer<T>();
  }

  template <class F>
  void visit_parameters(F&& f) const {
    inner_.visit_parameters(f);
  }
  L& inner() { return inner_; }
  recompute_mode mode() const { return mode_; }

 private:
  recompute_mode mode_;
  module_scope<policy> scope_;
  L inner_;
  tensor_view<const T> input_;
  buffer<T> out_;
};

}  // namespace strata
