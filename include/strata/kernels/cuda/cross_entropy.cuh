// strata/kernels/cuda/cross_entropy.cuh - softmax cross-entropy over the vocabulary on the GPU,
// fused with its backward so no probability buffer is ever held.
//
//   logits [N, Vp]  row stride Vp >= V; columns V .. Vp-1 are padding (never part of the softmax)
//   targets [N] in [0, V),  losses [N] (fp32):  losses[i] = logsumexp(row_i) - row_i[target_i]
//   forward_backward then overwrites each row with dL/dlogits for L = dloss * sum_i losses[i]:
//     row[v] = (softmax(row)[v] - [v == target]) * dloss  for v < V,  0 for the padding.
//
// One block per row. Pass 1: each thread keeps a running (max, sum of exp) over its strided
// elements (online softmax), combined by a CUB block reduction (a fixed tree: deterministic).
// Pass 2 (forward_backward): writes the gradient in place. A target outside [0, V) gives a NaN
// loss, a zero gradient row, and an entry in the device error record.
//
// The overload taking a step_state* multiplies dloss by the device-resident loss scale, so
// a step with dynamic loss scaling needs no host round trip (core/step_state.hpp).
//
// Vocabulary-parallel pieces (tensor parallelism; the host header has the full contract): this
// rank holds logits [N, Vl], global columns [v_begin, v_begin + Vl), those >= V being padding.
//   vocab_parallel_max     one block per row: max over the real columns (CUB block reduction);
//                          a target outside [0, V) goes to the device error record
//   vocab_parallel_sums    one block per row: sum of exp(x - row_max) (CUB block reduction, a
//                          fixed tree) and the target's logit when this rank holds it
//   vocab_parallel_finish  the losses, one thread per row; with logits, one block per row that
//                          also overwrites them with the gradient. A target outside [0, V) gives
//                          a NaN loss and a zero gradient row, as above (vocab_parallel_max, the
//                          step the host checks in, has recorded it).
#pragma once
#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/step_state.hpp"
#include "strata/kernels/cuda/common.cuh"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {

struct max_sum {
  float m, s;
};
// (m1, s1) + (m2, s2) = (max, s1 e^(m1 - max) + s2 e^(m2 - max)); -inf parts contribute 0.
__device__ __forceinline__ max_sum combine(max_sum a, max_sum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}
struct max_sum_op {
  __device__ __forceinline__ max_sum operator()(const max_sum& a, const max_sum& b) const { return combine(a, b); }
};

template <class T, int P, int Block>
__global__ void __launch_bounds__(Block)
    cross_entropy_kernel(float* losses, T* logits, const std::int32_t* targets, std::int64_t N, std::int64_t V,
                         std::int64_t Vp, float dloss, const step_state* amp, bool backward,
                         gpu::device_error_record* errors) {
  using reduce = cub::BlockReduce<max_sum, Block>;
  __shared__ typename reduce::TempStorage temp;
  __shared__ max_sum total;
  const std::int64_t i = blockIdx.x;
  if (i >= N) return;
  T* row = logits + i * Vp;
  const std::int32_t target = targets[i];
  const bool bad = target < 0 || target >= V;

  max_sum part{-INFINITY, 0.0f};
  for (std::int64_t v = std::int64_t(threadIdx.x) * P; v < V; v += std::int64_t(Block) * P) {
    float x[P];
    load_pack(x, row, v, Vp);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      if (v + j >= V || x[j] == -INFINITY) continue;  // padding; exp(-inf) adds nothing
      if (x[j] > part.m) {                            // a new running max: rescale the sum (one exp either way)
        part.s = part.s * expf(part.m - x[j]) + 1.0f;
        part.m = x[j];
      } else {
        part.s += expf(x[j] - part.m);
      }
    }
  }
  const max_sum all = reduce(temp).Reduce(part, max_sum_op{});
  if (threadIdx.x == 0) {
    total = all;
    if (bad) {
      gpu::record_device_error(errors, gpu::device_error_code::target_out_of_range, i, target, V);
      losses[i] = NAN;
    } else {
      losses[i] = all.m + logf(all.s) - widen(row[target]);
    }
  }
  if (!backward) return;
  __syncthreads();  // total, and every thread's reads of the row, before the row is overwritten
  const float m = total.m, inv_sum = 1.0f / total.s;
  const float scale = amp ? dloss * float(amp->scale) : dloss;
  for (std::int64_t v = std::int64_t(threadIdx.x) * P; v < Vp; v += std::int64_t(Block) * P) {
    float x[P];
    load_pack(x, row, v, Vp);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const std::int64_t c = v + j;
      if (bad || c >= V) x[j] = 0.0f;
      else x[j] = (expf(x[j] - m) * inv_sum - (c == target ? 1.0f : 0.0f)) * scale;
    }
    store_pack(row, v, Vp, x);
  }
}

