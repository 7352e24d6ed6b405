// strata/layers/layer.hpp - the layer concepts a user-written layer meets to compose with ours.
//
// Every layer has `policy`, `T` (the storage type) and `config` (a plain aggregate of its
// settings, written with designated initializers), a constructor L(module_scope<policy>, const
// config&) that registers its parameters (the tensor split comes from the scope, never from the
// config), visit_parameters naming them, and a constexpr cost(config, cost_scope) the planner
// adds up (cost.hpp). A layer that adds to a parameter's gradient calls
// parameters().grad_written(handle) afterwards, so data parallelism can start reducing that
// gradient while backward goes on. Optionally, tensor_extents(config) lists what a
// tensor-parallel degree must divide (tensor_split.hpp).
//
// Three roles, by what flows in and out:
//   hidden_layer  [B, T, C] activations -> [B, T, C']: forward(x) returns a view it owns,
//                 backward(dy) returns the input gradient (RMSNorm, SwiGLU, a block, ...)
//   input_layer   token ids [B, T] -> activations: forward(tokens), backward(dy) (an embedding)
//   output_layer  activations and targets -> the mean loss: forward(x, targets, grad_scale),
//                 backward() returning dx, evaluate(x, targets) (a head with its loss)
//
// check_hidden_layer<L>() (and the input and output forms) static_assert each requirement
// separately, so a layer that misses one fails to compile with a message naming the member.
#pragma once
#include <concepts>
#include <cstdint>

#include "strata/core/memory.hpp"
#include "strata/core/tensor.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/module.hpp"
#include "strata/layers/parameters.hpp"
#include "strata/layers/tensor_split.hpp"

