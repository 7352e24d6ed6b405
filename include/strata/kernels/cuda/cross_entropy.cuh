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
// The overload taking a gpu::amp_state* multiplies dloss by the device-resident loss scale, so
// a step with dynamic loss scaling needs no host round trip (amp_state.hpp).
#pragma once
#include <cub/block/block_reduce.cuh>

#include <cmath>
#include <cstdint>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/cuda/amp_state.hpp"
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
                         std::int64_t Vp, float dloss, const gpu::amp_state* amp, bool backward,
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
      if (x[j] > part.m) {  // a new running max: rescale the sum (one exp either way)
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
                          std::int64_t V, std::int64_t Vp, float dloss, const gpu::amp_state* amp, bool backward) {
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

}  // namespace cuda_detail

template <class T>
void cross_entropy_forward(cuda, acc_t<T>* losses, const T* logits, const std::int32_t* targets, std::int64_t N,
                           std::int64_t V, std::int64_t Vp) {
  // The kernel only writes the row in its backward pass, which is off here.
  cuda_detail::cross_entropy_launch<T>("cross_entropy_forward", losses, const_cast<T*>(logits), targets, N, V, Vp,
                                       0.0f, nullptr, false);
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
                                    std::int64_t V, std::int64_t Vp, acc_t<T> dloss, const gpu::amp_state* amp) {
  cuda_detail::cross_entropy_launch<T>("cross_entropy_forward_backward", losses, logits, targets, N, V, Vp, dloss, amp,
                                       true);
}

}  // namespace strata::kernels
