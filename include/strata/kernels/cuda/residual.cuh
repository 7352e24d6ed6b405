// strata/kernels/cuda/residual.cuh - the residual connection on the GPU: out = a + b.
//
//   a, b, out, da, db, dout [n]; out may alias a or b (each pack is read before it is written)
//
// The host's functors (kernels/host/residual.hpp) run by the element-wise building block
// (kernels/cuda/elementwise.cuh): sums in fp32, one rounding; 16-byte packs when every pointer
// is aligned.
#pragma once
#include <cstdint>
#include <type_traits>

#include "strata/kernels/cuda/common.cuh"
#include "strata/kernels/cuda/elementwise.cuh"
#include "strata/kernels/host/residual.hpp"
#include "strata/policy/device.hpp"

namespace strata::kernels {

template <class T>
void residual_forward(cuda, T* out, const T* a, const T* b, std::int64_t n) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  residual_detail::forward(cuda{}, out, a, b, n);
}

// Writes dout into both da and db (either may be null to skip it), as the host kernel does.
template <class T>
void residual_backward(cuda, std::type_identity_t<T>* da /*nullable*/, std::type_identity_t<T>* db /*nullable*/,
                       const T* dout, std::int64_t n) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  residual_detail::backward(cuda{}, da, db, dout, n);
}

}  // namespace strata::kernels