namespace strata {

namespace detail {
// What visit_parameters is called with in the concepts below: a named type, since nvcc's front
// end rejects a lambda inside a requires-expression.
struct parameter_visitor_probe {
  void operator()(param_handle) const {}
};
}  // namespace detail

// ---- the pieces every layer has ----
template <class L>
concept has_policy_alias = requires {
  typename L::policy;
};
template <class L>
concept has_storage_alias = requires {
  typename L::T;
};
template <class L>
concept has_config = requires {
  typename L::config;
}
&&std::is_aggregate_v<typename L::config>;
template <class L>
concept has_layer_cost = requires(const typename L::config& c, const cost_scope& s) {
  { L::cost(c, s) } -> std::same_as<layer_cost>;
};
template <class L>
concept built_from_scope = std::constructible_from < L,
        module_scope<typename L::policy>,
const typename L::config& > ;
template <class L>
concept visits_parameters = requires(const L& l) {
  l.visit_parameters(detail::parameter_visitor_probe{});
};
template <class L>
concept has_tensor_extents = requires(const typename L::config& c) {
  { L::tensor_extents(c) } -> std::same_as<tensor_extent_list>;
};

template <class L>
concept layer_basics = has_policy_alias<L> && has_storage_alias<L> && has_config<L> && has_layer_cost<L> &&
    built_from_scope<L> && visits_parameters<L>;

// ---- the roles ----
template <class L>
concept has_hidden_forward = requires(L& l, tensor_view<const typename L::T> x) {
  { l.forward(x) } -> std::same_as<tensor_view<const typename L::T>>;
};
template <class L>
concept has_hidden_backward = requires(L& l, const buffer<typename L::T>& dy) {
  { l.backward(dy) } -> std::same_as<buffer<typename L::T>>;
};
template <class L>
concept hidden_layer = layer_basics<L> && has_hidden_forward<L> && has_hidden_backward<L>;

template <class L>
concept has_token_forward = requires(L& l, tensor_view<const std::int32_t> tokens) {
  { l.forward(tokens) } -> std::same_as<tensor_view<const typename L::T>>;
};
template <class L>
concept has_input_backward = requires(L& l, const buffer<typename L::T>& dy) {
  l.backward(dy);
};
template <class L>
concept input_layer = layer_basics<L> && has_token_forward<L> && has_input_backward<L>;

template <class L>
concept has_loss_forward = requires(L& l, tensor_view<const typename L::T> x, tensor_view<const std::int32_t> t,
                                    double s) {
  { l.forward(x, t, s) } -> std::convertible_to<double>;
};
template <class L>
concept has_loss_backward = requires(L& l) {
  { l.backward() } -> std::same_as<buffer<typename L::T>>;
};
template <class L>
concept has_evaluate = requires(L& l, tensor_view<const typename L::T> x, tensor_view<const std::int32_t> t) {
  { l.evaluate(x, t) } -> std::convertible_to<double>;
};
template <class L>
concept output_layer = layer_basics<L> && has_loss_forward<L> && has_loss_backward<L> && has_evaluate<L>;

// A layer that shares a parameter another layer owns names it (lm_head: config.tied_to).
template <class L>
concept ties_a_parameter = requires(const typename L::config& c) {
  { L::tied_parameter(c) } -> std::convertible_to<std::string_view>;
};

// What a layer's tensor-parallel degree must divide; nothing when it does not say.
template <class L>
constexpr tensor_extent_list tensor_extents_of(const typename L::config& c) {
  if constexpr (has_tensor_extents<L>) return L::tensor_extents(c);
  else return {};
}

// ---- diagnostics: one static_assert per requirement, naming the member ----
template <class L>
consteval bool check_layer_basics() {
  static_assert(has_policy_alias<L>, "strata layer: missing `using policy = P;` (the policy it was instantiated with)");
  static_assert(has_storage_alias<L>, "strata layer: missing `using T = typename P::storage;`");
  static_assert(
      requires { typename L::config; }, "strata layer: missing `struct config { ... };` (its settings)");
  if constexpr (has_policy_alias<L> && has_storage_alias<L> && requires { typename L::config; }) {
    static_assert(has_config<L>, "strata layer: `config` must be a plain aggregate (designated initializers)");
    static_assert(has_layer_cost<L>,
                  "strata layer: missing `static constexpr strata::layer_cost cost(const config&, "
                  "const strata::cost_scope&)` (its costs, for the planner)");
    static_assert(built_from_scope<L>,
                  "strata layer: missing the constructor `L(strata::module_scope<policy>, const "
                  "config&)` (registers its parameters)");
    static_assert(visits_parameters<L>, "strata layer: missing `template <class F> void visit_parameters(F&&) const`");
  }
  return true;
}

template <class L>
consteval bool check_hidden_layer() {
  check_layer_basics<L>();
  if constexpr (layer_basics<L>) {
    static_assert(has_hidden_forward<L>,
                  "strata hidden layer: missing `tensor_view<const T> forward(tensor_view<const T>)`");
    static_assert(has_hidden_backward<L>,
                  "strata hidden layer: missing `buffer<T> backward(const buffer<T>& dy)` "
                  "(returns the input gradient)");
  }
  return true;
}

template <class L>
consteval bool check_input_layer() {
  check_layer_basics<L>();
  if constexpr (layer_basics<L>) {
    static_assert(has_token_forward<L>,
                  "strata input layer (the first part of a model): missing "
                  "`tensor_view<const T> forward(tensor_view<const std::int32_t> tokens)`");
    static_assert(has_input_backward<L>, "strata input layer: missing `void backward(const buffer<T>& dy)`");
  }
  return true;
}

template <class L>
consteval bool check_output_layer() {
  check_layer_basics<L>();
  if constexpr (layer_basics<L>) {
    static_assert(has_loss_forward<L>,
                  "strata output layer (the last part of a model): missing `double forward("
                  "tensor_view<const T> x, tensor_view<const std::int32_t> targets, double grad_scale)`");
    static_assert(has_loss_backward<L>, "strata output layer: missing `buffer<T> backward()` (the gradient of x)");
    static_assert(has_evaluate<L>,
                  "strata output layer: missing `double evaluate(tensor_view<const T> x, "
                  "tensor_view<const std::int32_t> targets)`");
  }
  return true;
}

}  // namespace strata
