// strata/kernels/cuda/layernorm.cuh - layer normalisation over the last axis, on the GPU, and
// the residual add fused in front of it.
//
//   inp, out, dinp, dout [N, C];  weight, bias, dweight, dbias [C];  mean, rstd [N] (fp32)
//   out = (inp - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps),  var biased (/C)
//
// One warp per row, reading the row in 16-byte packs when C is a multiple of the pack width.
// Mean and variance take two passes over the row (the row is in L1 by then), as the host does:
// no E[x^2] - E[x]^2 cancellation. The backward's dinp is per row too; dweight and dbias are
// deterministic column sums (column_sum.cuh).
//
// residual_layernorm_forward (no host counterpart yet): resid = a + b (rounded to T, written
// out), out = layernorm(resid): one pass over the data instead of residual_forward followed by
// layernorm_forward, with the same numbers.
#pragma once
#include <cstdint>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/cuda/column_sum.cuh"
#include "strata/kernels/cuda/common.cuh"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {

// Normalises row x (already final in storage precision) into y; lane-strided packs.
template <class T, int P>
__device__ __forceinline__ void layernorm_row(T* y, float* mean, float* rstd, const T* x, const T* weight,
                                              const T* bias, std::int64_t row, std::int64_t C, float eps, int lane) {
  float sum = 0.0f;
  for (std::int64_t c = std::int64_t(lane) * P; c < C; c += 32 * P) {
    float v[P];
    load_pack(v, x, c, C);
#pragma unroll
    for (int j = 0; j < P; ++j) sum += v[j];
  }
  const float m = warp_sum(sum) / float(C);
  float sq = 0.0f;
  for (std::int64_t c = std::int64_t(lane) * P; c < C; c += 32 * P) {
    float v[P];
    load_pack(v, x, c, C);
#pragma unroll
    for (int j = 0; j < P; ++j)
      if (c + j < C) sq += (v[j] - m) * (v[j] - m);
  }
  const float s = 1.0f / sqrtf(warp_sum(sq) / float(C) + eps);
  for (std::int64_t c = std::int64_t(lane) * P; c < C; c += 32 * P) {
    float v[P], w[P], b[P], o[P];
    load_pack(v, x, c, C);
    load_pack(w, weight, c, C);
    load_pack(b, bias, c, C);
#pragma unroll
    for (int j = 0; j < P; ++j) o[j] = (v[j] - m) * s * w[j] + b[j];
    store_pack(y, c, C, o);
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = s;
  }
}

// one warp per row; rows [N]
template <class T, int P>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                                         std::int64_t N, std::int64_t C, float eps) {
  const std::int64_t row = std::int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= N) return;
  layernorm_row<T, P>(out + row * C, mean, rstd, inp + row * C, weight, bias, row, C, eps, int(threadIdx.x % 32));
}

// resid = a + b, then out = layernorm(resid); one warp per row.
template <class T, int P>
__global__ void residual_layernorm_forward_kernel(T* resid, T* out, float* mean, float* rstd, const T* a, const T* b,
                                                  const T* weight, const T* bias, std::int64_t N, std::int64_t C,
                                                  float eps) {
  const std::int64_t row = std::int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= N) return;
  const int lane = int(threadIdx.x % 32);
  T* r = resid + row * C;
  residual_row<T, P>(r, a + row * C, b + row * C, C, lane);
  layernorm_row<T, P>(out + row * C, mean, rstd, r, weight, bias, row, C, eps, lane);
}

