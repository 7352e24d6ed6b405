// strata/kernels/cuda/rmsnorm.cuh - root-mean-square normalisation over the last axis (Llama's
// norm), on the GPU.
//
//   inp, out, dinp, dout [N, C];  weight, dweight [C];  rstd [N] (fp32)
//   out = inp * rstd * weight,  rstd = 1 / sqrt(mean_c(inp^2) + eps)
//   backward, with n = inp * rstd and gw = dout * weight:
//     dinp     = rstd * (gw - n * mean_c(gw * n))      (written, not read)
//     dweight += sum_rows dout * n
//
// residual_rmsnorm_forward: resid = a + b (rounded to T, written out), out = rmsnorm(resid), in
// one pass over the data instead of residual_forward followed by rmsnorm_forward (as
// residual_layernorm_forward does for GPT-2), with the same numbers.
//
// One warp per row, reading the row in 16-byte packs when C is a multiple of the pack width (as
// layernorm.cuh). dweight is a deterministic column sum: gpu::plan_column_sums cuts the rows
// into fixed chunks, a 32 x 8 block sums one 32-column strip of one chunk in a fixed order into
// a partial, and column_sum.cuh's finishing kernel adds each column's partials in chunk order.
// No atomics: bit-identical from run to run and on every GPU.
#pragma once
#include <cstdint>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/cuda/column_sum.cuh"
#include "strata/kernels/cuda/common.cuh"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {

// Normalises row x (final in storage precision) into y; lane-strided packs.
template <class T, int P>
__device__ __forceinline__ void rmsnorm_row(T* y, float* rstd, const T* x, const T* weight, std::int64_t row,
                                            std::int64_t C, float eps, int lane) {
  float sq = 0.0f;
  for (std::int64_t c = std::int64_t(lane) * P; c < C; c += 32 * P) {
    float v[P];
    load_pack(v, x, c, C);  // zeros past C
#pragma unroll
    for (int j = 0; j < P; ++j) sq += v[j] * v[j];
  }
  const float s = 1.0f / sqrtf(warp_sum(sq) / float(C) + eps);
  for (std::int64_t c = std::int64_t(lane) * P; c < C; c += 32 * P) {
    float v[P], w[P], o[P];
    load_pack(v, x, c, C);
    load_pack(w, weight, c, C);
#pragma unroll
    for (int j = 0; j < P; ++j) o[j] = v[j] * s * w[j];
    store_pack(y, c, C, o);
  }
  if (lane == 0 && rstd) rstd[row] = s;
}

// one warp per row; rows [N]
template <class T, int P>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* weight, std::int64_t N,
                                       std::int64_t C, float eps) {
  const std::int64_t row = std::int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= N) return;
  rmsnorm_row<T, P>(out + row * C, rstd, inp + row * C, weight, row, C, eps, int(threadIdx.x % 32));
}

// resid = a + b, then out = rmsnorm(resid); one warp per row.
template <class T, int P>
__global__ void residual_rmsnorm_forward_kernel(T* resid, T* out, float* rstd, const T* a, const T* b, const T* weight,
                                                std::int64_t N, std::int64_t C, float eps) {
  const std::int64_t row = std::int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= N) return;
  const int lane = int(threadIdx.x % 32);
  T* r = resid + row * C;
  residual_row<T, P>(r, a + row * C, b + row * C, C, lane);
  rmsnorm_row<T, P>(out + row * C, rstd, r, weight, row, C, eps, lane);
}

// dinp = rstd * (gw - n * mean_c(gw * n)), gw = dout * weight, n = inp * rstd; one warp per row.
template <class T, int P>
__global__ void rmsnorm_backward_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight, const float* rstd,
                                             std::int64_t N, std::int64_t C) {
  const std::int64_t row = std::int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= N) return;
  const int lane = int(threadIdx.x % 32);
  const T* x = inp + row * C;
  const T* dy = dout + row * C;
  T* dx = dinp + row * C;
  const float s = rstd[row];
  float dot = 0.0f;
  for (std::int64_t c = std::int64_t(lane) * P; c < C; c += 32 * P) {
    float v[P], g[P], w[P];
    load_pack(v, x, c, C);
    load_pack(g, dy, c, C);
    load_pack(w, weight, c, C);
#pragma unroll
    for (int j = 0; j < P; ++j) dot += g[j] * w[j] * (v[j] * s);
  }
  const float gwn_mean = warp_sum(dot) / float(C);
  for (std::int64_t c = std::int64_t(lane) * P; c < C; c += 32 * P) {
    float v[P], g[P], w[P], d[P];
    load_pack(v, x, c, C);
    load_pack(g, dy, c, C);
    load_pack(w, weight, c, C);
#pragma unroll
    for (int j = 0; j < P; ++j) d[j] = s * (g[j] * w[j] - (v[j] * s) * gwn_mean);
    store_pack(dx, c, C, d);
  }
}