template <class T>
void cross_entropy_launch(const char* who, float* losses, T* logits, const std::int32_t* targets, std::int64_t N,
                          std::int64_t V, std::int64_t Vp, float dloss, const step_state* amp, bool backward) {
  static_assert(supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(N >= 0 && V > 0, who, ": need N >= 0 and V > 0, got N = ", N, ", V = ", V);
  STRATA_CHECK(Vp >= V, who, ": padded row length Vp = ", Vp, " is less than the vocab V = ", V);
  if (N == 0) return;
  STRATA_CHECK(N <= gpu::max_grid_x, who, ": N = ", N, " rows exceed the grid");
  gpu::context& ctx = gpu::this_context();
  constexpr int block = gpu::cross_entropy_block;
  with_pack<T>(gpu::cross_entropy_vectorized<T>(logits, Vp), [&](auto w) {
    constexpr int P = decltype(w)::value;
    cross_entropy_kernel<T, P, block><<<unsigned(N), block, 0, ctx.stream()>>>(losses, logits, targets, N, V, Vp, dloss,
                                                                               amp, backward, ctx.errors());
  });
  STRATA_CUDA_CHECK_LAUNCH(who);
}

// ---- vocabulary-parallel cross-entropy ---------------------------------------------------------
struct max_op {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <class T, int P, int Block>
__global__ void __launch_bounds__(Block)
    vocab_parallel_max_kernel(float* row_max, const T* logits, const std::int32_t* targets, std::int64_t N,
                              std::int64_t Vl, std::int64_t real, std::int64_t V, gpu::device_error_record* errors) {
  using reduce = cub::BlockReduce<float, Block>;
  __shared__ typename reduce::TempStorage temp;
  const std::int64_t i = blockIdx.x;
  if (i >= N) return;
  const T* row = logits + i * Vl;
  float m = -INFINITY;
  for (std::int64_t v = std::int64_t(threadIdx.x) * P; v < real; v += std::int64_t(Block) * P) {
    float x[P];
    load_pack(x, row, v, Vl);
#pragma unroll
    for (int j = 0; j < P; ++j)
      if (v + j < real) m = fmaxf(m, x[j]);
  }
  const float all = reduce(temp).Reduce(m, max_op{});
  if (threadIdx.x == 0) {
    row_max[i] = all;
    const std::int32_t target = targets[i];
    if (target < 0 || target >= V)
      gpu::record_device_error(errors, gpu::device_error_code::target_out_of_range, i, target, V);
  }
}

template <class T, int P, int Block>
__global__ void __launch_bounds__(Block)
    vocab_parallel_sums_kernel(float* sums, const T* logits, const float* row_max, const std::int32_t* targets,
                               std::int64_t N, std::int64_t Vl, std::int64_t v_begin, std::int64_t real) {
  using reduce = cub::BlockReduce<float, Block>;
  __shared__ typename reduce::TempStorage temp;
  const std::int64_t i = blockIdx.x;
  if (i >= N) return;
  const T* row = logits + i * Vl;
  const float m = row_max[i];
  float s = 0.0f;
  for (std::int64_t v = std::int64_t(threadIdx.x) * P; v < real; v += std::int64_t(Block) * P) {
    float x[P];
    load_pack(x, row, v, Vl);
#pragma unroll
    for (int j = 0; j < P; ++j)
      if (v + j < real) s += expf(x[j] - m);
  }
  const float total = reduce(temp).Sum(s);
  if (threadIdx.x == 0) {
    const std::int64_t t = std::int64_t(targets[i]) - v_begin;
    sums[2 * i] = total;
    sums[2 * i + 1] = (t >= 0 && t < real) ? widen(row[t]) : 0.0f;
  }
}

__device__ __forceinline__ float vocab_parallel_loss(const float* row_max, const float* sums, std::int32_t target,
                                                     std::int64_t i, std::int64_t V) {
  if (target < 0 || target >= V) return NAN;
  return row_max[i] + logf(sums[2 * i]) - sums[2 * i + 1];
}

// Losses only (no logits): one thread per row.
static __global__ void vocab_parallel_loss_kernel(float* losses, const float* row_max, const float* sums,
                                                  const std::int32_t* targets, std::int64_t N, std::int64_t V) {
  for (std::int64_t i = thread_index(); i < N; i += grid_stride())
    losses[i] = vocab_parallel_loss(row_max, sums, targets[i], i, V);
}

// Losses and the gradient in place: one block per row; each thread rewrites only the elements it
// read, so no barrier is needed.
template <class T, int P, int Block>
__global__ void __launch_bounds__(Block)
    vocab_parallel_finish_kernel(float* losses, T* logits, const float* row_max, const float* sums,
                                 const std::int32_t* targets, std::int64_t N, std::int64_t Vl, std::int64_t v_begin,
                                 std::int64_t real, std::int64_t V, float dloss) {
  const std::int64_t i = blockIdx.x;
  if (i >= N) return;
  const std::int32_t target = targets[i];
  const bool bad = target < 0 || target >= V;
  if (threadIdx.x == 0) losses[i] = vocab_parallel_loss(row_max, sums, target, i, V);
  T* row = logits + i * Vl;
  const std::int64_t t = std::int64_t(target) - v_begin;
  const float m = row_max[i], inv_sum = 1.0f / sums[2 * i];
  for (std::int64_t v = std::int64_t(threadIdx.x) * P; v < Vl; v += std::int64_t(Block) * P) {
    float x[P];
    load_pack(x, row, v, Vl);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const std::int64_t c = v + j;
      if (bad || c >= real) x[j] = 0.0f;
      else x[j] = (expf(x[j] - m) * inv_sum - (c == t ? 1.0f : 0.0f)) * dloss;
    }
    store_pack(row, v, Vl, x);
  }
}

// Shared argument checks; returns the number of real (non-padding) columns this rank holds.
inline std::int64_t vocab_parallel_args(const char* who, std::int64_t N, std::int64_t Vl, std::int64_t v_begin,
                                        std::int64_t V) {
  STRATA_CHECK(N >= 0 && V > 0, who, ": need N >= 0 and V > 0, got N = ", N, ", V = ", V);
  STRATA_CHECK(N <= gpu::max_grid_x, who, ": N = ", N, " rows exceed the grid");
  return std::max<std::int64_t>(0, std::min(Vl, V - v_begin));
}

}  // namespace cuda_detail

