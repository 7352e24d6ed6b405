// strata/kernels/cuda/swiglu.cuh - the SwiGLU gate, element-wise, on the GPU.
//
//   gate_up [N, 2H]  per row: the H gate features g, then the H up features u
//   out     [N, H]   out = silu(g) u,  silu(z) = z s,  s = sigmoid(z) = 1 / (1 + exp(-z))
//   backward (writes, =):  dg = dout u s (1 + g (1 - s)),  du = dout silu(g)
//
// The host's functors (kernels/host/swiglu.hpp) run by the element-wise building block
// (kernels/cuda/elementwise.cuh), in fp32 (expf, not the fast __expf). Each thread handles one
// 16-byte pack (8 bf16 / 4 float) of one row when H is a multiple of the pack width and every
// pointer is 16-byte aligned (so no pack crosses a row), one element otherwise.
#pragma once
#include <cstdint>

#include "strata/kernels/cuda/common.cuh"
#include "strata/kernels/cuda/elementwise.cuh"
#include "strata/kernels/host/swiglu.hpp"
#include "strata/policy/device.hpp"

namespace strata::kernels {

// out [N, H] = silu(gate) * up, gate_up [N, 2H].
template <class T>
void swiglu_forward(cuda, T* out, const T* gate_up, std::int64_t N, std::int64_t H) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  swiglu_detail::forward(cuda{}, out, gate_up, N, H);
}

// Writes dgate_up [N, 2H] (not read): the gate half, then the up half per row.
template <class T>
void swiglu_backward(cuda, T* dgate_up, const T* dout, const T* gate_up, std::int64_t N, std::int64_t H) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  swiglu_detail::backward(cuda{}, dgate_up, dout, gate_up, N, H);
}

}  // namespace strata::kernels
