// strata/kernels/cuda/adamw.cuh - one AdamW step over a flat array of parameters, on the GPU.
//
//   master, m, v [n] (M = float or double);  weights, grad [n] (T, the storage type)
//
// Operation by operation what kernels/host/adamw.hpp does (torch.optim.AdamW's single-tensor
// path), in M; the fp32 master weights and both moments are read and written, and the bf16/fp16
// copy of the weights written, in the same pass. The step's scalars are derived by
// gpu::make_adamw_scalars (launch_config.hpp), the host kernel's formulas, shared by host and
// device code.
//
// Two entry points: the host signature (step and grad_scale from the host), and one reading
// them from a device-resident step_state (core/step_state.hpp): the step is skipped on the device
// when amp->apply is 0, and every gradient is multiplied by grad_scale * amp->grad_mult (clip
// factor / loss scale) - no host round trip.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/step_state.hpp"
#include "strata/kernels/cuda/common.cuh"
#include "strata/kernels/host/adamw.hpp"  // adamw_hyper (plain C++)
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {

struct adamw_args {
  double lr, beta1, beta2, eps, weight_decay, grad_scale;
};

__device__ __forceinline__ float widen_to(float, float x) { return x; }
__device__ __forceinline__ double widen_to(double, float x) { return double(x); }

template <class T, class M, int P>
__global__ void adamw_kernel(M* master, T* weights, const T* grad, M* m, M* v, std::int64_t n,
                             gpu::adamw_scalars<M> host_scalars, adamw_args a, const step_state* amp) {
  gpu::adamw_scalars<M> s = host_scalars;
  if (amp) {
    if (!amp->apply) return;  // the whole grid: an overflowed step
    s = gpu::make_adamw_scalars<M>(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, amp->bias_correction1,
                                   amp->bias_correction2, a.grad_scale * amp->grad_mult);
  }
  for (std::int64_t k = thread_index(); k * P < n; k += grid_stride()) {
    const std::int64_t i0 = k * P;
    float g32[P];
    load_pack(g32, grad, i0, n);
    float out[P];
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const std::int64_t i = i0 + j;
      if (i >= n) {
        out[j] = 0.0f;
        continue;
      }
      const M g = widen_to(M{}, g32[j]) * s.scale;
      M p = master[i] * s.decay;
      const M mi = s.lerp_from_start ? m[i] + s.one_minus_b1 * (g - m[i]) : g - (g - m[i]) * s.one_minus_w;
      const M vi = v[i] * s.b2 + s.one_minus_b2 * g * g;
      const M denom = sqrt(vi) / s.bc2_sqrt + s.eps;
      p = p - s.step_size * (mi / denom);
      m[i] = mi;
      v[i] = vi;
      master[i] = p;
      out[j] = float(p);
    }
    // When T == M the weights are the master copy (they may alias): store the same value.
    if constexpr (std::is_same_v<T, M>) {
      if (static_cast<void*>(weights) != static_cast<void*>(master)) store_pack(weights, i0, n, out);
    } else {
      store_pack(weights, i0, n, out);
    }
  }
}

template <class T, class M>
void adamw_launch(M* master, T* weights, const T* grad, M* m, M* v, std::int64_t n, const gpu::adamw_scalars<M>& s,
                  const adamw_args& a, const step_state* amp) {
  static_assert(supported_v<T>, "strata CUDA kernels take float, bf16 or fp16 weights");
  static_assert(std::is_same_v<M, float> || std::is_same_v<M, double>,
                "strata::kernels::adamw_update: master weights and moments must be float or double");
  if (n == 0) return;
  const cudaStream_t stream = gpu::current_stream();
  with_pack<T>(gpu::all_aligned16(master, weights, grad, m, v), [&](auto w) {
    constexpr int P = decltype(w)::value;
    const auto d = gpu::elementwise_launch(n, P);
    adamw_kernel<T, M, P><<<d.grid, d.block, 0, stream>>>(master, weights, grad, m, v, n, s, a, amp);
  });
  STRATA_CUDA_CHECK_LAUNCH("adamw_update");
}

inline void check_adamw(std::int64_t n, const adamw_hyper& h) {
  STRATA_CHECK(n >= 0, "adamw_update: negative length ", n);
  STRATA_CHECK(h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1,
               "adamw_update: betas must lie in [0, 1), got beta1 = ", h.beta1, ", beta2 = ", h.beta2);
}

}  // namespace cuda_detail

// weights may alias master when T == M (the weights are their own master copy).
template <class T, class M>
void adamw_update(cuda, M* master, T* weights, const T* grad, M* m, M* v, std::int64_t n, const adamw_hyper& h,
                  int step, double grad_scale) {
  cuda_detail::check_adamw(n, h);
  STRATA_CHECK(step >= 1, "adamw_update: step is 1-based, got ", step);
  const double bc1 = 1.0 - std::pow(h.beta1, step), bc2 = 1.0 - std::pow(h.beta2, step);
  const auto s = gpu::make_adamw_scalars<M>(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, bc1, bc2, grad_scale);
  cuda_detail::adamw_launch<T, M>(master, weights, grad, m, v, n, s,
                                  {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, grad_scale}, nullptr);
}

// The device-driven step: skipped when amp->apply == 0; step count, bias corrections and the
// gradient multiplier (clip / loss scale, times grad_scale) come from *amp, written by
// kernels::advance_step earlier on the same stream. h.beta1/beta2 must equal the step_rules'.
template <class T, class M>
void adamw_update(cuda, M* master, T* weights, const T* grad, M* m, M* v, std::int64_t n, const adamw_hyper& h,
                  const step_state* amp, double grad_scale = 1.0) {
  cuda_detail::check_adamw(n, h);
  STRATA_CHECK(amp != nullptr, "adamw_update: the device-driven overload needs a step_state");
  const auto unused = gpu::make_adamw_scalars<M>(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, 1.0, 1.0, grad_scale);
  cuda_detail::adamw_launch<T, M>(master, weights, grad, m, v, n, unused,
                                  {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, grad_scale}, amp);
}

}  // namespace strata::kernels
