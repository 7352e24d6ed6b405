// strata/layers/compose.hpp - layers made of layers: a chain, a residual around one, and
// branches whose outputs are summed. A composition writes no mechanics: its forward, backward
// (the parts in reverse), parameters, activation release, tensor extents and cost (sums, and the
// peaks over the parts) follow from the parts.
//
// A composed layer is a declaration, as a model is (layers/sequential.hpp): its policy, config
// and parts(config), a constexpr tree of
//   st::layer<L>(name, config)      a layer, built under the scope `name` ("": the composite's own)
//   st::chain(a, b, ...)            a, then b, ...
//   st::residual(a, b, ...)         x + chain(a, b, ...)(x)
//   st::sum_of(a, b, ...)           a(x) + b(x) + ...   (the parallel residual's branches)
// and st::composition<Decl> is the layer. Gemma 2's block, norms before and after each branch:
//
//   template <class P>
//   struct sandwich {
//     using policy = P;
//     struct config { std::int64_t channels = 0, heads = 0, hidden = 0; };
//     static constexpr auto parts(const config& c) {
//       return st::chain(st::residual(st::layer<st::rmsnorm<P>>("pre_attn_norm", {.channels = c.channels}),
//                                     st::layer<st::attention<P>>("attn", {.channels = c.channels, .heads = c.heads}),
//                                     st::layer<st::rmsnorm<P>>("post_attn_norm", {.channels = c.channels})),
//                        st::residual(...the feed-forward likewise...));
//     }
//   };
//   template <class P> using sandwich_block = st::composition<sandwich<P>>;
//
// Every part maps [..., C] to [..., C'] (a hidden layer); a residual's and a sum's parts keep the
// width of their input. Memory: a residual keeps its sum (the next part's input) and adds its
// input gradient in place; a sum keeps its sum and adds each branch's input gradient to the
// first's. Selective recomputation (recompute_core) reaches every part that has it; generation
// runs each part's cached forward, or its forward where it works token by token.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/core/profile.hpp"
#include "strata/core/tensor.hpp"
#include "strata/kernels/residual.hpp"
#include "strata/layers/cached_forward.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/layer.hpp"
#include "strata/layers/module.hpp"
#include "strata/layers/sequential.hpp"