template <class T>
void cross_entropy_forward(cuda, acc_t<T>* losses, const T* logits, const std::int32_t* targets, std::int64_t N,
                           std::int64_t V, std::int64_t Vp) {
  // The kernel only writes the row in its backward pass, which is off here.
  cuda_detail::cross_entropy_launch<T>("cross_entropy_forward", losses, const_cast<T*>(logits), targets, N, V, Vp, 0.0f,
                                       nullptr, false);
}

template <class T>
void cross_entropy_forward_backward(cuda, acc_t<T>* losses, T* logits, const std::int32_t* targets, std::int64_t N,
                                    std::int64_t V, std::int64_t Vp, acc_t<T> dloss) {
  cuda_detail::cross_entropy_launch<T>("cross_entropy_forward_backward", losses, logits, targets, N, V, Vp, dloss,
                                       nullptr, true);
}

// Same, with dloss multiplied by amp->scale on the device (dynamic loss scaling).
template <class T>
void cross_entropy_forward_backward(cuda, acc_t<T>* losses, T* logits, const std::int32_t* targets, std::int64_t N,
                                    std::int64_t V, std::int64_t Vp, acc_t<T> dloss, const step_state* amp) {
  cuda_detail::cross_entropy_launch<T>("cross_entropy_forward_backward", losses, logits, targets, N, V, Vp, dloss, amp,
                                       true);
}

