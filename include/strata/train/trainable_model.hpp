// strata/train/trainable_model.hpp - what the trainer asks of a model.
//
// A trainable model names its policy and storage type and runs one micro-batch: forward returns
// the mean loss and leaves its gradient (times grad_scale) in place, backward adds every
// parameter's gradient, parameters() is the store they live in. A model split over pipeline
// stages (sequential_model under a pipeline) instead runs a whole step's micro-batches itself
// under its schedule: run_microbatches, when pipelined() says so.
#pragma once
#include <concepts>
#include <cstdint>

#include "strata/core/tensor.hpp"
#include "strata/layers/parameters.hpp"

namespace strata {

template <class M>
concept has_model_aliases = requires {
  typename M::policy;
  typename M::T;
};
template <class M>
concept has_model_forward = requires(M& m, tensor_view<const std::int32_t> tokens, double scale) {
  { m.forward(tokens, tokens, scale) } -> std::convertible_to<double>;
};
template <class M>
concept has_model_backward = requires(M& m) {
  m.backward();
};
template <class M>
concept has_parameter_store = requires(M& m) {
  { m.parameters() } -> std::same_as<parameter_store<typename M::T>&>;
};

template <class M>
concept trainable_model =
    has_model_aliases<M> && has_model_forward<M> && has_model_backward<M> && has_parameter_store<M>;

template <class M>
concept pipelined_model = trainable_model<M> &&
    requires(M& m, const M& cm, tensor_view<const std::int32_t> tokens, std::int64_t rows, int n, double s) {
  { cm.pipelined() } -> std::convertible_to<bool>;
  { cm.microbatches() } -> std::convertible_to<int>;
  { m.run_microbatches(tokens, tokens, rows, n, s) } -> std::convertible_to<double>;
};

// One static_assert per member, naming it.
template <class M>
consteval bool check_trainable_model() {
  static_assert(
      requires { typename M::policy; }, "strata trainer: the model has no `using policy = P;`");
  static_assert(
      requires { typename M::T; }, "strata trainer: the model has no `using T = typename P::storage;`");
  if constexpr (has_model_aliases<M>) {
    static_assert(has_model_forward<M>,
                  "strata trainer: the model has no `double forward(tensor_view<const int32_t> "
                  "inputs, tensor_view<const int32_t> targets, double grad_scale)`");
    static_assert(has_model_backward<M>, "strata trainer: the model has no `void backward()`");
    static_assert(has_parameter_store<M>,
                  "strata trainer: the model has no `strata::parameter_store<T>& parameters()`");
  }
  return true;
}

}  // namespace strata