namespace strata {

// ---- the declaration's nodes (constexpr values) ----
template <class... Parts>
struct chain_part {
  std::tuple<Parts...> parts;
};
template <class Inner>
struct residual_part {
  Inner inner;
};
template <class... Branches>
struct sum_part {
  std::tuple<Branches...> branches;
};

template <class... Parts>
constexpr chain_part<Parts...> chain(Parts... parts) {
  static_assert(sizeof...(Parts) >= 1, "strata::chain: a chain needs at least one part");
  return {{parts...}};
}
template <class... Parts>
constexpr auto residual(Parts... parts) {
  static_assert(sizeof...(Parts) >= 1, "strata::residual: a residual needs at least one part");
  if constexpr (sizeof...(Parts) == 1) return residual_part<Parts...>{parts...};
  else return residual_part<chain_part<Parts...>>{{{parts...}}};
}
template <class... Branches>
constexpr sum_part<Branches...> sum_of(Branches... branches) {
  static_assert(sizeof...(Branches) >= 2, "strata::sum_of: a sum needs at least two branches");
  return {{branches...}};
}

namespace detail {
// The built form of a node: one specialisation per kind.
template <class P, class Node>
class composed;

template <class L>
concept selectively_recomputed = requires(L& l) {
  l.recompute_core(true);
};
template <class L>
concept releases_activations = requires(L& l) {
  l.release_activations();
};

// The cost of a residual's sum after `inner`: rows·C additions forward, twice that back; the sum
// kept. Forward holds the inner part's activations while the sum is written; backward adds the
// output gradient to the inner part's input gradient in place.
constexpr layer_cost around_residual(const layer_cost& inner) {
  layer_cost r = inner;
  const std::int64_t out = inner.output_bytes;
  r.activation_bytes += out;
  r.memory_forward_bytes += double(3 * out);
  r.memory_backward_bytes += double(3 * out);
  r.forward_peak_bytes = layer_cost::max_of(inner.forward_high(), inner.activation_bytes + out);
  r.backward_peak_bytes = inner.backward_peak_bytes;
  return r;
}

// The built parts of a chain or sum, each constructed in place (layers neither copy nor move).
template <std::size_t I, class X>
struct part_slot {
  template <class... Args>
  explicit part_slot(Args&&... args) : value(std::forward<Args>(args)...) {}
  X value;
};
template <class P, class Seq, class... Parts>
class part_list_impl;
template <class P, std::size_t... I, class... Parts>
class part_list_impl<P, std::index_sequence<I...>, Parts...> : part_slot<I, composed<P, Parts>>... {
 public:
  static constexpr std::size_t size = sizeof...(Parts);
  part_list_impl(const module_scope<P>& scope, const std::tuple<Parts...>& nodes)
      : part_slot<I, composed<P, Parts>>(scope, std::get<I>(nodes))... {}
  template <std::size_t J>
  auto& get() {
    return static_cast<part_slot<J, composed<P, std::tuple_element_t<J, std::tuple<Parts...>>>>&>(*this).value;
  }
  template <std::size_t J>
  const auto& get() const {
    return static_cast<const part_slot<J, composed<P, std::tuple_element_t<J, std::tuple<Parts...>>>>&>(*this).value;
  }
  // f(part) for each part in order.
  template <class F>
  void each(F&& f) {
    (f(get<I>()), ...);
  }
  template <class F>
  void each(F&& f) const {
    (f(get<I>()), ...);
  }
  // The sum of f(part) over the parts.
  template <class F>
  int count(F&& f) {
    return (0 + ... + f(get<I>()));
  }
};
template <class P, class... Parts>
using part_list = part_list_impl<P, std::index_sequence_for<Parts...>, Parts...>;

// ---- a layer ----
template <class P, class L>
class composed<P, layer_part<L>> {
 public:
  using T = typename P::storage;
  static_assert(check_hidden_layer<L>());

  static constexpr tensor_extent_list tensor_extents(const layer_part<L>& n) { return tensor_extents_of<L>(n.config); }
  static constexpr layer_cost cost(const layer_part<L>& n, const cost_scope& s) { return L::cost(n.config, s); }
  static constexpr bool position_wise = position_wise_layer<L>;
  static constexpr bool generates = cached_hidden_layer<L> || position_wise_layer<L>;

  composed(const module_scope<P>& scope, const layer_part<L>& n)
      : layer_(n.name.empty() ? scope : scope / n.name, n.config) {}

  tensor_view<const T> forward(tensor_view<const T> x) { return layer_.forward(x); }
  tensor_view<const T> forward_cached(tensor_view<const T> x, const decode_step& step) requires generates {
    return run_cached(layer_, x, step);
  }
  void release_cache() requires generates { drop_cache(layer_); }
  buffer<T> backward(const buffer<T>& dy) { return layer_.backward(dy); }
  int recompute_core(bool on) {
    if constexpr (selectively_recomputed<L>) {
      layer_.recompute_core(on);
      return 1;
    } else {
      return 0;
    }
  }
  void release_activations() {
    if constexpr (releases_activations<L>) layer_.release_activations();
  }
  template <class F>
  void visit_parameters(F&& f) const {
    layer_.visit_parameters(f);
  }

 private:
  L layer_;
};

// ---- a chain: each part's output the next one's input ----
template <class P, class... Parts>
class composed<P, chain_part<Parts...>> {
 public:
  using T = typename P::storage;
  using node = chain_part<Parts...>;

