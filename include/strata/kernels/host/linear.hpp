// strata/kernels/host/linear.hpp - fully connected layer: out = inp . weight^T + bias.
//
//   inp [N, C], weight [OC, C] (PyTorch's nn.Linear layout), bias [OC] (nullable), out [N, OC]
//
// Both GEMMs go through kernels::gemm (the host BLAS, or the portable loop GEMM in a program without
// a BLAS: kernels/host/gemm.hpp); the bias gradient is a column sum done here.
#pragma once
#include <cstdint>
#include <type_traits>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/kernels/host/gemm.hpp"
#include "strata/policy/device.hpp"

namespace strata::kernels {

// Nullable pointers are std::type_identity_t<T>* so a plain nullptr needs no template argument.

// out[N, OC] = inp[N, C] . weight[OC, C]^T + bias[OC]
template <class T>
void linear_forward(host, workspace& ws, T* out, const T* inp, const T* weight,
                    const std::type_identity_t<T>* bias /*nullable*/, std::int64_t N, std::int64_t C,
                    std::int64_t OC) {
  STRATA_CHECK(N >= 0 && C >= 0 && OC >= 0, "linear_forward: negative size N = ", N, ", C = ", C,
               ", OC = ", OC);
  if (bias) {
    // Start from the bias and let the GEMM add into it (beta = 1): one rounding per output
    // even for bf16/fp16, and no separate pass over out afterwards.
#pragma omp parallel for schedule(static) if (N * OC > 32768)
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t o = 0; o < OC; ++o) out[n * OC + o] = bias[o];
  }
  gemm<T>(host{}, ws, false, true, N, OC, C, acc_t<T>(1), inp, C, weight, C,
          acc_t<T>(bias ? 1 : 0), out, OC);
}

// Writes the input's gradient and accumulates (+=) into the parameters':
//   dinp[N, C]     = dout[N, OC] . weight[OC, C]        (skipped when dinp is null; not read)
//   dweight[OC, C] += dout[N, OC]^T . inp[N, C]
//   dbias[OC]     += sum over rows of dout             (skipped when dbias is null)
template <class T>
void linear_backward(host, workspace& ws, std::type_identity_t<T>* dinp /*nullable*/, T* dweight,
                     std::type_identity_t<T>* dbias /*nullable*/, const T* dout, const T* inp,
                     const T* weight, std::int64_t N, std::int64_t C, std::int64_t OC) {
  STRATA_CHECK(N >= 0 && C >= 0 && OC >= 0, "linear_backward: negative size N = ", N, ", C = ", C,
               ", OC = ", OC);
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
      for (std::int64_t o = lo; o < hi; ++o)
        dbias[o] = convert<T>(convert<acc_t<T>>(dbias[o]) + sum[o - lo]);
    }
  }
}

}  // namespace strata::kernels
