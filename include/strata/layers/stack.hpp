// strata/layers/stack.hpp - N copies of one layer applied in sequence ("h.0" .. "h.N-1").
//
// The count may be fixed in the type (stack<Block, 12>) or given at run time (stack<Block>);
// either way each copy has its own parameters and activations. A pipeline stage holds a stack
// of the blocks it runs, numbered as in the whole model ("h.4" .. "h.7").
#pragma once
#include <cstdint>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/extents.hpp"
#include "strata/layers/cached_forward.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/layer.hpp"
#include "strata/layers/module.hpp"

namespace strata {

template <class Layer, int Count = dynamic>
class stack {
 public:
  static_assert(is_valid_extent(Count), "strata::stack<Layer, Count>: Count must be >= 1 or strata::dynamic");
  static_assert(check_hidden_layer<Layer>());
  using layer_type = Layer;
  using policy = typename Layer::policy;
  using T = typename policy::storage;
  using config = typename Layer::config;

  // `count` copies, one after another.
  static constexpr layer_cost cost(const config& c, std::int64_t count, const cost_scope& s) {
    return Layer::cost(c, s).repeated(count);
  }

  // Static count.
  stack(module_scope<policy> scope, const config& c) requires(Count != dynamic) : stack(scope, c, Count) {}
  // Run-time count (must equal Count when that is static). `first` numbers the copies from there
  // on ("h.4" .. "h.7" for a pipeline stage holding layers 4-7 of a longer stack).
  stack(module_scope<policy> scope, const config& c, std::int64_t count, std::int64_t first = 0) {
    STRATA_CHECK(count >= 1, scope.qualify_layer(), ": layer count (", count, ") must be >= 1");
    STRATA_CHECK(Count == dynamic || count == Count, scope.qualify_layer(), ": layer count ", count,
                 " differs from the static count ", Count);
    layers_.reserve(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i)
      layers_.emplace_back((scope / static_cast<int>(first + i)).in_block(first + i), c);
  }

  tensor_view<const T> forward(tensor_view<const T> x) {
    for (auto& l : layers_) x = l.forward(x);
    return x;
  }
  // Generation: the new tokens through every copy, each keeping its cache.
  tensor_view<const T> forward_cached(tensor_view<const T> x, const decode_step& step) {
    for (auto& l : layers_) x = run_cached(l, x, step);
    return x;
  }
  void release_cache() {
    for (auto& l : layers_) drop_cache(l);
  }

  buffer<T> backward(const buffer<T>& dout) {
    buffer<T> d = layers_.back().backward(dout);
    for (auto i = layers_.size() - 1; i-- > 0;) d = layers_[i].backward(d);
    return d;
  }

  // Lets every copy go of what forward kept (when the layer can).
  void release_activations() {
    if constexpr (requires(Layer & l) { l.release_activations(); })
      for (auto& l : layers_) l.release_activations();
  }

  template <class F>
  void visit_parameters(F&& f) const {
    for (const auto& l : layers_) l.visit_parameters(f);
  }
  std::int64_t size() const { return static_cast<std::int64_t>(layers_.size()); }
  Layer& operator[](std::int64_t i) { return layers_[static_cast<std::size_t>(i)]; }

 private:
  std::vector<Layer> layers_;
};

}  // namespace strata
