// strata/kernels/host/rmsnorm.hpp - root-mean-square normalisation over the last axis (Llama's).
//
//   inp, out, dinp, dout [N, C];  weight, dweight [C];  rstd [N] (acc_t)
//   out = inp · rstd · weight,  rstd = 1 / sqrt(mean_c(inp²) + eps)
//
// residual_rmsnorm_forward fuses the residual add in front: resid = a + b (rounded to T, written
// out), out = rmsnorm(resid), one pass over the rows with the numbers of residual_forward
// followed by rmsnorm_forward.
//
// Written with the row-wise building blocks (kernels/rowwise.hpp): the forward and the input
// gradient are a row_reduce each (rows in parallel, each row's sum in layernorm's fixed lane
// order), the weight gradient a sum_columns (fixed row chunks, then the chunks in order): the
// same bits whatever the thread count.
#pragma once
#include <cmath>
#include <cstdint>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/hd_math.hpp"
#include "strata/kernels/host/layernorm.hpp"  // layernorm_detail::sum_in_lanes
#include "strata/kernels/host/rowwise.hpp"
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

// The forward, per row: sum x², then 1/rms, then each output (normalise_row's numbers).
template <class T, class A = acc_t<T>>
struct forward_op {
  T* out;
  A* rstd;  // nullable
  const T* inp;
  const T* weight;
  std::int64_t C;
  A eps;
  STRATA_HD STRATA_ALWAYS_INLINE A term(std::int64_t r, std::int64_t c) const {
    const A v = convert<A>(inp[r * C + c]);
    return v * v;
  }
  STRATA_HD A finish(std::int64_t r, A sq) const {
    const A s = A(1) / hd::sqrt(sq / A(C) + eps);
    if (rstd) rstd[r] = s;
    return s;
  }
  STRATA_HD STRATA_ALWAYS_INLINE void write(std::int64_t r, std::int64_t c, A s) const {
    out[r * C + c] = convert<T>(convert<A>(inp[r * C + c]) * s * convert<A>(weight[c]));
  }
};

// The input gradient, per row: mean(dnorm · norm), then dinp.
template <class T, class A = acc_t<T>>
struct backward_op {
  T* dinp;
  const T* dout;
  const T* inp;
  const T* weight;
  const A* rstd;
  std::int64_t C;
  STRATA_HD STRATA_ALWAYS_INLINE A term(std::int64_t r, std::int64_t c) const {
    return convert<A>(dout[r * C + c]) * convert<A>(weight[c]) * (convert<A>(inp[r * C + c]) * rstd[r]);
  }
  STRATA_HD A finish(std::int64_t, A sum) const { return sum / A(C); }
  STRATA_HD STRATA_ALWAYS_INLINE void write(std::int64_t r, std::int64_t c, A dnorm_norm_mean) const {
    const A s = rstd[r];
    const A norm = convert<A>(inp[r * C + c]) * s;
    const A dnorm = convert<A>(dout[r * C + c]) * convert<A>(weight[c]);
    dinp[r * C + c] = convert<T>(s * (dnorm - norm * dnorm_norm_mean));
  }
};

// The weight gradient's term: dout · norm.
template <class T, class A = acc_t<T>>
struct dweight_term {
  const T* dout;
  const T* inp;
  const A* rstd;
  std::int64_t C;
  STRATA_HD STRATA_ALWAYS_INLINE A operator()(std::int64_t r, std::int64_t c) const {
    return convert<A>(dout[r * C + c]) * (convert<A>(inp[r * C + c]) * rstd[r]);
  }
};
}  // namespace rmsnorm_detail

// rstd may be null when no backward pass follows (inference).
template <class T>
void rmsnorm_forward(host, T* out, acc_t<T>* rstd /*nullable*/, const T* inp, const T* weight, std::int64_t N,
                     std::int64_t C, acc_t<T> eps) {
  STRATA_CHECK(N >= 0 && C > 0, "rmsnorm_forward: need N >= 0 and C > 0, got N = ", N, ", C = ", C);
  row_reduce(host{}, N, C, rmsnorm_detail::forward_op<T>{out, rstd, inp, weight, C, eps});
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
  STRATA_CHECK(N >= 0 && C > 0, "rmsnorm_backward: need N >= 0 and C > 0, got N = ", N, ", C = ", C);
  STRATA_CHECK(rstd != nullptr, "rmsnorm_backward: rstd from the forward pass is required");

  row_reduce(host{}, N, C, rmsnorm_detail::backward_op<T>{dinp, dout, inp, weight, rstd, C});
  sum_columns(host{}, N, C, dweight, rmsnorm_detail::dweight_term<T>{dout, inp, rstd, C});
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(rmsnorm_forward)
STRATA_HOST_KERNEL(residual_rmsnorm_forward)
STRATA_HOST_KERNEL(rmsnorm_backward)

}  // namespace strata::kernels
