// strata/kernels/cuda/reduce.cuh - whole-array helpers on the GPU: the squared norm (gradient
// clipping), a finiteness check (fp16 loss scaling), in-place scaling, type conversion.
//
//   x, dst, src [n]
//
// sum_of_squares is deterministic: fixed chunks of gpu::reduce_chunk elements, one block each,
// summed in double by CUB's BlockReduce (a fixed tree for a fixed block size); then one block
// adds the partials (each thread a strided sequential sum, then BlockReduce). The split depends
// on n only. The host-signature forms that return a value (sum_of_squares, all_finite)
// synchronize the current stream; sum_of_squares_into leaves the result in device memory.
#pragma once
#include <cub/block/block_reduce.cuh>

#include <cstdint>
#include <type_traits>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/cuda/common.cuh"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {

// One block per chunk: partial[chunk] = sum of x^2 over the chunk, in double.
template <class T, int P>
__global__ void __launch_bounds__(gpu::reduce_block)
    sum_of_squares_partial_kernel(double* partial, const T* x, std::int64_t n) {
  using reduce = cub::BlockReduce<double, gpu::reduce_block>;
  __shared__ typename reduce::TempStorage temp;
  const std::int64_t lo = std::int64_t(blockIdx.x) * gpu::reduce_chunk;
  const std::int64_t hi = lo + gpu::reduce_chunk < n ? lo + gpu::reduce_chunk : n;
  double s = 0.0;
  for (std::int64_t i = lo + std::int64_t(threadIdx.x) * P; i < hi; i += std::int64_t(gpu::reduce_block) * P) {
    float v[P];
    load_pack(v, x, i, hi);
#pragma unroll
    for (int j = 0; j < P; ++j) s += double(v[j]) * double(v[j]);
  }
  const double total = reduce(temp).Sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// *out = (accumulate ? *out : 0) + weight * sum of partial[0 .. count). static, as every kernel in
// a header that is not a template: each .cu including it keeps its own (programs link several).
static __global__ void __launch_bounds__(gpu::reduce_final_block)
    sum_partials_kernel(double* out, const double* partial, std::int64_t count, bool accumulate, double weight) {
  using reduce = cub::BlockReduce<double, gpu::reduce_final_block>;
  __shared__ typename reduce::TempStorage temp;
  double s = 0.0;
  for (std::int64_t k = threadIdx.x; k < count; k += gpu::reduce_final_block) s += partial[k];
  const double total = reduce(temp).Sum(s);
  if (threadIdx.x == 0) *out = accumulate ? *out + weight * total : weight * total;
}

template <class T>
__device__ __forceinline__ bool finite_bits(T x) {
  if constexpr (std::is_same_v<T, bf16>) return (x.bits & 0x7f80u) != 0x7f80u;
  else if constexpr (std::is_same_v<T, fp16>) return (x.bits & 0x7c00u) != 0x7c00u;
  else return isfinite(x);
}

// *flag = 0 if any element is inf or NaN (every writer writes the same 0: no race in effect).
template <class T>
__global__ void all_finite_kernel(int* flag, const T* x, std::int64_t n) {
  bool ok = true;
  for (std::int64_t i = thread_index(); i < n; i += grid_stride()) ok &= finite_bits(x[i]);
  if (!ok) *flag = 0;
}

template <class T, int P>
__global__ void scale_kernel(T* x, std::int64_t n, float f) {
  for (std::int64_t k = thread_index(); k * P < n; k += grid_stride()) {
    float v[P];
    load_pack(v, x, k * P, n);
#pragma unroll
    for (int j = 0; j < P; ++j) v[j] *= f;
    store_pack(x, k * P, n, v);
  }
}

template <class To, class From>
__global__ void convert_kernel(To* dst, const From* src, std::int64_t n) {
  for (std::int64_t i = thread_index(); i < n; i += grid_stride()) dst[i] = convert<To>(src[i]);
}

}  // namespace cuda_detail

