// strata/kernels/cuda/gelu.cuh - GELU, element-wise, on the GPU: the tanh approximation (GPT-2's)
// or the exact form (gelu_form.hpp).
//
//   tanh:  out = x s,  s = sigmoid(2u) = (1 + tanh u) / 2,  u = sqrt(2/pi) (x + 0.044715 x^3)    [n]
//          dinp  = dout * (s + 2 x s (1 - s) du/dx)
//   exact: out = x Φ(x), Φ(x) = erfc(-x / sqrt 2) / 2;  dinp = dout * (Φ(x) + x exp(-x²/2) / sqrt(2π))
//
// The same formulas as kernels/host/gelu.hpp, in fp32 (expf, not the fast __expf). Each thread
// handles one 16-byte pack (8 bf16 / 4 float) when every pointer is 16-byte aligned.
#pragma once
#include <cstdint>
#include <type_traits>

#include "strata/core/error.hpp"
#include "strata/kernels/cuda/column_sum.cuh"
#include "strata/kernels/cuda/common.cuh"
#include "strata/kernels/gelu_form.hpp"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {
__device__ __forceinline__ float gelu_s(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 1.0f / (1.0f + expf(-2.0f * u));
}
__device__ __forceinline__ float gelu_du_dx(float x) { return 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x); }
__device__ __forceinline__ float gelu_exact_cdf(float x) { return 0.5f * erfcf(-x * 0.7071067811865476f); }
template <bool Exact>
__device__ __forceinline__ float gelu_value(float x) {
  if constexpr (Exact) return x * gelu_exact_cdf(x);
  else return x * gelu_s(x);
}
template <bool Exact>
__device__ __forceinline__ float gelu_slope(float x) {
  if constexpr (Exact) return gelu_exact_cdf(x) + x * 0.3989422804014327f * expf(-0.5f * x * x);
  else {
    const float s = gelu_s(x);
    return s + 2.0f * x * s * (1.0f - s) * gelu_du_dx(x);
  }
}

// inp, out [n]
template <class T, int P, bool Exact>
__global__ void gelu_forward_kernel(T* out, const T* inp, std::int64_t n) {
  for (std::int64_t k = thread_index(); k * P < n; k += grid_stride()) {
    float x[P], y[P];
    load_pack(x, inp, k * P, n);
#pragma unroll
    for (int j = 0; j < P; ++j) y[j] = gelu_value<Exact>(x[j]);
    store_pack(out, k * P, n, y);
  }
}

// dinp, inp, dout [n]; dinp = dout * gelu'(inp)
template <class T, int P, bool Exact>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, std::int64_t n) {
  for (std::int64_t k = thread_index(); k * P < n; k += grid_stride()) {
    float x[P], g[P], d[P];
    load_pack(x, inp, k * P, n);
    load_pack(g, dout, k * P, n);
#pragma unroll
    for (int j = 0; j < P; ++j) d[j] = gelu_slope<Exact>(x[j]) * g[j];
    store_pack(dinp, k * P, n, d);
  }
}
}  // namespace cuda_detail

template <class T>
void gelu_forward(cuda, T* out, const T* inp, std::int64_t n, gelu_form form = gelu_form::tanh) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(n >= 0, "gelu_forward: negative length ", n);
  if (n == 0) return;
  const cudaStream_t stream = gpu::current_stream();
  cuda_detail::with_pack<T>(gpu::all_aligned16(out, inp), [&](auto w) {
    constexpr int P = decltype(w)::value;
    const auto d = gpu::elementwise_launch(n, P);
    if (form == gelu_form::exact)
      cuda_detail::gelu_forward_kernel<T, P, true><<<d.grid, d.block, 0, stream>>>(out, inp, n);
    else cuda_detail::gelu_forward_kernel<T, P, false><<<d.grid, d.block, 0, stream>>>(out, inp, n);
  });
  STRATA_CUDA_CHECK_LAUNCH("gelu_forward");
}

// Writes dinp (not read: a fresh buffer need not be zeroed).
template <class T>
void gelu_backward(cuda, T* dinp, const T* inp, const T* dout, std::int64_t n, gelu_form form = gelu_form::tanh) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(n >= 0, "gelu_backward: negative length ", n);
  if (n == 0) return;
  const cudaStream_t stream = gpu::current_stream();
  cuda_detail::with_pack<T>(gpu::all_aligned16(dinp, inp, dout), [&](auto w) {
    constexpr int P = decltype(w)::value;
    const auto d = gpu::elementwise_launch(n, P);
    if (form == gelu_form::exact)
      cuda_detail::gelu_backward_kernel<T, P, true><<<d.grid, d.block, 0, stream>>>(dinp, inp, dout, n);
    else cuda_detail::gelu_backward_kernel<T, P, false><<<d.grid, d.block, 0, stream>>>(dinp, inp, dout, n);
  });
  STRATA_CUDA_CHECK_LAUNCH("gelu_backward");
}

// dpre [N, OC] = dact · GELU'(pre) (written, not read) and dbias [OC] (nullable) += its column
// sums: gelu_backward, then the deterministic column sum linear_backward uses (column_sum.cuh).
template <class T>
void bias_gelu_backward(cuda, T* dpre, std::type_identity_t<T>* dbias /*nullable*/, const T* pre, const T* dact,
                        std::int64_t N, std::int64_t OC, gelu_form form = gelu_form::tanh) {
  STRATA_CHECK(N >= 0 && OC > 0, "bias_gelu_backward: need N >= 0 and OC > 0, got N = ", N, ", OC = ", OC);
  gelu_backward(cuda{}, dpre, pre, dact, N * OC, form);
  if (dbias)
    cuda_detail::column_sums<false, T>("bias_gelu_backward (dbias)", dbias, nullptr, dpre, nullptr, nullptr, nullptr, N,
                                       OC);
}

}  // namespace strata::kernels
