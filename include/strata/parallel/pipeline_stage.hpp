// strata/parallel/pipeline_stage.hpp - what a pipeline stage gives the executor that runs its
// schedule (pipeline.hpp). sequential_model is one; a stage written by hand meets the same.
#pragma once
#include <concepts>
#include <cstdint>

#include "strata/core/memory.hpp"
#include "strata/core/tensor.hpp"

namespace strata {

template <class S>
concept has_stage_forward = requires(S& s, int i, tensor_view<const typename S::T> x,
                                     tensor_view<const std::int32_t> tokens, double scale, double& loss) {
  { s.pipeline_forward(i, i, x, tokens, tokens, scale, loss) } -> std::same_as<tensor_view<const typename S::T>>;
};
template <class S>
concept has_stage_backward = requires(S& s, int i, const buffer<typename S::T>* dy) {
  { s.pipeline_backward(i, i, dy) } -> std::same_as<buffer<typename S::T>>;
};
template <class S>
concept has_activation_shape = requires(const S& s, std::int64_t n) {
  { s.pipeline_activation_shape(n, n) } -> std::same_as<strata::shape>;
};

template <class S>
concept pipeline_stage = requires {
  typename S::T;
}
&&has_stage_forward<S>&& has_stage_backward<S>&& has_activation_shape<S>;

// One static_assert per member, naming it.
template <class S>
consteval bool check_pipeline_stage() {
  static_assert(
      requires { typename S::T; }, "strata pipeline stage: missing `using T = ...;` (the storage type)");
  if constexpr (requires { typename S::T; }) {
    static_assert(has_stage_forward<S>,
                  "strata pipeline stage: missing `tensor_view<const T> pipeline_forward(int chunk, "
                  "int microbatch, tensor_view<const T> input, tensor_view<const int32_t> inputs, "
                  "tensor_view<const int32_t> targets, double grad_scale, double& loss)`");
    static_assert(has_stage_backward<S>,
                  "strata pipeline stage: missing `buffer<T> pipeline_backward(int chunk, int "
                  "microbatch, const buffer<T>* output_grad)`");
    static_assert(has_activation_shape<S>,
                  "strata pipeline stage: missing `strata::shape pipeline_activation_shape("
                  "std::int64_t sequences, std::int64_t seq) const`");
  }
  return true;
}

}  // namespace strata