  static constexpr tensor_extent_list tensor_extents(const node& n) {
    tensor_extent_list r;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (r.add(composed<P, Parts>::tensor_extents(std::get<I>(n.parts))), ...);
    }
    (std::index_sequence_for<Parts...>{});
    return r;
  }
  static constexpr layer_cost cost(const node& n, const cost_scope& s) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      layer_cost r = composed<P, first_t>::cost(std::get<0>(n.parts), s);
      ((I == 0 ? void() : void(r = r.then(composed<P, Parts>::cost(std::get<I>(n.parts), s)))), ...);
      return r;
    }
    (std::index_sequence_for<Parts...>{});
  }
  static constexpr bool position_wise = (composed<P, Parts>::position_wise && ...);
  static constexpr bool generates = (composed<P, Parts>::generates && ...);

  composed(const module_scope<P>& scope, const node& n) : parts_(scope, n.parts) {}

  tensor_view<const T> forward(tensor_view<const T> x) {
    parts_.each([&](auto& part) { x = part.forward(x); });
    return x;
  }
  tensor_view<const T> forward_cached(tensor_view<const T> x, const decode_step& step) requires generates {
    parts_.each([&](auto& part) { x = part.forward_cached(x, step); });
    return x;
  }
  void release_cache() requires generates {
    parts_.each([](auto& part) { part.release_cache(); });
  }
  // The parts in reverse: the last part's input gradient is the one before's output gradient.
  buffer<T> backward(const buffer<T>& dy) { return backward_from<sizeof...(Parts) - 1>(dy); }
  int recompute_core(bool on) {
    return parts_.count([&](auto& part) { return part.recompute_core(on); });
  }
  void release_activations() {
    parts_.each([](auto& part) { part.release_activations(); });
  }
  template <class F>
  void visit_parameters(F&& f) const {
    parts_.each([&](const auto& part) { part.visit_parameters(f); });
  }

 private:
  using first_t = std::tuple_element_t<0, std::tuple<Parts...>>;
  template <std::size_t I>
  buffer<T> backward_from(const buffer<T>& dy) {
    buffer<T> dx = parts_.template get<I>().backward(dy);
    if constexpr (I == 0) return dx;
    else return backward_from<I - 1>(dx);
  }
  part_list<P, Parts...> parts_;
};

// ---- a residual: y = x + inner(x) ----
template <class P, class Inner>
class composed<P, residual_part<Inner>> {
 public:
  using T = typename P::storage;
  using node = residual_part<Inner>;

  static constexpr tensor_extent_list tensor_extents(const node& n) {
    return composed<P, Inner>::tensor_extents(n.inner);
  }
  static constexpr layer_cost cost(const node& n, const cost_scope& s) {
    layer_cost r = around_residual(composed<P, Inner>::cost(n.inner, s));
    const std::int64_t elements = r.output_bytes / static_cast<std::int64_t>(sizeof(T));
    r.forward_flops += elements;
    r.backward_flops += 2 * elements;
    return r;
  }
  static constexpr bool position_wise = composed<P, Inner>::position_wise;
  static constexpr bool generates = composed<P, Inner>::generates;

  composed(const module_scope<P>& scope, const node& n) : ledger_(&scope.ledger()), inner_(scope, n.inner) {}

  tensor_view<const T> forward(tensor_view<const T> x) { return add_input(x, inner_.forward(x)); }
  tensor_view<const T> forward_cached(tensor_view<const T> x, const decode_step& step) requires generates {
    return add_input(x, inner_.forward_cached(x, step));
  }
  void release_cache() requires generates { inner_.release_cache(); }
  // dx = innerᵀ(dy) + dy: the skip path's gradient added in place.
  buffer<T> backward(const buffer<T>& dy) {
    buffer<T> dx = inner_.backward(dy);
    STRATA_CHECK(dx.size() == dy.size(), "strata::residual: the inner part's input gradient has ", dx.size(),
                 " elements, its output gradient ", dy.size(), ": a residual's parts keep the width");
    STRATA_PROFILE("residual.backward");
    kernels::residual_forward(device{}, dx.data(), dx.data(), dy.data(), static_cast<std::int64_t>(dy.size()));
    return dx;
  }
  int recompute_core(bool on) { return inner_.recompute_core(on); }
  void release_activations() {
    inner_.release_activations();
    out_ = buffer<T>();
  }
  template <class F>
  void visit_parameters(F&& f) const {
    inner_.visit_parameters(f);
  }

