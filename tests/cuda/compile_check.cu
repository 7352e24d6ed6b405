// Compiled by nvcc, never run here (CI has no GPU): checks that
//  1. every strata header, through <strata/strata.hpp>, compiles as CUDA C++20 host code, and
//  2. the STRATA_HD conversions of strata/core/dtype.hpp compile to device code for sm_90:
//     the kernel below narrows float to bf16 and fp16 on the device and widens them back.
#include <strata/strata.hpp>

#include <cstdint>
#include <cuda_runtime.h>

namespace strata_cuda_test {

// in[n] -> out_bf16[n], out_fp16[n]; widened[2i], widened[2i + 1]: the bf16 and fp16 values
// converted back to float. Uses the constructors, convert<>, from_float/to_float and from_bits.
__global__ void narrow_and_widen(const float* in, strata::bf16* out_bf16, strata::fp16* out_fp16,
                                 float* widened, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = in[i];
  const strata::bf16 b(x);
  const strata::fp16 h = strata::convert<strata::fp16>(x);
  out_bf16[i] = strata::bf16::from_bits(strata::bf16::from_float(x));
  out_fp16[i] = strata::fp16::from_bits(h.bits);
  widened[2 * i] = static_cast<float>(b);
  widened[2 * i + 1] = strata::convert<float>(h);  // fp16::to_float
}

// bf16 -> fp16 through float, both directions of convert<> on the device.
__global__ void bf16_to_fp16(const strata::bf16* in, strata::fp16* out, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = strata::convert<strata::fp16>(in[i]);
}

// Host launchers, so the kernels are referenced and their host stubs are compiled too.
cudaError_t launch_narrow_and_widen(const float* in, strata::bf16* out_bf16, strata::fp16* out_fp16,
                                    float* widened, std::int64_t n, cudaStream_t stream) {
  const unsigned threads = 256;
  const auto blocks = static_cast<unsigned>((n + threads - 1) / threads);
  narrow_and_widen<<<blocks, threads, 0, stream>>>(in, out_bf16, out_fp16, widened, n);
  return cudaGetLastError();
}

cudaError_t launch_bf16_to_fp16(const strata::bf16* in, strata::fp16* out, std::int64_t n,
                                cudaStream_t stream) {
  const unsigned threads = 256;
  const auto blocks = static_cast<unsigned>((n + threads - 1) / threads);
  bf16_to_fp16<<<blocks, threads, 0, stream>>>(in, out, n);
  return cudaGetLastError();
}

}  // namespace strata_cuda_test
