// strata/kernels/host/rmsnorm.hpp - root-mean-square normalisation over the last axis (Llama's).
//
//   inp, out, dinp, dout [N, C];  weight, dweight [C];  rstd [N] (acc_t)
//   out = inp · rstd · weight,  rstd = 1 / sqrt(mean_c(inp²) + eps)
//
// residual_rmsnorm_forward fuses the residual add in front: resid = a + b (rounded to T, written
// out), out = rmsnorm(resid), one pass over the rows with the numbers of residual_forward
// followed by rmsnorm_forward.
//
// Rows are independent and run in parallel; each row's sums use layernorm's fixed lane order.
// The weight gradient is a column sum over rows, done by column blocks so each element is one
// fixed sequential sum, whatever the thread count.
#pragma once
#include <cmath>
#include <cstdint>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/host/layernorm.hpp"  // layernorm_detail::sum_in_lanes
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

namespace strata::kernels {

namespace rmsnorm_detail {
// Row x (final in storage precision) normalised into y; returns its 1/rms.
template <class T, class A = acc_t<T>>
inline A normalise_row(T* y, const T* x, const T* weight, std::int64_t C, A eps) {
  const A sq = layernorm_detail::sum_in_lanes<A>(C, [x](std::int64_t c) {
    const A v = convert<A>(x[c]);
    return v * v;
  });
  const A s = A(1) / std::sqrt(sq / A(C) + eps);
  for (std::int64_t c = 0; c < C; ++c) y[c] = convert<T>(convert<A>(x[c]) * s * convert<A>(weight[c]));
  return s;
}
}  // namespace rmsnorm_detail

// rstd may be null when no backward pass follows (inference).
template <class T>
void rmsnorm_forward(host, T* out, acc_t<T>* rstd /*nullable*/, const T* inp, const T* weight, std::int64_t N,
                     std::int64_t C, acc_t<T> eps) {
  STRATA_CHECK(N >= 0 && C > 0, "rmsnorm_forward: need N >= 0 and C > 0, got N = ", N, ", C = ", C);
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (std::int64_t n = 0; n < N; ++n) {
    const auto s = rmsnorm_detail::normalise_row(out + n * C, inp + n * C, weight, C, eps);
    if (rstd) rstd[n] = s;
  }
}

// resid = a + b, then out = rmsnorm(resid); rstd may be null.
template <class T>
void residual_rmsnorm_forward(host, T* resid, T* out, acc_t<T>* rstd /*nullable*/, const T* a, const T* b,
                              const T* weight, std::int64_t N, std::int64_t C, acc_t<T> eps) {
  using A = acc_t<T>;
  STRATA_CHECK(N >= 0 && C > 0, "residual_rmsnorm_forward: need N >= 0 and C > 0, got N = ", N, ", C = ", C);
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (std::int64_t n = 0; n < N; ++n) {
    T* r = resid + n * C;
    for (std::int64_t c = 0; c < C; ++c) r[c] = convert<T>(convert<A>(a[n * C + c]) + convert<A>(b[n * C + c]));
    const A s = rmsnorm_detail::normalise_row(out + n * C, r, weight, C, eps);
    if (rstd) rstd[n] = s;
  }
}

// Writes the input's gradient (not read) and accumulates (+=) into the weight's, as every
// backward kernel does (docs/architecture.md, "A training step"):
//   norm = inp · rstd,  dnorm = dout · weight
//   dinp     = rstd · (dnorm - norm · mean_c(dnorm · norm))
//   dweight += sum_n dout · norm
// (layernorm's gradient without the mean terms: d rstd / d inp_c = -rstd³ inp_c / C.)
template <class T>
void rmsnorm_backward(host, T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const acc_t<T>* rstd,
                      std::int64_t N, std::int64_t C) {
  using A = acc_t<T>;
  STRATA_CHECK(N >= 0 && C > 0, "rmsnorm_backward: need N >= 0 and C > 0, got N = ", N, ", C = ", C);
  STRATA_CHECK(rstd != nullptr, "rmsnorm_backward: rstd from the forward pass is required");

#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (std::int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    const T* dy = dout + n * C;
    T* dx = dinp + n * C;
    const A s = rstd[n];
    const A dnorm_norm_mean =
        layernorm_detail::sum_in_lanes<A>(
            C, [=](std::int64_t c) { return convert<A>(dy[c]) * convert<A>(weight[c]) * (convert<A>(x[c]) * s); }) /
        A(C);
    for (std::int64_t c = 0; c < C; ++c) {
      const A norm = convert<A>(x[c]) * s;
      const A dnorm = convert<A>(dy[c]) * convert<A>(weight[c]);
      dx[c] = convert<T>(s * (dnorm - norm * dnorm_norm_mean));
    }
  }

  constexpr std::int64_t block = 64;
  const std::int64_t blocks = (C + block - 1) / block;
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t lo = b * block, hi = lo + block < C ? lo + block : C;
    A dw[block] = {};
    for (std::int64_t n = 0; n < N; ++n) {
      const T* x = inp + n * C;
      const T* dy = dout + n * C;
      const A s = rstd[n];
      for (std::int64_t c = lo; c < hi; ++c) dw[c - lo] += convert<A>(dy[c]) * (convert<A>(x[c]) * s);
    }
    for (std::int64_t c = lo; c < hi; ++c) dweight[c] = convert<T>(convert<A>(dweight[c]) + dw[c - lo]);
  }
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(rmsnorm_forward)
STRATA_HOST_KERNEL(residual_rmsnorm_forward)
STRATA_HOST_KERNEL(rmsnorm_backward)

}  // namespace strata::kernels