 private:
  using device = typename P::device;
  tensor_view<const T> add_input(tensor_view<const T> x, tensor_view<const T> a) {
    STRATA_CHECK(a.numel() == x.numel(), "strata::residual: the inner part maps ", x.shape.str(), " to ", a.shape.str(),
                 ": a residual's parts keep the width");
    ensure_size(out_, *ledger_, memory_category::activations, x.numel());
    STRATA_PROFILE("residual.forward");
    kernels::residual_forward(device{}, out_.data(), x.data, a.data, x.numel());
    return {out_.data(), x.shape};
  }
  memory_ledger* ledger_;
  composed<P, Inner> inner_;
  buffer<T> out_;
};

// ---- branches over the same input, their outputs summed ----
template <class P, class... Branches>
class composed<P, sum_part<Branches...>> {
 public:
  using T = typename P::storage;
  using node = sum_part<Branches...>;
  static constexpr std::size_t count = sizeof...(Branches);

  static constexpr tensor_extent_list tensor_extents(const node& n) {
    tensor_extent_list r;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (r.add(composed<P, Branches>::tensor_extents(std::get<I>(n.branches))), ...);
    }
    (std::index_sequence_for<Branches...>{});
    return r;
  }
  // Forward: each branch runs while the ones before keep their activations; then the sum, kept.
  // Backward: the first branch's input gradient is held while each later branch runs, and each
  // is added to it.
  static constexpr layer_cost cost(const node& n, const cost_scope& s) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      const layer_cost each[] = {composed<P, Branches>::cost(std::get<I>(n.branches), s)...};
      const std::int64_t out = each[0].output_bytes, elements = out / static_cast<std::int64_t>(sizeof(T));
      layer_cost r = each[0];
      std::int64_t kept = each[0].activation_bytes, forward_peak = each[0].forward_high(),
                   backward_peak = each[0].backward_peak_bytes;
      for (std::size_t i = 1; i < count; ++i) {
        r = r + each[i];
        forward_peak = layer_cost::max_of(forward_peak, kept + each[i].forward_high());
        backward_peak = layer_cost::max_of(backward_peak, out + each[i].backward_peak_bytes);
        kept += each[i].activation_bytes;
      }
      r.output_bytes = out;
      r.activation_bytes = kept + out;
      r.forward_flops += std::int64_t(count - 1) * elements;
      r.backward_flops += std::int64_t(count - 1) * elements;
      r.memory_forward_bytes += double(std::int64_t(count - 1) * 3 * out);
      r.memory_backward_bytes += double(std::int64_t(count - 1) * 3 * out);
      r.forward_peak_bytes = forward_peak;
      r.backward_peak_bytes = backward_peak;
      return r;
    }
    (std::index_sequence_for<Branches...>{});
  }
  static constexpr bool position_wise = (composed<P, Branches>::position_wise && ...);
  static constexpr bool generates = (composed<P, Branches>::generates && ...);

  composed(const module_scope<P>& scope, const node& n) : ledger_(&scope.ledger()), branches_(scope, n.branches) {}

  tensor_view<const T> forward(tensor_view<const T> x) {
    return sum([&](auto& branch) { return branch.forward(x); });
  }
  tensor_view<const T> forward_cached(tensor_view<const T> x, const decode_step& step) requires generates {
    return sum([&](auto& branch) { return branch.forward_cached(x, step); });
  }
  void release_cache() requires generates {
    branches_.each([](auto& b) { b.release_cache(); });
  }
  // dx = Σ branchᵀ(dy), into the first branch's gradient.
  buffer<T> backward(const buffer<T>& dy) {
    buffer<T> dx = branches_.template get<0>().backward(dy);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((I == 0 ? void() : add_to(dx, branches_.template get<I>().backward(dy))), ...);
    }
    (std::index_sequence_for<Branches...>{});
    return dx;
  }
  int recompute_core(bool on) {
    return branches_.count([&](auto& b) { return b.recompute_core(on); });
  }
  void release_activations() {
    branches_.each([](auto& b) { b.release_activations(); });
    out_ = buffer<T>();
  }
  template <class F>
  void visit_parameters(F&& f) const {
    branches_.each([&](const auto& b) { b.visit_parameters(f); });
  }

 private:
  using device = typename P::device;
  // The first branch's output copied into the sum, each later one's added.
  template <class Run>
  tensor_view<const T> sum(Run&& run) {
    tensor_view<const T> first = run(branches_.template get<0>());
    ensure_size(out_, *ledger_, memory_category::activations, first.numel());
    out_.copy_within(first.data, static_cast<std::size_t>(first.numel()));
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((I == 0 ? void() : add_output(run(branches_.template get<I>()))), ...);
    }
    (std::index_sequence_for<Branches...>{});
    return {out_.data(), first.shape};
  }
  void add_output(tensor_view<const T> y) {
    STRATA_CHECK(y.numel() == static_cast<std::int64_t>(out_.size()), "strata::sum_of: branch outputs of ", out_.size(),
                 " and ", y.numel(), " elements cannot be summed");
    STRATA_PROFILE("residual.forward");
    kernels::residual_forward(device{}, out_.data(), out_.data(), y.data, y.numel());
  }
  void add_to(buffer<T>& dx, const buffer<T>& more) {
    STRATA_CHECK(more.size() == dx.size(), "strata::sum_of: branch input gradients of ", dx.size(), " and ",
                 more.size(), " elements cannot be summed");
    STRATA_PROFILE("residual.backward");
    kernels::residual_forward(device{}, dx.data(), dx.data(), more.data(), static_cast<std::int64_t>(dx.size()));
  }
  memory_ledger* ledger_;
  part_list<P, Branches...> branches_;
  buffer<T> out_;
};
}  // namespace detail

