// strata/kernels/cuda/column_sum.cuh - deterministic column sums over rows, for the parameter
// gradients that sum over tokens: Linear's dbias, LayerNorm's dweight and dbias.
//
//   dout, inp [N, C];  mean, rstd [N] (LayerNorm only)
//   sum_a[c] = sum_r dout[r, c]                           (dbias)
//   sum_b[c] = sum_r dout[r, c] * (inp[r, c] - mean[r]) * rstd[r]   (LayerNorm's dweight)
//   out_a[c] += sum_a[c],  out_b[c] += sum_b[c]           (one rounding each)
//
// No atomics: gpu::plan_column_sums cuts the rows into fixed chunks; a 32 x 8 block sums one
// 32-column strip of one chunk (8 row lanes, each sequential, then the lanes in order) into a
// partial; a second kernel adds each column's partials in chunk order. The plan depends on N
// only, so the sums are the same on every GPU and every run.
#pragma once
#include <cstdint>

#include "strata/kernels/cuda/common.cuh"

namespace strata::kernels::cuda_detail {

// grid (col_strips, chunks), block (32, 8). part_a/part_b [chunks, C].
template <class T, bool WithNorm>
__global__ void column_partial_kernel(float* part_a, float* part_b, const T* dout, const T* inp, const float* mean,
                                      const float* rstd, std::int64_t N, std::int64_t C, std::int64_t rows_per_chunk) {
  constexpr int strip = gpu::column_plan::column_strip, lanes = gpu::column_plan::row_lanes;
  __shared__ float sh_a[lanes][strip + 1];
  __shared__ float sh_b[lanes][strip + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const std::int64_t c = std::int64_t(blockIdx.x) * strip + tx;
  const std::int64_t lo = std::int64_t(blockIdx.y) * rows_per_chunk;
  const std::int64_t hi = lo + rows_per_chunk < N ? lo + rows_per_chunk : N;
  float sa = 0.0f, sb = 0.0f;
  if (c < C) {
    for (std::int64_t r = lo + ty; r < hi; r += lanes) {
      const float g = widen(dout[r * C + c]);
      sa += g;
      if constexpr (WithNorm) sb += g * ((widen(inp[r * C + c]) - mean[r]) * rstd[r]);
    }
  }
  sh_a[ty][tx] = sa;
  sh_b[ty][tx] = sb;
  __syncthreads();
  if (ty == 0 && c < C) {
    float ta = 0.0f, tb = 0.0f;
#pragma unroll
    for (int y = 0; y < lanes; ++y) {
      ta += sh_a[y][tx];
      tb += sh_b[y][tx];
    }
    part_a[std::int64_t(blockIdx.y) * C + c] = ta;
    if constexpr (WithNorm) part_b[std::int64_t(blockIdx.y) * C + c] = tb;
  }
}

// out_a[c] += sum over chunks of part_a[:, c] (and out_b with part_b when not null).
template <class T>
__global__ void column_finish_kernel(T* out_a, T* out_b, const float* part_a, const float* part_b, std::int64_t chunks,
                                     std::int64_t C) {
  for (std::int64_t c = thread_index(); c < C; c += grid_stride()) {
    float ta = 0.0f, tb = 0.0f;
    for (std::int64_t k = 0; k < chunks; ++k) {
      ta += part_a[k * C + c];
      if (out_b) tb += part_b[k * C + c];
    }
    if (out_a) out_a[c] = narrow<T>(widen(out_a[c]) + ta);
    if (out_b) out_b[c] = narrow<T>(widen(out_b[c]) + tb);
  }
}

// out_a += column sums of dout; with WithNorm, out_b += column sums of dout * norm. On the
// current stream; partials in stream-ordered scratch.
template <bool WithNorm, class T>
void column_sums(const char* who, T* out_a, T* out_b, const T* dout, const T* inp, const float* mean, const float* rstd,
                 std::int64_t N, std::int64_t C) {
  if (N == 0 || C == 0) return;
  const gpu::column_plan p = gpu::plan_column_sums(N, C);
  const cudaStream_t stream = gpu::current_stream();
  gpu::scratch<float> part(std::size_t(p.chunks * C * (WithNorm ? 2 : 1)));
  float* part_a = part.get();
  float* part_b = WithNorm ? part.get() + p.chunks * C : nullptr;
  const dim3 grid(unsigned(p.col_strips), unsigned(p.chunks));
  const dim3 block(gpu::column_plan::column_strip, gpu::column_plan::row_lanes);
  column_partial_kernel<T, WithNorm>
      <<<grid, block, 0, stream>>>(part_a, part_b, dout, inp, mean, rstd, N, C, p.rows_per_chunk);
  STRATA_CUDA_CHECK_LAUNCH(who);
  const auto d = gpu::elementwise_launch(C, 1);
  column_finish_kernel<T>
      <<<d.grid, d.block, 0, stream>>>(out_a, WithNorm ? out_b : nullptr, part_a, part_b, p.chunks, C);
  STRATA_CUDA_CHECK_LAUNCH(who);
}

}  // namespace strata::kernels::cuda_detail
