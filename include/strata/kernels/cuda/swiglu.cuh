// strata/kernels/cuda/swiglu.cuh - the SwiGLU gate, element-wise, on the GPU.
//
//   gate_up [N, 2H]  per row: the H gate features g, then the H up features u
//   out     [N, H]   out = silu(g) u,  silu(z) = z s,  s = sigmoid(z) = 1 / (1 + exp(-z))
//   backward (writes, =):  dg = dout u s (1 + g (1 - s)),  du = dout silu(g)
//
// The same formulas as kernels/host/swiglu.hpp, in fp32 (expf, not the fast __expf). Each thread
// handles one 16-byte pack (8 bf16 / 4 float) of one row when H is a multiple of the pack width
// and every pointer is 16-byte aligned (so no pack crosses a row), one element otherwise.
#pragma once
#include <cstdint>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/cuda/common.cuh"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {
__device__ __forceinline__ float swiglu_sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

// out [N, H], gate_up [N, 2H]; packs of P elements along H (H % P == 0 when P > 1).
template <class T, int P>
__global__ void swiglu_forward_kernel(T* out, const T* gate_up, std::int64_t N, std::int64_t H) {
  const std::int64_t n_all = N * H;
  for (std::int64_t k = thread_index(); k * P < n_all; k += grid_stride()) {
    const std::int64_t e = k * P, n = e / H, j = e % H;
    const T* row = gate_up + n * 2 * H;
    float g[P], u[P], o[P];
    load_pack(g, row, j, H);
    load_pack(u, row + H, j, H);
#pragma unroll
    for (int q = 0; q < P; ++q) o[q] = g[q] * swiglu_sigmoid(g[q]) * u[q];
    store_pack(out + n * H, j, H, o);
  }
}

// dgate_up [N, 2H] (written), dout [N, H], gate_up [N, 2H].
template <class T, int P>
__global__ void swiglu_backward_kernel(T* dgate_up, const T* dout, const T* gate_up, std::int64_t N, std::int64_t H) {
  const std::int64_t n_all = N * H;
  for (std::int64_t k = thread_index(); k * P < n_all; k += grid_stride()) {
    const std::int64_t e = k * P, n = e / H, j = e % H;
    const T* row = gate_up + n * 2 * H;
    T* drow = dgate_up + n * 2 * H;
    float g[P], u[P], dy[P], dg[P], du[P];
    load_pack(g, row, j, H);
    load_pack(u, row + H, j, H);
    load_pack(dy, dout + n * H, j, H);
#pragma unroll
    for (int q = 0; q < P; ++q) {
      const float s = swiglu_sigmoid(g[q]);
      const float silu = g[q] * s;
      dg[q] = dy[q] * u[q] * (s * (1.0f + g[q] * (1.0f - s)));
      du[q] = dy[q] * silu;
    }
    store_pack(drow, j, H, dg);
    store_pack(drow + H, j, H, du);
  }
}
}  // namespace cuda_detail

// out [N, H] = silu(gate) * up, gate_up [N, 2H].
template <class T>
void swiglu_forward(cuda, T* out, const T* gate_up, std::int64_t N, std::int64_t H) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(N >= 0 && H > 0, "swiglu_forward: need N >= 0 and H > 0, got N = ", N, ", H = ", H);
  if (N == 0) return;
  const cudaStream_t stream = gpu::current_stream();
  cuda_detail::with_pack<T>(H % gpu::pack_width<T> == 0 && gpu::all_aligned16(out, gate_up), [&](auto w) {
    constexpr int P = decltype(w)::value;
    const auto d = gpu::elementwise_launch(N * H, P);
    cuda_detail::swiglu_forward_kernel<T, P><<<d.grid, d.block, 0, stream>>>(out, gate_up, N, H);
  });
  STRATA_CUDA_CHECK_LAUNCH("swiglu_forward");
}

// Writes dgate_up [N, 2H] (not read): the gate half, then the up half per row.
template <class T>
void swiglu_backward(cuda, T* dgate_up, const T* dout, const T* gate_up, std::int64_t N, std::int64_t H) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(N >= 0 && H > 0, "swiglu_backward: need N >= 0 and H > 0, got N = ", N, ", H = ", H);
  if (N == 0) return;
  const cudaStream_t stream = gpu::current_stream();
  cuda_detail::with_pack<T>(H % gpu::pack_width<T> == 0 && gpu::all_aligned16(dgate_up, dout, gate_up), [&](auto w) {
    constexpr int P = decltype(w)::value;
    const auto d = gpu::elementwise_launch(N * H, P);
    cuda_detail::swiglu_backward_kernel<T, P><<<d.grid, d.block, 0, stream>>>(dgate_up, dout, gate_up, N, H);
  });
  STRATA_CUDA_CHECK_LAUNCH("swiglu_backward");
}

}  // namespace strata::kernels