// ---- the layer a declaration describes ----
template <class Decl>
concept composition_declaration = requires {
  typename Decl::policy;
  typename Decl::config;
  Decl::parts(std::declval<const typename Decl::config&>());
};

template <class Decl>
class composition {
  static_assert(composition_declaration<Decl>,
                "strata::composition<Decl>: Decl needs `using policy = P;`, `struct config { ... };` and "
                "`static constexpr auto parts(const config&)` (a tree of st::layer, st::chain, st::residual and "
                "st::sum_of)");

 public:
  using policy = typename Decl::policy;
  using T = typename policy::storage;
  using config = typename Decl::config;
  using parts_type = std::remove_cvref_t<decltype(Decl::parts(std::declval<const config&>()))>;
  using built_type = detail::composed<policy, parts_type>;

  static constexpr bool position_wise = built_type::position_wise;
  static constexpr bool generates = built_type::generates;  // every part generates: forward_cached exists
  static constexpr tensor_extent_list tensor_extents(const config& c) {
    return built_type::tensor_extents(Decl::parts(c));
  }
  static constexpr layer_cost cost(const config& c, const cost_scope& s) { return built_type::cost(Decl::parts(c), s); }

  composition(module_scope<policy> scope, const config& c)
      : scope_(scope), cfg_(validated(scope, c)), parts_(scope, Decl::parts(c)) {}

  tensor_view<const T> forward(tensor_view<const T> x) { return parts_.forward(x); }
  buffer<T> backward(const buffer<T>& dy) { return parts_.backward(dy); }
  tensor_view<const T> forward_cached(tensor_view<const T> x, const decode_step& step) requires generates {
    return parts_.forward_cached(x, step);
  }
  void release_cache() requires generates { parts_.release_cache(); }
  void recompute_core(bool on) {
    if (parts_.recompute_core(on) == 0)
      fail(scope_.qualify_layer(), ": selective recomputation needs a part with recompute_core(bool) (an attention)");
  }
  void release_activations() { parts_.release_activations(); }
  template <class F>
  void visit_parameters(F&& f) const {
    parts_.visit_parameters(f);
  }
  const config& cfg() const { return cfg_; }

 private:
  // The shape errors first (they name the numbers), before any part is built.
  static const config& validated(const module_scope<policy>& scope, const config& c) {
    scope.check_tensor_extents(tensor_extents(c));
    return c;
  }
  module_scope<policy> scope_;
  config cfg_;
  built_type parts_;
};

}  // namespace strata