// part[chunk, c] = sum over the chunk's rows of dout[r, c] * inp[r, c] * rstd[r].
// grid (col_strips, chunks), block (column_strip, row_lanes): the same fixed order as
// column_sum.cuh's column_partial_kernel (row lanes sequential, then the lanes in order).
template <class T>
__global__ void rmsnorm_dweight_partial_kernel(float* part, const T* dout, const T* inp, const float* rstd,
                                               std::int64_t N, std::int64_t C, std::int64_t rows_per_chunk) {
  constexpr int strip = gpu::column_plan::column_strip, lanes = gpu::column_plan::row_lanes;
  __shared__ float sh[lanes][strip + 1];
  const int tx = int(threadIdx.x), ty = int(threadIdx.y);
  const std::int64_t c = std::int64_t(blockIdx.x) * strip + tx;
  const std::int64_t lo = std::int64_t(blockIdx.y) * rows_per_chunk;
  const std::int64_t hi = lo + rows_per_chunk < N ? lo + rows_per_chunk : N;
  float acc = 0.0f;
  if (c < C)
    for (std::int64_t r = lo + ty; r < hi; r += lanes)
      acc += widen(dout[r * C + c]) * (widen(inp[r * C + c]) * rstd[r]);
  sh[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && c < C) {
    float t = 0.0f;
#pragma unroll
    for (int y = 0; y < lanes; ++y) t += sh[y][tx];
    part[std::int64_t(blockIdx.y) * C + c] = t;
  }
}

}  // namespace cuda_detail

// rstd may be null when no backward pass follows (inference).
template <class T>
void rmsnorm_forward(cuda, T* out, acc_t<T>* rstd /*nullable*/, const T* inp, const T* weight, std::int64_t N,
                     std::int64_t C, acc_t<T> eps) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(N >= 0 && C > 0, "rmsnorm_forward: need N >= 0 and C > 0, got N = ", N, ", C = ", C);
  if (N == 0) return;
  const cudaStream_t stream = gpu::current_stream();
  const auto d = gpu::rows_launch(N);
  cuda_detail::with_pack<T>(gpu::rows_vectorized<T>(C, {out, inp, weight}), [&](auto w) {
    constexpr int P = decltype(w)::value;
    cuda_detail::rmsnorm_forward_kernel<T, P><<<d.grid, d.block, 0, stream>>>(out, rstd, inp, weight, N, C, eps);
  });
  STRATA_CUDA_CHECK_LAUNCH("rmsnorm_forward");
}

// resid = a + b, then out = rmsnorm(resid); rstd may be null.
template <class T>
void residual_rmsnorm_forward(cuda, T* resid, T* out, acc_t<T>* rstd /*nullable*/, const T* a, const T* b,
                              const T* weight, std::int64_t N, std::int64_t C, acc_t<T> eps) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(N >= 0 && C > 0, "residual_rmsnorm_forward: need N >= 0 and C > 0, got N = ", N, ", C = ", C);
  if (N == 0) return;
  const cudaStream_t stream = gpu::current_stream();
  const auto d = gpu::rows_launch(N);
  cuda_detail::with_pack<T>(gpu::rows_vectorized<T>(C, {resid, out, a, b, weight}), [&](auto w) {
    constexpr int P = decltype(w)::value;
    cuda_detail::residual_rmsnorm_forward_kernel<T, P>
        <<<d.grid, d.block, 0, stream>>>(resid, out, rstd, a, b, weight, N, C, eps);
  });
  STRATA_CUDA_CHECK_LAUNCH("residual_rmsnorm_forward");
}

// Writes dinp (not read) and accumulates (+=) into dweight, as the host kernel does. rstd: the
// forward's [N] (required).
template <class T>
void rmsnorm_backward(cuda, T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const acc_t<T>* rstd,
                      std::int64_t N, std::int64_t C) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(N >= 0 && C > 0, "rmsnorm_backward: need N >= 0 and C > 0, got N = ", N, ", C = ", C);
  STRATA_CHECK(rstd != nullptr, "rmsnorm_backward: rstd from the forward pass is required");
  if (N == 0) return;
  const cudaStream_t stream = gpu::current_stream();
  const auto d = gpu::rows_launch(N);
  cuda_detail::with_pack<T>(gpu::rows_vectorized<T>(C, {dinp, dout, inp, weight}), [&](auto w) {
    constexpr int P = decltype(w)::value;
    cuda_detail::rmsnorm_backward_dinp_kernel<T, P>
        <<<d.grid, d.block, 0, stream>>>(dinp, dout, inp, weight, rstd, N, C);
  });
  STRATA_CUDA_CHECK_LAUNCH("rmsnorm_backward");

  // dweight: fixed chunks of rows -> partials -> each column's partials added in chunk order.
  const gpu::column_plan p = gpu::plan_column_sums(N, C);
  gpu::scratch<float> part(std::size_t(p.chunks * C));
  const dim3 grid(unsigned(p.col_strips), unsigned(p.chunks));
  const dim3 block(gpu::column_plan::column_strip, gpu::column_plan::row_lanes);
  cuda_detail::rmsnorm_dweight_partial_kernel<T>
      <<<grid, block, 0, stream>>>(part.get(), dout, inp, rstd, N, C, p.rows_per_chunk);
  STRATA_CUDA_CHECK_LAUNCH("rmsnorm_backward (dweight)");
  const auto f = gpu::elementwise_launch(C, 1);
  cuda_detail::column_finish_kernel<T>
      <<<f.grid, f.block, 0, stream>>>(dweight, nullptr, part.get(), nullptr, p.chunks, C);
  STRATA_CUDA_CHECK_LAUNCH("rmsnorm_backward (dweight)");
}

}  // namespace strata::kernels
