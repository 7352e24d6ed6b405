// strata/kernels/cuda/loss_scale.cuh - the device-resident step (core/step_state.hpp): dynamic
// loss scaling, global gradient norm and clipping, with no host round trip per step. The trainer
// keeps its step_state in the model's memory space and calls advance_step(cuda, ...) itself;
// gpu::amp owns one state for a loop written by hand (bench/gpu/gpt2_step.cu):
//
//   gpu::amp amp({.dynamic = true, .max_norm = 1.0}, /*initial_scale*/ 65536.0);
//   per step, all on the current stream:
//     kernels::cross_entropy_forward_backward(cuda{}, ..., dloss, amp.state());   // loss * scale
//     ... backward ...
//     kernels::grad_norm_squared(cuda{}, grads, n, amp.state());   // state.sumsq
//     kernels::advance_step(cuda{}, amp.state(), amp.options());    // advance_step on the GPU
//     kernels::adamw_update(cuda{}, master, w, grads, m, v, n, hyper, amp.state());
//   when logging: step_state s = amp.read();   // synchronizes: s.norm, s.scale, s.skipped
//   amp.check() throws when a non-finite norm was met without dynamic scaling (the host
//   trainer's error).
//
// The rules are strata::advance_step (core/step_state.hpp): plain C++ run by a single GPU
// thread, tested on the CPU.
#pragma once
#include <cstdint>

#include "strata/core/error.hpp"
#include "strata/core/step_state.hpp"
#include "strata/kernels/cuda/reduce.cuh"
#include "strata/kernels/cuda/runtime.cuh"
#include "strata/policy/device.hpp"

namespace strata {

namespace gpu {

// Owns one step_state in device memory.
class amp {
 public:
  // initial_scale: the loss scale of the first step (1 when dynamic scaling is off).
  explicit amp(step_rules o, double initial_scale = 65536.0) : opt_(o), state_(1) {
    step_state s;
    s.scale = o.dynamic ? initial_scale : 1.0;
    STRATA_CHECK(s.scale > 0, "gpu::amp: the initial loss scale must be positive, got ", s.scale);
    state_.upload(&s, 1);
  }
  step_state* state() { return state_.data(); }
  const step_rules& options() const { return opt_; }
  // A copy of the state; synchronizes the device.
  step_state read() const {
    step_state s;
    state_.download(&s, 1);
    return s;
  }
  void check() const {
    const step_state s = read();
    STRATA_CHECK(s.nonfinite_unscaled == 0, "amp: ", s.nonfinite_unscaled,
                 " step(s) produced a non-finite gradient norm and no loss scaling is in use to skip them");
  }

 private:
  step_rules opt_;
  device_buffer<step_state> state_;
};

}  // namespace gpu

namespace kernels {

namespace cuda_detail {
// static: a header kernel that is no template, defined in every .cu that includes it.
static __global__ void advance_step_kernel(step_state* s, step_rules o) {
  if (blockIdx.x == 0 && threadIdx.x == 0) strata::advance_step(*s, o);
}
}  // namespace cuda_detail

// state->sumsq = sum g^2 over grads [n] (accumulate: += for a model in several buffers).
template <class T>
void grad_norm_squared(cuda, const T* grads, std::int64_t n, step_state* state, bool accumulate = false) {
  sum_of_squares_into(cuda{}, grads, n, &state->sumsq, accumulate);
}

// One step's bookkeeping on the device (advance_step): found_inf, norm, loss-scale update,
// apply, grad_mult, step and bias corrections.
inline void advance_step(cuda, step_state* state, const step_rules& o) {
  cuda_detail::advance_step_kernel<<<1, 1, 0, gpu::current_stream()>>>(state, o);
  STRATA_CUDA_CHECK_LAUNCH("advance_step");
}

}  // namespace kernels

}  // namespace strata