// Enqueues *out_device = (accumulate ? *out_device : 0) + weight * sum_i x[i]^2 on the current
// stream; no synchronisation. out_device: device memory (e.g. &step_state->sumsq).
template <class T>
void sum_of_squares_into(cuda, const T* x, std::int64_t n, double* out_device, bool accumulate = false,
                         double weight = 1.0) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(n >= 0, "sum_of_squares: negative length ", n);
  const cudaStream_t stream = gpu::current_stream();
  const std::int64_t partials = gpu::reduce_partials(n);
  STRATA_CHECK(partials <= gpu::max_grid_x, "sum_of_squares: n = ", n, " is too long");
  gpu::scratch<double> part(std::size_t(partials > 0 ? partials : 1));
  if (partials > 0) {
    cuda_detail::with_pack<T>(gpu::aligned16(x), [&](auto w) {
      constexpr int P = decltype(w)::value;
      cuda_detail::sum_of_squares_partial_kernel<T, P>
          <<<unsigned(partials), gpu::reduce_block, 0, stream>>>(part.get(), x, n);
    });
    STRATA_CUDA_CHECK_LAUNCH("sum_of_squares");
  }
  cuda_detail::sum_partials_kernel<<<1, gpu::reduce_final_block, 0, stream>>>(out_device, part.get(), partials,
                                                                              accumulate, weight);
  STRATA_CUDA_CHECK_LAUNCH("sum_of_squares (partials)");
}

// sum_i x[i]^2 in double. Synchronizes the current stream.
template <class T>
double sum_of_squares(cuda, const T* x, std::int64_t n) {
  gpu::scratch<double> out(1);
  sum_of_squares_into(cuda{}, x, n, out.get());
  double result = 0;
  STRATA_CUDA_CHECK(cudaMemcpyAsync(&result, out.get(), sizeof result, cudaMemcpyDeviceToHost, gpu::current_stream()));
  gpu::check_device_errors();  // synchronizes
  return result;
}

// True when no element is inf or NaN. Synchronizes the current stream.
template <class T>
bool all_finite(cuda, const T* x, std::int64_t n) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(n >= 0, "all_finite: negative length ", n);
  const cudaStream_t stream = gpu::current_stream();
  gpu::scratch<int> flag(1);
  const int one = 1;
  STRATA_CUDA_CHECK(cudaMemcpyAsync(flag.get(), &one, sizeof one, cudaMemcpyHostToDevice, stream));
  if (n > 0) {
    const auto d = gpu::elementwise_launch(n, 4);
    cuda_detail::all_finite_kernel<T><<<d.grid, d.block, 0, stream>>>(flag.get(), x, n);
    STRATA_CUDA_CHECK_LAUNCH("all_finite");
  }
  int result = 0;
  STRATA_CUDA_CHECK(cudaMemcpyAsync(&result, flag.get(), sizeof result, cudaMemcpyDeviceToHost, stream));
  gpu::check_device_errors();  // synchronizes
  return result == 1;
}

// x *= factor, in fp32 (the factor narrowed to float first, as acc_t<T> on the host).
template <class T>
void scale_in_place(cuda, T* x, std::int64_t n, double factor) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(n >= 0, "scale_in_place: negative length ", n);
  if (n == 0) return;
  const cudaStream_t stream = gpu::current_stream();
  cuda_detail::with_pack<T>(gpu::aligned16(x), [&](auto w) {
    constexpr int P = decltype(w)::value;
    const auto d = gpu::elementwise_launch(n, P);
    cuda_detail::scale_kernel<T, P><<<d.grid, d.block, 0, stream>>>(x, n, float(factor));
  });
  STRATA_CUDA_CHECK_LAUNCH("scale_in_place");
}

// dst[i] = convert<To>(src[i]) (round to nearest even when narrowing); a copy when To == From.
template <class To, class From>
void convert_array(cuda, To* dst, const From* src, std::int64_t n) {
  static_assert(is_scalar_v<To> && is_scalar_v<From>, "convert_array: float, double, bf16 or fp16");
  STRATA_CHECK(n >= 0, "convert_array: negative length ", n);
  if (n == 0) return;
  const cudaStream_t stream = gpu::current_stream();
  if constexpr (std::is_same_v<To, From>) {
    if (static_cast<const void*>(dst) != static_cast<const void*>(src))
      STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, std::size_t(n) * sizeof(To), cudaMemcpyDeviceToDevice, stream));
  } else {
    const auto d = gpu::elementwise_launch(n, 1);
    cuda_detail::convert_kernel<To, From><<<d.grid, d.block, 0, stream>>>(dst, src, n);
    STRATA_CUDA_CHECK_LAUNCH("convert_array");
  }
}

}  // namespace strata::kernels
