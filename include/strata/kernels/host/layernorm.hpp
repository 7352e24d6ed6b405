// strata/kernels/host/layernorm.hpp - layer normalisation over the last axis.
//
//   inp, out, dinp, dout [N, C];  weight, bias, dweight, dbias [C];  mean, rstd [N] (acc_t)
//   out = (inp - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps),  var biased (/C)
//
// Rows are independent and run in parallel. Mean and variance use two passes over the row
// (no E[x^2] - E[x]^2 cancellation). The weight and bias gradients are column sums over rows,
// done by column blocks so each element is one fixed sequential sum.
#pragma once
#include <cmath>
#include <cstdint>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace layernorm_detail {
// sum_{i < n} term(i) as 16 interleaved partial sums combined in a fixed tree (halves added
// pairwise): the compiler vectorises it, and the order is fixed, whatever the thread count.
// Sixteen, not eight: eight floats are one 256-bit register, a single chain of dependent adds
// that ran at half the speed (a 384-wide layernorm, 2 threads: forward 400 -> 160 us).
template <class A, class Term>
inline A sum_in_lanes(std::int64_t n, Term&& term) {
  constexpr int lanes = 16;
  A part[lanes] = {};
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (int j = 0; j < lanes; ++j) part[j] += term(i + j);
  for (; i < n; ++i) part[0] += term(i);
  for (int w = lanes / 2; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) part[j] += part[j + w];
  return part[0];
}
}  // namespace layernorm_detail

// mean and rstd may be null when no backward pass follows (inference).
template <class T>
void layernorm_forward(host, T* out, acc_t<T>* mean /*nullable*/, acc_t<T>* rstd /*nullable*/,
                       const T* inp, const T* weight, const T* bias, std::int64_t N, std::int64_t C,
                       acc_t<T> eps) {
  using A = acc_t<T>;
  STRATA_CHECK(N >= 0 && C > 0, "layernorm_forward: need N >= 0 and C > 0, got N = ", N, ", C = ", C);
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (std::int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T* y = out + n * C;
    const A m = layernorm_detail::sum_in_lanes<A>(C, [x](std::int64_t c) { return convert<A>(x[c]); }) / A(C);
    const A sq = layernorm_detail::sum_in_lanes<A>(C, [x, m](std::int64_t c) {
      const A d = convert<A>(x[c]) - m;
      return d * d;
    });
    const A s = A(1) / std::sqrt(sq / A(C) + eps);
    for (std::int64_t c = 0; c < C; ++c)
      y[c] = convert<T>((convert<A>(x[c]) - m) * s * convert<A>(weight[c]) + convert<A>(bias[c]));
    if (mean) mean[n] = m;
    if (rstd) rstd[n] = s;
  }
}

// Accumulates (+=) into dinp, dweight and dbias.
//   norm = (inp - mean) * rstd,  dnorm = dout * weight
//   dinp   += rstd * (dnorm - mean_c(dnorm) - norm * mean_c(dnorm * norm))
//   dweight += sum_n dout * norm,  dbias += sum_n dout
template <class T>
void layernorm_backward(host, T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                        const T* weight, const acc_t<T>* mean, const acc_t<T>* rstd, std::int64_t N,
                        std::int64_t C) {
  using A = acc_t<T>;
  STRATA_CHECK(N >= 0 && C > 0, "layernorm_backward: need N >= 0 and C > 0, got N = ", N, ", C = ", C);
  STRATA_CHECK(mean != nullptr && rstd != nullptr,
               "layernorm_backward: mean and rstd from the forward pass are required");

#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (std::int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    const T* dy = dout + n * C;
    T* dx = dinp + n * C;
    const A m = mean[n], s = rstd[n];
    const A dnorm_sum = layernorm_detail::sum_in_lanes<A>(
        C, [dy, weight](std::int64_t c) { return convert<A>(dy[c]) * convert<A>(weight[c]); });
    const A dnorm_norm_sum = layernorm_detail::sum_in_lanes<A>(C, [=](std::int64_t c) {
      return convert<A>(dy[c]) * convert<A>(weight[c]) * ((convert<A>(x[c]) - m) * s);
    });
    const A dnorm_mean = dnorm_sum / A(C), dnorm_norm_mean = dnorm_norm_sum / A(C);
    for (std::int64_t c = 0; c < C; ++c) {
      const A norm = (convert<A>(x[c]) - m) * s;
      const A dnorm = convert<A>(dy[c]) * convert<A>(weight[c]);
      const A g = s * (dnorm - dnorm_mean - norm * dnorm_norm_mean);
      dx[c] = convert<T>(convert<A>(dx[c]) + g);
    }
  }

  constexpr std::int64_t block = 64;
  const std::int64_t blocks = (C + block - 1) / block;
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t lo = b * block, hi = lo + block < C ? lo + block : C;
    A dw[block] = {}, db[block] = {};
    for (std::int64_t n = 0; n < N; ++n) {
      const T* x = inp + n * C;
      const T* dy = dout + n * C;
      const A m = mean[n], s = rstd[n];
      for (std::int64_t c = lo; c < hi; ++c) {
        const A g = convert<A>(dy[c]);
        dw[c - lo] += g * ((convert<A>(x[c]) - m) * s);
        db[c - lo] += g;
      }
    }
    for (std::int64_t c = lo; c < hi; ++c) {
      dweight[c] = convert<T>(convert<A>(dweight[c]) + dw[c - lo]);
      dbias[c] = convert<T>(convert<A>(dbias[c]) + db[c - lo]);
    }
  }
}

}  // namespace strata::kernels
