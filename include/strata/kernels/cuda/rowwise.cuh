// strata/kernels/cuda/rowwise.cuh - the GPU half of the row-wise building blocks
// (kernels/rowwise.hpp says what they do).
//
// row_reduce: one block per row (gpu::row_reduce_block(cols) threads, a function of the row
// length only). Thread t sums the terms of columns t, t + block, ... in order; each warp adds its
// threads' sums by an XOR butterfly, and every thread adds the warps' sums in warp order: one
// fixed order, the same bits on every run and every GPU. Thread 0 calls finish; every thread
// then writes its columns. sum_columns: gpu::plan_column_sums's fixed row chunks (as
// column_sum.cuh), a 32 x 8 block per 32-column strip of one chunk, then each column's chunk
// sums in chunk order. No atomics. The ops are copied to the device: structs of pointers and
// numbers with STRATA_HD members.
#pragma once
#include <cstdint>
#include <type_traits>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/cuda/common.cuh"
#include "strata/kernels/host/rowwise.hpp"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {

template <class A>
__device__ __forceinline__ A warp_sum_any(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class Op>
__global__ void row_reduce_kernel(Op op, std::int64_t rows, std::int64_t cols) {
  using A = rowwise_detail::term_t<Op>;
  using V = std::remove_cvref_t<decltype(op.finish(std::int64_t(0), A(0)))>;
  __shared__ A warp_sums[32];
  __shared__ alignas(V) unsigned char value_bytes[sizeof(V)];
  const int t = int(threadIdx.x), warps = int(blockDim.x) / 32;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    A s = A(0);
    for (std::int64_t c = t; c < cols; c += blockDim.x) s += op.term(r, c);
    s = warp_sum_any(s);
    if (t % 32 == 0) warp_sums[t / 32] = s;
    __syncthreads();
    A total = A(0);
    for (int w = 0; w < warps; ++w) total += warp_sums[w];
    if (t == 0) *reinterpret_cast<V*>(value_bytes) = op.finish(r, total);
    __syncthreads();
    const V v = *reinterpret_cast<const V*>(value_bytes);
    for (std::int64_t c = t; c < cols; c += blockDim.x) op.write(r, c, v);
    __syncthreads();  // warp_sums and the value are reused by the next row
  }
}

// part[chunk, c] = the chunk's rows' terms of column c: 8 row lanes each in row order, then the
// lanes in order (column_sum.cuh's order).
template <class A, class Term>
__global__ void sum_columns_partial_kernel(A* part, Term term, std::int64_t rows, std::int64_t cols,
                                           std::int64_t rows_per_chunk) {
  constexpr int strip = gpu::column_plan::column_strip, lanes = gpu::column_plan::row_lanes;
  __shared__ A sh[lanes][strip + 1];
  const int tx = int(threadIdx.x), ty = int(threadIdx.y);
  const std::int64_t c = std::int64_t(blockIdx.x) * strip + tx;
  const std::int64_t lo = std::int64_t(blockIdx.y) * rows_per_chunk;
  const std::int64_t hi = lo + rows_per_chunk < rows ? lo + rows_per_chunk : rows;
  A acc = A(0);
  if (c < cols)
    for (std::int64_t r = lo + ty; r < hi; r += lanes) acc += term(r, c);
  sh[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && c < cols) {
    A s = A(0);
#pragma unroll
    for (int y = 0; y < lanes; ++y) s += sh[y][tx];
    part[std::int64_t(blockIdx.y) * cols + c] = s;
  }
}

template <class T, class A>
__global__ void sum_columns_finish_kernel(T* out, const A* part, std::int64_t chunks, std::int64_t cols) {
  for (std::int64_t c = thread_index(); c < cols; c += grid_stride()) {
    A s = A(0);
    for (std::int64_t k = 0; k < chunks; ++k) s += part[k * cols + c];
    out[c] = convert<T>(convert<A>(out[c]) + s);
  }
}

}  // namespace cuda_detail

template <class Op>
void row_reduce(cuda, std::int64_t rows, std::int64_t cols, Op op) {
  STRATA_CHECK(rows >= 0 && cols > 0, "row_reduce: need rows >= 0 and cols > 0, got ", rows, " x ", cols);
  if (rows == 0) return;
  const unsigned grid = unsigned(rows < gpu::max_grid_x ? rows : gpu::max_grid_x);
  cuda_detail::row_reduce_kernel<<<grid, unsigned(gpu::row_reduce_block(cols)), 0, gpu::current_stream()>>>(op, rows,
                                                                                                            cols);
  STRATA_CUDA_CHECK_LAUNCH("row_reduce");
}

template <class T, class Term>
void sum_columns(cuda, std::int64_t rows, std::int64_t cols, T* out, Term term) {
  using A = rowwise_detail::column_term_t<Term>;
  STRATA_CHECK(rows >= 0 && cols >= 0, "sum_columns: negative extent ", rows, " x ", cols);
  if (rows == 0 || cols == 0) return;
  const gpu::column_plan p = gpu::plan_column_sums(rows, cols);
  const cudaStream_t stream = gpu::current_stream();
  gpu::scratch<A> part(std::size_t(p.chunks * cols));
  const dim3 grid(unsigned(p.col_strips), unsigned(p.chunks));
  const dim3 block(gpu::column_plan::column_strip, gpu::column_plan::row_lanes);
  cuda_detail::sum_columns_partial_kernel<A>
      <<<grid, block, 0, stream>>>(part.get(), term, rows, cols, p.rows_per_chunk);
  STRATA_CUDA_CHECK_LAUNCH("sum_columns");
  const auto f = gpu::elementwise_launch(cols, 1);
  cuda_detail::sum_columns_finish_kernel<<<f.grid, f.block, 0, stream>>>(out, part.get(), p.chunks, cols);
  STRATA_CUDA_CHECK_LAUNCH("sum_columns");
}

}  // namespace strata::kernels
