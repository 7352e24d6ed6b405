// strata/kernels/cuda/common.cuh - device-side helpers the kernel files share: strata's storage
// types widened to float and narrowed back, 16-byte packs, warp reductions, and the launch
// helper that picks the packed or the scalar instantiation of an element-wise kernel.
//
// Narrowing rounds to nearest even (cvt.rn), exactly as strata/core/dtype.hpp does on the CPU,
// so a value rounded on the GPU equals the one rounded on the host (NaN payloads aside).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "strata/core/dtype.hpp"
#include "strata/kernels/cuda/launch_config.hpp"
#include "strata/kernels/cuda/runtime.cuh"

namespace strata::kernels::cuda_detail {

// ---- widen / narrow ------------------------------------------------------------------------
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(bf16 x) { return __uint_as_float(std::uint32_t(x.bits) << 16); }
__device__ __forceinline__ float widen(fp16 x) { return __half2float(__ushort_as_half(x.bits)); }

template <class T>
__device__ __forceinline__ T narrow(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, bf16>) return bf16::from_bits(__bfloat16_as_ushort(__float2bfloat16_rn(x)));
  else {
    static_assert(std::is_same_v<T, fp16>, "strata CUDA kernels store float, bf16 or fp16");
    return fp16::from_bits(__half_as_ushort(__float2half_rn(x)));
  }
}

// ---- 16-byte packs -------------------------------------------------------------------------
// P consecutive elements moved as one access; P = 1 is the plain scalar case.
// Aligned to its size up to 16 bytes (the widest load sm_90 has): a 32-byte pack of 8 floats
// is two 16-byte accesses.
template <class T, int P>
struct alignas(sizeof(T) * P > 16 ? 16 : sizeof(T) * P) pack {
  T v[P];
};

// x[0..P) = base[i .. i+P) widened; past n reads as 0. Full packs use one vector load (base
// must be 16-byte aligned and i a multiple of P when P > 1).
template <int P, class T>
__device__ __forceinline__ void load_pack(float (&x)[P], const T* base, std::int64_t i, std::int64_t n) {
  if (i + P <= n) {
    const pack<T, P> pk = *reinterpret_cast<const pack<T, P>*>(base + i);
#pragma unroll
    for (int j = 0; j < P; ++j) x[j] = widen(pk.v[j]);
  } else {
#pragma unroll
    for (int j = 0; j < P; ++j) x[j] = i + j < n ? widen(base[i + j]) : 0.0f;
  }
}

template <int P, class T>
__device__ __forceinline__ void store_pack(T* base, std::int64_t i, std::int64_t n, const float (&x)[P]) {
  if (i + P <= n) {
    pack<T, P> pk;
#pragma unroll
    for (int j = 0; j < P; ++j) pk.v[j] = narrow<T>(x[j]);
    *reinterpret_cast<pack<T, P>*>(base + i) = pk;
  } else {
#pragma unroll
    for (int j = 0; j < P; ++j)
      if (i + j < n) base[i + j] = narrow<T>(x[j]);
  }
}

// r = a + b over one row of C, lane-strided packs of P, rounded to T as stored: the residual add
// in front of a fused norm. Each lane later re-reads exactly the elements it wrote, so the norm
// that follows needs no synchronisation.
template <class T, int P>
__device__ __forceinline__ void residual_row(T* r, const T* a, const T* b, std::int64_t C, int lane) {
  for (std::int64_t c = std::int64_t(lane) * P; c < C; c += 32 * P) {
    float x[P], y[P];
    load_pack(x, a, c, C);
    load_pack(y, b, c, C);
#pragma unroll
    for (int j = 0; j < P; ++j) x[j] += y[j];
    store_pack(r, c, C, x);
  }
}

// ---- warp reductions -----------------------------------------------------------------------
// XOR butterflies: every lane ends with the same bits (each step adds the same two operands in
// either order), and the order is fixed, so the result is deterministic.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// ---- launch helpers ------------------------------------------------------------------------
// Calls f(std::integral_constant<int, P>) with P = the type's pack width when `vectorized`,
// else 1: the launcher instantiates its kernel for the chosen P.
template <class T, class F>
inline void with_pack(bool vectorized, F&& f) {
  if (vectorized) std::forward<F>(f)(std::integral_constant<int, gpu::pack_width<T>>{});
  else std::forward<F>(f)(std::integral_constant<int, 1>{});
}

// Grid-stride index over packs: for (k = first; k < packs; k += stride).
__device__ __forceinline__ std::int64_t thread_index() { return std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ std::int64_t grid_stride() { return std::int64_t(gridDim.x) * blockDim.x; }

template <class T>
inline constexpr bool supported_v = gpu::cuda_storage_v<T>;

}  // namespace strata::kernels::cuda_detail
