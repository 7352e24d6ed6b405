// strata/layers/tensor_gradients.hpp - where a layer's backward adds its parameters' gradients,
// with the tensor group's sums derived from how each parameter was registered.
//
// A layer takes the targets of the gradients one backward writes together, adds to them (each
// holds what is there already, as the parameter's gradient does), and says when it is done:
//
//   auto g = scope_.gradients(weight_, bias_);
//   kernels::layernorm_backward(device{}, dx, g[0], g[1], ...);
//   g.written();
//
// A parameter whose gradient here is a share of the group's (tensor_gradient: this rank's tokens
// under sequence parallelism, or its heads) gets a zeroed slot of one scratch buffer; written()
// sums every slot over the group in one all-reduce, adds each to its parameter's gradient and
// marks them written. Any other gets its gradient itself, and written() only marks it. The bytes
// summed are the registration's, the same every step: a layer's cost states them
// (tensor_gradient_bytes).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/kernels/residual.hpp"
#include "strata/layers/parameters.hpp"
#include "strata/layers/tensor_parallel.hpp"

namespace strata {

template <class T, class Device, std::size_t N>
class gradient_targets {
 public:
  gradient_targets(parameter_store<T>& params, tensor_parallel& tp, memory_ledger& ledger,
                   std::array<param_handle, N> handles)
      : params_(&params), tp_(&tp), handles_(handles) {
    std::int64_t shares = 0;
    for (const param_handle h : handles_)
      if (params.summed_over_tensor_group(h)) shares += params.info(h).numel;
    if (shares > 0) scratch_ = buffer<T>(ledger, memory_category::communication, static_cast<std::size_t>(shares));
    std::int64_t at = 0;
    for (std::size_t i = 0; i < N; ++i) {
      if (params.summed_over_tensor_group(handles_[i])) {
        targets_[i] = scratch_.data() + at;
        at += params.info(handles_[i]).numel;
      } else {
        targets_[i] = params.grads(handles_[i]);
      }
    }
  }
  gradient_targets(const gradient_targets&) = delete;
  gradient_targets& operator=(const gradient_targets&) = delete;
  ~gradient_targets() noexcept(false) {
    STRATA_CHECK(done_ || std::uncaught_exceptions() > 0, "gradient_targets: a layer took the gradients of '",
                 params_->info(handles_[0]).name, "' and did not say written()");
  }

  // Where the i-th parameter's gradient is added (in the order given).
  T* operator[](std::size_t i) const { return targets_[i]; }

  // The shares summed over the group and added; every parameter marked written.
  void written() {
    STRATA_CHECK(!done_, "gradient_targets: written() twice");
    done_ = true;
    if (!scratch_.empty()) tp_->sum_over_group(std::span<T>(scratch_.data(), scratch_.size()));
    for (std::size_t i = 0; i < N; ++i) {
      const param_handle h = handles_[i];
      if (params_->summed_over_tensor_group(h)) {
        T* grad = params_->grads(h);
        kernels::residual_forward(Device{}, grad, grad, targets_[i], params_->info(h).numel);
      }
      params_->summed_grad_written(h);
    }
  }

 private:
  parameter_store<T>* params_;
  tensor_parallel* tp_;
  std::array<param_handle, N> handles_;
  std::array<T*, N> targets_{};
  buffer<T> scratch_;
  bool done_ = false;
};

// Whether the tensor group sums a gradient registered as `g`, under split `s`.
constexpr bool tensor_group_sums(tensor_gradient g, const tensor_split& s) {
  switch (g) {
    case tensor_gradient::own: return false;
    case tensor_gradient::token_share: return s.sequence_parallel && s.degree > 1;
    case tensor_gradient::head_share: return s.degree > 1;
  }
  return false;
}
// The bytes each rank sends summing `elements` gradient elements registered as `g` (one
// backward's), for a layer's cost.
constexpr double tensor_gradient_bytes(tensor_gradient g, const tensor_split& s, std::int64_t elements,
                                       std::int64_t element_bytes) {
  return tensor_group_sums(g, s) ? ring_all_reduce_bytes(double(elements * element_bytes), s.degree) : 0.0;
}

}  // namespace strata
