// strata/kernels/host/linear.hpp - fully connected layer: out = inp . weight^T + bias.
//
//   inp [N, C], weight [OC, C] (PyTorch's nn.Linear layout), bias [OC] (nullable), out [N, OC]
//
// Both GEMMs go through kernels::gemm (the host BLAS, or the portable loop GEMM in a program without
// a BLAS: kernels/host/gemm.hpp); the bias gradient is a column sum done here. linear_gelu_forward
// is the MLP's first projection with its GELU; its backward is bias_gelu_backward (gelu.hpp) and
// then linear_backward without the bias.
#pragma once
#include <cstdint>
#include <type_traits>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/kernels/host/gelu.hpp"
#include "strata/kernels/host/gemm.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

namespace strata::kernels {

// Nullable pointers are std::type_identity_t<T>* so a plain nullptr needs no template argument.

// out[N, OC] = inp[N, C] . weight[OC, C]^T + bias[OC]
template <class T>
void linear_forward(host, workspace& ws, T* out, const T* inp, const T* weight,
                    const std::type_identity_t<T>* bias /*nullable*/, std::int64_t N, std::int64_t C, std::int64_t OC) {
  STRATA_CHECK(N >= 0 && C >= 0 && OC >= 0, "linear_forward: negative size N = ", N, ", C = ", C, ", OC = ", OC);
  if (bias) {
    // Start from the bias and let the GEMM add into it (beta = 1): one rounding per output
    // even for bf16/fp16, and no separate pass over out afterwards.
#pragma omp parallel for schedule(static) if (N * OC > 32768)
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t o = 0; o < OC; ++o) out[n * OC + o] = bias[o];
  }
  gemm<T>(host{}, ws, false, true, N, OC, C, acc_t<T>(1), inp, C, weight, C, acc_t<T>(bias ? 1 : 0), out, OC);
}

namespace linear_detail {
// pre[i] += bias[i] (when given), out[i] = GELU(pre[i]) over one row. restrict: the caller's
// arrays never overlap, and the compiler would otherwise not vectorise.
template <class T>
inline void bias_gelu_row(T* __restrict out, T* __restrict pre, const T* __restrict bias, std::int64_t n,
                          gelu_form form) {
  if (bias)
    for (std::int64_t i = 0; i < n; ++i) pre[i] += bias[i];
  if (form == gelu_form::exact) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = pre[i] * gelu_detail::exact_cdf(pre[i]);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) out[i] = pre[i] * gelu_detail::half_one_plus_tanh(pre[i]);
}
}  // namespace linear_detail

// out[N, OC] = GELU(pre), pre[N, OC] = inp[N, C] . weight[OC, C]^T + bias[OC] (nullable): both kept,
// pre for the backward. In float and double the GEMM writes pre and one pass over each row adds
// the bias and applies GELU while the row is in cache (no bias pass before the GEMM, and the GEMM
// does not read pre). bf16 and fp16 keep the bias inside the GEMM, so pre is rounded once, then
// apply GELU.
template <class T>
void linear_gelu_forward(host, workspace& ws, T* out, T* pre, const T* inp, const T* weight,
                         const std::type_identity_t<T>* bias /*nullable*/, std::int64_t N, std::int64_t C,
                         std::int64_t OC, gelu_form form = gelu_form::tanh) {
  STRATA_CHECK(N >= 0 && C >= 0 && OC >= 0, "linear_gelu_forward: negative size N = ", N, ", C = ", C, ", OC = ", OC);
  if constexpr (std::is_same_v<T, acc_t<T>>) {
    gemm<T>(host{}, ws, false, true, N, OC, C, T(1), inp, C, weight, C, T(0), pre, OC);
#pragma omp parallel for schedule(static) if (N * OC > 32768)
    for (std::int64_t n = 0; n < N; ++n) linear_detail::bias_gelu_row(out + n * OC, pre + n * OC, bias, OC, form);
  } else {
    linear_forward(host{}, ws, pre, inp, weight, bias, N, C, OC);
    gelu_forward(host{}, out, pre, N * OC, form);
  }
}

// Writes the input's gradient and accumulates (+=) into the parameters':
//   dinp[N, C]     = dout[N, OC] . weight[OC, C]        (skipped when dinp is null; not read)
//   dweight[OC, C] += dout[N, OC]^T . inp[N, C]
//   dbias[OC]     += sum over rows of dout             (skipped when dbias is null)
template <class T>
void linear_backward(host, workspace& ws, std::type_identity_t<T>* dinp /*nullable*/, T* dweight,
                     std::type_identity_t<T>* dbias /*nullable*/, const T* dout, const T* inp, const T* weight,
                     std::int64_t N, std::int64_t C, std::int64_t OC) {
  STRATA_CHECK(N >= 0 && C >= 0 && OC >= 0, "linear_backward: negative size N = ", N, ", C = ", C, ", OC = ", OC);
  STRATA_CHECK(dweight != nullptr, "linear_backward: dweight must not be null");
  if (dinp) gemm<T>(host{}, ws, false, false, N, C, OC, acc_t<T>(1), dout, OC, weight, C, acc_t<T>(0), dinp, C);
  gemm<T>(host{}, ws, true, false, OC, C, N, acc_t<T>(1), dout, OC, inp, C, acc_t<T>(1), dweight, C);
  if (dbias) {
    // Each thread owns a block of columns and sums them over all rows in row order, so every
    // element is one fixed sequential sum: bit-identical for any thread count.
    constexpr std::int64_t block = 64;
    const std::int64_t blocks = (OC + block - 1) / block;
#pragma omp parallel for schedule(static) if (N * OC > 32768)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t lo = b * block, hi = lo + block < OC ? lo + block : OC;
      acc_t<T> sum[block] = {};
      for (std::int64_t n = 0; n < N; ++n) {
        const T* row = dout + n * OC;
        for (std::int64_t o = lo; o < hi; ++o) sum[o - lo] += convert<acc_t<T>>(row[o]);
      }
      for (std::int64_t o = lo; o < hi; ++o) dbias[o] = convert<T>(convert<acc_t<T>>(dbias[o]) + sum[o - lo]);
    }
  }
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(linear_forward)
STRATA_HOST_KERNEL(linear_gelu_forward)
STRATA_HOST_KERNEL(linear_backward)

}  // namespace strata::kernels
