// strata/layers/layer.hpp - the layer concept a user-written layer meets to compose with ours.
//
// A hidden layer maps [B, T, C] activations to [B, T, C'] and back: forward returns a view
// it owns, backward takes the output gradient and returns the input gradient (accumulating
// into its parameters' gradients), visit_parameters names its parameters, and constexpr
// costs let the planner add it up without running it. RMSNorm, SwiGLU or a RoPE attention
// written outside strata fit the same slot as ours. A layer that adds to a parameter's
// gradient calls parameters().grad_written(handle) afterwards, so data parallelism can start
// reducing that gradient while backward goes on.
#pragma once
#include <concepts>
#include <cstdint>

#include "strata/core/memory.hpp"
#include "strata/core/tensor.hpp"
#include "strata/layers/parameters.hpp"

namespace strata {

template <class L>
concept layer_costs = requires(const typename L::config& c, std::int64_t n) {
  { L::param_count(c) } -> std::convertible_to<std::int64_t>;
  { L::forward_flops(c, n, n) } -> std::convertible_to<std::int64_t>;
  { L::backward_flops(c, n, n) } -> std::convertible_to<std::int64_t>;
  { L::activation_bytes(c, n, n) } -> std::convertible_to<std::int64_t>;
};

namespace detail {
// What visit_parameters is called with in the concept below: a named type, since nvcc's front
// end rejects a lambda inside a requires-expression (every layer would fail the concept).
struct parameter_visitor_probe {
  void operator()(param_handle) const {}
};
}  // namespace detail

template <class L>
concept hidden_layer = layer_costs<L> && requires(L& l, const L& cl, tensor_view<const typename L::T> x,
                                                  const buffer<typename L::T>& dy) {
  typename L::policy;
  typename L::config;
  { l.forward(x) } -> std::same_as<tensor_view<const typename L::T>>;
  { l.backward(dy) } -> std::same_as<buffer<typename L::T>>;
  cl.visit_parameters(detail::parameter_visitor_probe{});
};

}  // namespace strata
