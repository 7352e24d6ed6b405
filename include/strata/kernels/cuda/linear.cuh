// strata/kernels/cuda/linear.cuh - fully connected layer on the GPU: out = inp . weight^T + bias.
//
//   inp [N, C], weight [OC, C] (PyTorch's nn.Linear layout), bias [OC] (nullable), out [N, OC]
//
// Forward: one cuBLASLt GEMM with the bias fused as its epilogue (fp32 accumulation, bias added
// in fp32, one rounding). linear_gelu_forward also applies GELU (fused into the epilogue for the
// tanh form), keeping the pre-activation for the backward pass. Backward, as the host kernel: the
// input gradient by a GEMM with beta = 0 (written, not read), the weight gradient by a GEMM with
// beta = 1 (accumulated), and the bias gradient as a deterministic column sum added to it
// (column_sum.cuh).
#pragma once
#include <cstdint>
#include <type_traits>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/kernels/cuda/column_sum.cuh"
#include "strata/kernels/cuda/gelu.cuh"
#include "strata/kernels/cuda/gemm.cuh"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {
// out[n, :] = bias (fp64 has no bias epilogue: the bias is written first, the GEMM adds with beta = 1).
template <class T>
__global__ void fill_rows_kernel(T* out, const T* bias, std::int64_t N, std::int64_t OC) {
  for (std::int64_t idx = thread_index(); idx < N * OC; idx += grid_stride()) out[idx] = bias[idx % OC];
}
}  // namespace cuda_detail

// out[N, OC] = inp[N, C] . weight[OC, C]^T + bias[OC]. `ws` (host workspace) is unused.
template <class T>
void linear_forward(cuda, workspace& /*ws: unused on the GPU*/, T* out, const T* inp, const T* weight,
                    const std::type_identity_t<T>* bias /*nullable*/, std::int64_t N, std::int64_t C, std::int64_t OC) {
  STRATA_CHECK(N >= 0 && C >= 0 && OC >= 0, "linear_forward: negative size N = ", N, ", C = ", C, ", OC = ", OC);
  constexpr gpu::scalar_kind kind = gpu::scalar_kind_of<T>();
  cuda_detail::lt_epilogue ep;
  ep.kind = gpu::linear_epilogue(kind, bias != nullptr, false);
  ep.bias = bias;
  acc_t<T> beta = 0;
  if (bias && ep.kind == gpu::epilogue_kind::none && N > 0 && OC > 0) {  // fp64
    const auto d = gpu::elementwise_launch(N * OC, 1);
    cuda_detail::fill_rows_kernel<T><<<d.grid, d.block, 0, gpu::current_stream()>>>(out, bias, N, OC);
    STRATA_CUDA_CHECK_LAUNCH("linear_forward");
    beta = 1;
  }
  cuda_detail::lt_matmul<T>("linear_forward", false, true, N, OC, C, acc_t<T>(1), inp, C, weight, C, beta, out, OC, ep);
}

// out[N, OC] = gelu(pre), pre[N, OC] = inp . weight^T + bias: the MLP's first projection and
// its activation. bf16 and fp16 with a bias and OC a multiple of 8 (the aux buffer's alignment
// rule) run one GEMM (cuBLASLt GELU_AUX_BIAS, checked against the host for those types in
// tests/cuda); otherwise, and for the exact form (cuBLASLt's epilogue is the tanh one),
// linear_forward, then gelu_forward. Not for fp64 (no GELU on the GPU).
template <class T>
void linear_gelu_forward(cuda, workspace& ws, T* out, T* pre, const T* inp, const T* weight,
                         const std::type_identity_t<T>* bias /*nullable*/, std::int64_t N, std::int64_t C,
                         std::int64_t OC, gelu_form form = gelu_form::tanh) {
  static_assert(!std::is_same_v<T, double>, "linear_gelu_forward: no GELU for fp64 on the GPU");
  STRATA_CHECK(N >= 0 && C >= 0 && OC >= 0, "linear_gelu_forward: negative size N = ", N, ", C = ", C, ", OC = ", OC);
  if (std::is_same_v<T, float> || bias == nullptr || OC % 8 != 0 || form == gelu_form::exact) {
    linear_forward(cuda{}, ws, pre, inp, weight, bias, N, C, OC);
    gelu_forward(cuda{}, out, pre, N * OC, form);
    return;
  }
  cuda_detail::lt_epilogue ep;
  ep.kind = gpu::linear_epilogue(gpu::scalar_kind_of<T>(), true, true);
  ep.bias = bias;
  ep.aux = pre;
  ep.ld_aux = OC;
  cuda_detail::lt_matmul<T>("linear_gelu_forward", false, true, N, OC, C, acc_t<T>(1), inp, C, weight, C, acc_t<T>(0),
                            out, OC, ep);
}

// Writes the input's gradient and accumulates (+=) into the parameters':
//   dinp[N, C]      = dout[N, OC] . weight[OC, C]       (skipped when dinp is null; not read)
//   dweight[OC, C] += dout[N, OC]^T . inp[N, C]
//   dbias[OC]      += column sums of dout              (skipped when dbias is null)
template <class T>
void linear_backward(cuda, workspace& /*ws: unused on the GPU*/, std::type_identity_t<T>* dinp /*nullable*/, T* dweight,
                     std::type_identity_t<T>* dbias /*nullable*/, const T* dout, const T* inp, const T* weight,
                     std::int64_t N, std::int64_t C, std::int64_t OC) {
  STRATA_CHECK(N >= 0 && C >= 0 && OC >= 0, "linear_backward: negative size N = ", N, ", C = ", C, ", OC = ", OC);
  STRATA_CHECK(dweight != nullptr, "linear_backward: dweight must not be null");
  if (dinp)
    cuda_detail::lt_matmul<T>("linear_backward (dinp)", false, false, N, C, OC, acc_t<T>(1), dout, OC, weight, C,
                              acc_t<T>(0), dinp, C);
  cuda_detail::lt_matmul<T>("linear_backward (dweight)", true, false, OC, C, N, acc_t<T>(1), dout, OC, inp, C,
                            acc_t<T>(1), dweight, C);
  if (dbias) {
    if constexpr (std::is_same_v<T, double>) fail("linear_backward: no fp64 bias gradient on the GPU");
    else
      cuda_detail::column_sums<false, T>("linear_backward (dbias)", dbias, nullptr, dout, nullptr, nullptr, nullptr, N,
                                         OC);
  }
}

}  // namespace strata::kernels
