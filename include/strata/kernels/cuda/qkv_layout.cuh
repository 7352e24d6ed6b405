// strata/kernels/cuda/qkv_layout.cuh - a fused QKV row between the per-head layout and the
// grouped one (kernels/qkv_layout.hpp), on the GPU.
//
//   per_head [rows, heads, 3, d]  <->  grouped [rows, 3, heads, d]
//
// One thread per element of the output: a permutation, values copied unchanged, out of place.
#pragma once
#include <cstdint>

#include "strata/core/error.hpp"
#include "strata/kernels/cuda/common.cuh"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {
// Element e of the output row: in the grouped layout (part, h, i), read from the per-head one or
// written to it.
template <class T>
__global__ void qkv_permute_kernel(T* out, const T* in, std::int64_t rows, std::int64_t H, std::int64_t d,
                                   bool to_grouped) {
  const std::int64_t W = 3 * H * d, n = rows * W;
  for (std::int64_t k = thread_index(); k < n; k += grid_stride()) {
    const std::int64_t r = k / W, e = k % W;
    const std::int64_t part = e / (H * d), h = (e / d) % H, i = e % d;
    const std::int64_t per_head = r * W + (3 * h + part) * d + i;
    if (to_grouped) out[k] = in[per_head];
    else out[per_head] = in[k];
  }
}

template <class T>
void qkv_permute(const char* who, T* out, const T* in, std::int64_t rows, std::int64_t heads, std::int64_t head_dim,
                 bool to_grouped) {
  static_assert(supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(rows >= 0 && heads > 0 && head_dim > 0, who,
               ": need rows >= 0 and heads, head_dim > 0, got rows = ", rows, ", heads = ", heads,
               ", head_dim = ", head_dim);
  const std::int64_t n = rows * 3 * heads * head_dim;
  if (n == 0) return;
  const auto d = gpu::elementwise_launch(n, 1);
  qkv_permute_kernel<T><<<d.grid, d.block, 0, gpu::current_stream()>>>(out, in, rows, heads, head_dim, to_grouped);
  STRATA_CUDA_CHECK_LAUNCH(who);
}
}  // namespace cuda_detail

template <class T>
void qkv_from_per_head(cuda, T* grouped, const T* per_head, std::int64_t rows, std::int64_t heads,
                       std::int64_t head_dim) {
  cuda_detail::qkv_permute("qkv_from_per_head", grouped, per_head, rows, heads, head_dim, true);
}

template <class T>
void qkv_to_per_head(cuda, T* per_head, const T* grouped, std::int64_t rows, std::int64_t heads,
                     std::int64_t head_dim) {
  cuda_detail::qkv_permute("qkv_to_per_head", per_head, grouped, rows, heads, head_dim, false);
}

}  // namespace strata::kernels
