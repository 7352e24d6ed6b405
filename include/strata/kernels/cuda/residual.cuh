// strata/kernels/cuda/residual.cuh - the residual connection on the GPU: out = a + b.
//
//   a, b, out, da, db, dout [n]; out may alias a or b (each pack is read before it is written)
//
// Sums in fp32, one rounding. 16-byte packs when every pointer is aligned.
#pragma once
#include <cstdint>
#include <type_traits>

#include "strata/core/error.hpp"
#include "strata/kernels/cuda/common.cuh"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {
template <class T, int P>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, std::int64_t n) {
  for (std::int64_t k = thread_index(); k * P < n; k += grid_stride()) {
    float x[P], y[P];
    load_pack(x, a, k * P, n);
    load_pack(y, b, k * P, n);
#pragma unroll
    for (int j = 0; j < P; ++j) x[j] += y[j];
    store_pack(out, k * P, n, x);
  }
}

// da = dout and db = dout (either may be null).
template <class T, int P>
__global__ void residual_backward_kernel(T* da, T* db, const T* dout, std::int64_t n) {
  for (std::int64_t k = thread_index(); k * P < n; k += grid_stride()) {
    float g[P];
    load_pack(g, dout, k * P, n);
    if (da) store_pack(da, k * P, n, g);
    if (db) store_pack(db, k * P, n, g);
  }
}
}  // namespace cuda_detail

template <class T>
void residual_forward(cuda, T* out, const T* a, const T* b, std::int64_t n) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(n >= 0, "residual_forward: negative length ", n);
  if (n == 0) return;
  const cudaStream_t stream = gpu::current_stream();
  cuda_detail::with_pack<T>(gpu::all_aligned16(out, a, b), [&](auto w) {
    constexpr int P = decltype(w)::value;
    const auto d = gpu::elementwise_launch(n, P);
    cuda_detail::residual_forward_kernel<T, P><<<d.grid, d.block, 0, stream>>>(out, a, b, n);
  });
  STRATA_CUDA_CHECK_LAUNCH("residual_forward");
}

// Writes dout into both da and db (either may be null to skip it), as the host kernel does.
template <class T>
void residual_backward(cuda, std::type_identity_t<T>* da /*nullable*/, std::type_identity_t<T>* db /*nullable*/,
                       const T* dout, std::int64_t n) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(n >= 0, "residual_backward: negative length ", n);
  if (n == 0 || (da == nullptr && db == nullptr)) return;
  const cudaStream_t stream = gpu::current_stream();
  cuda_detail::with_pack<T>(gpu::all_aligned16(da, db, dout), [&](auto w) {
    constexpr int P = decltype(w)::value;
    const auto d = gpu::elementwise_launch(n, P);
    cuda_detail::residual_backward_kernel<T, P><<<d.grid, d.block, 0, stream>>>(da, db, dout, n);
  });
  STRATA_CUDA_CHECK_LAUNCH("residual_backward");
}

}  // namespace strata::kernels