// dinp = rstd * (dnorm - mean_c(dnorm) - norm * mean_c(dnorm * norm)), dnorm = dout * weight; dinp
// is written, not read
template <class T, int P>
__global__ void layernorm_backward_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight, const float* mean,
                                               const float* rstd, std::int64_t N, std::int64_t C) {
  const std::int64_t row = std::int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= N) return;
  const int lane = int(threadIdx.x % 32);
  const T* x = inp + row * C;
  const T* dy = dout + row * C;
  T* dx = dinp + row * C;
  const float m = mean[row], s = rstd[row];
  float dsum = 0.0f, dnsum = 0.0f;
  for (std::int64_t c = std::int64_t(lane) * P; c < C; c += 32 * P) {
    float v[P], g[P], w[P];
    load_pack(v, x, c, C);
    load_pack(g, dy, c, C);
    load_pack(w, weight, c, C);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const float dnorm = g[j] * w[j];
      dsum += dnorm;
      dnsum += dnorm * ((v[j] - m) * s);
    }
  }
  const float dnorm_mean = warp_sum(dsum) / float(C), dnorm_norm_mean = warp_sum(dnsum) / float(C);
  for (std::int64_t c = std::int64_t(lane) * P; c < C; c += 32 * P) {
    float v[P], g[P], w[P], d[P];
    load_pack(v, x, c, C);
    load_pack(g, dy, c, C);
    load_pack(w, weight, c, C);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const float norm = (v[j] - m) * s;
      d[j] = s * (g[j] * w[j] - dnorm_mean - norm * dnorm_norm_mean);
    }
    store_pack(dx, c, C, d);
  }
}

}  // namespace cuda_detail

// mean and rstd may be null when no backward pass follows (inference).
template <class T>
void layernorm_forward(cuda, T* out, acc_t<T>* mean /*nullable*/, acc_t<T>* rstd /*nullable*/, const T* inp,
                       const T* weight, const T* bias, std::int64_t N, std::int64_t C, acc_t<T> eps) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(N >= 0 && C > 0, "layernorm_forward: need N >= 0 and C > 0, got N = ", N, ", C = ", C);
  if (N == 0) return;
  const cudaStream_t stream = gpu::current_stream();
  const auto d = gpu::rows_launch(N);
  cuda_detail::with_pack<T>(gpu::rows_vectorized<T>(C, {out, inp, weight, bias}), [&](auto w) {
    constexpr int P = decltype(w)::value;
    cuda_detail::layernorm_forward_kernel<T, P>
        <<<d.grid, d.block, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C, eps);
  });
  STRATA_CUDA_CHECK_LAUNCH("layernorm_forward");
}

// resid[N, C] = a + b (may alias a or b), out = layernorm(resid). The same numbers as
// residual_forward followed by layernorm_forward.
template <class T>
void residual_layernorm_forward(cuda, T* resid, T* out, acc_t<T>* mean /*nullable*/, acc_t<T>* rstd /*nullable*/,
                                const T* a, const T* b, const T* weight, const T* bias, std::int64_t N, std::int64_t C,
                                acc_t<T> eps) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(N >= 0 && C > 0, "residual_layernorm_forward: need N >= 0 and C > 0, got N = ", N, ", C = ", C);
  if (N == 0) return;
  const cudaStream_t stream = gpu::current_stream();
  const auto d = gpu::rows_launch(N);
  cuda_detail::with_pack<T>(gpu::rows_vectorized<T>(C, {resid, out, a, b, weight, bias}), [&](auto w) {
    constexpr int P = decltype(w)::value;
    cuda_detail::residual_layernorm_forward_kernel<T, P>
        <<<d.grid, d.block, 0, stream>>>(resid, out, mean, rstd, a, b, weight, bias, N, C, eps);
  });
  STRATA_CUDA_CHECK_LAUNCH("residual_layernorm_forward");
}

// Writes dinp (not read) and accumulates (+=) into dweight and dbias, as the host kernel does
// (see it for the formulas).
template <class T>
void layernorm_backward(cuda, T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const acc_t<T>* mean, const acc_t<T>* rstd, std::int64_t N, std::int64_t C) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(N >= 0 && C > 0, "layernorm_backward: need N >= 0 and C > 0, got N = ", N, ", C = ", C);
  STRATA_CHECK(mean != nullptr && rstd != nullptr,
               "layernorm_backward: mean and rstd from the forward pass are required");
  if (N == 0) return;
  const cudaStream_t stream = gpu::current_stream();
  const auto d = gpu::rows_launch(N);
  cuda_detail::with_pack<T>(gpu::rows_vectorized<T>(C, {dinp, dout, inp, weight}), [&](auto w) {
    constexpr int P = decltype(w)::value;
    cuda_detail::layernorm_backward_dinp_kernel<T, P>
        <<<d.grid, d.block, 0, stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  });
  STRATA_CUDA_CHECK_LAUNCH("layernorm_backward");
  cuda_detail::column_sums<true, T>("layernorm_backward", dbias, dweight, dout, inp, mean, rstd, N, C);
}

}  // namespace strata::kernels