// Vocabulary-parallel cross-entropy, step 1: row_max[i] = max over this rank's real columns
// (-inf if none). Targets outside [0, V) are reported through the device error record.
template <class T>
void vocab_parallel_max(cuda, acc_t<T>* row_max, const T* logits, const std::int32_t* targets, std::int64_t N,
                        std::int64_t Vl, std::int64_t v_begin, std::int64_t V) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  const std::int64_t real = cuda_detail::vocab_parallel_args("vocab_parallel_max", N, Vl, v_begin, V);
  if (N == 0) return;
  gpu::context& ctx = gpu::this_context();
  constexpr int block = gpu::cross_entropy_block;
  cuda_detail::with_pack<T>(gpu::cross_entropy_vectorized<T>(logits, Vl), [&](auto w) {
    constexpr int P = decltype(w)::value;
    cuda_detail::vocab_parallel_max_kernel<T, P, block>
        <<<unsigned(N), block, 0, ctx.stream()>>>(row_max, logits, targets, N, Vl, real, V, ctx.errors());
  });
  STRATA_CUDA_CHECK_LAUNCH("vocab_parallel_max");
}

// Step 2: sums[2i] = sum of exp(x - row_max[i]) over this rank's real columns, sums[2i+1] = the
// target's logit if this rank holds it, else 0.
template <class T>
void vocab_parallel_sums(cuda, acc_t<T>* sums, const T* logits, const acc_t<T>* row_max, const std::int32_t* targets,
                         std::int64_t N, std::int64_t Vl, std::int64_t v_begin, std::int64_t V) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  const std::int64_t real = cuda_detail::vocab_parallel_args("vocab_parallel_sums", N, Vl, v_begin, V);
  if (N == 0) return;
  constexpr int block = gpu::cross_entropy_block;
  const cudaStream_t stream = gpu::current_stream();
  cuda_detail::with_pack<T>(gpu::cross_entropy_vectorized<T>(logits, Vl), [&](auto w) {
    constexpr int P = decltype(w)::value;
    cuda_detail::vocab_parallel_sums_kernel<T, P, block>
        <<<unsigned(N), block, 0, stream>>>(sums, logits, row_max, targets, N, Vl, v_begin, real);
  });
  STRATA_CUDA_CHECK_LAUNCH("vocab_parallel_sums");
}

// Step 3: losses[i] = row_max + log(sum) - target logit; with logits not null, overwrites them
// with (softmax - onehot) * dloss (0 on the padding).
template <class T>
void vocab_parallel_finish(cuda, acc_t<T>* losses, T* logits /*nullable*/, const acc_t<T>* row_max,
                           const acc_t<T>* sums, const std::int32_t* targets, std::int64_t N, std::int64_t Vl,
                           std::int64_t v_begin, std::int64_t V, acc_t<T> dloss) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  const std::int64_t real = cuda_detail::vocab_parallel_args("vocab_parallel_finish", N, Vl, v_begin, V);
  if (N == 0) return;
  const cudaStream_t stream = gpu::current_stream();
  if (!logits) {
    const auto d = gpu::elementwise_launch(N, 1);
    cuda_detail::vocab_parallel_loss_kernel<<<d.grid, d.block, 0, stream>>>(losses, row_max, sums, targets, N, V);
  } else {
    constexpr int block = gpu::cross_entropy_block;
    cuda_detail::with_pack<T>(gpu::cross_entropy_vectorized<T>(logits, Vl), [&](auto w) {
      constexpr int P = decltype(w)::value;
      cuda_detail::vocab_parallel_finish_kernel<T, P, block>
          <<<unsigned(N), block, 0, stream>>>(losses, logits, row_max, sums, targets, N, Vl, v_begin, real, V, dloss);
    });
  }
  STRATA_CUDA_CHECK_LAUNCH("vocab_parallel_finish");
}

}  // namespace strata::kernels
