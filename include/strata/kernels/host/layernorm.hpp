// strata/kernels/host/layernorm.hpp - layer normalisation over the last axis.
//
//   inp, out, dinp, dout [N, C];  weight, bias, dweight, dbias [C];  mean, rstd [N] (acc_t)
//   out = (inp - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps),  var biased (/C)
//
// Rows are independent and run in parallel. Mean and variance use two passes over the row
// (no E[x^2] - E[x]^2 cancellation). The weight and bias gradients are column sums over rows,
// summed in fixed chunks of rows and then over the chunks in order (layernorm_backward).
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/host/column_sum.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

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

// One row of the backward: dx = rstd · (dnorm - mean(dnorm) - norm · mean(dnorm · norm)), and the
// row's terms of the weight and bias gradients added to dw and db. The pointers are restrict (the
// caller's arrays never overlap): with six streams the compiler would otherwise not vectorise.
template <class T, class A>
inline void backward_row(T* __restrict dx, A* __restrict dw, A* __restrict db, const T* __restrict x,
                         const T* __restrict dy, const T* __restrict weight, std::int64_t C, A m, A s, A dnorm_mean,
                         A dnorm_norm_mean) {
  for (std::int64_t c = 0; c < C; ++c) {
    const A norm = (convert<A>(x[c]) - m) * s;
    const A g = convert<A>(dy[c]);
    dx[c] = convert<T>(s * (g * convert<A>(weight[c]) - dnorm_mean - norm * dnorm_norm_mean));
    dw[c] += g * norm;
    db[c] += g;
  }
}
}  // namespace layernorm_detail

// mean and rstd may be null when no backward pass follows (inference).
template <class T>
void layernorm_forward(host, T* out, acc_t<T>* mean /*nullable*/, acc_t<T>* rstd /*nullable*/, const T* inp,
                       const T* weight, const T* bias, std::int64_t N, std::int64_t C, acc_t<T> eps) {
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

// Writes the input's gradient (not read) and accumulates (+=) into the parameters', as every
// backward kernel does (docs/architecture.md, "A training step"):
//   norm = (inp - mean) * rstd,  dnorm = dout * weight
//   dinp    = rstd * (dnorm - mean_c(dnorm) - norm * mean_c(dnorm * norm))
//   dweight += sum_n dout * norm,  dbias += sum_n dout
// One pass over the rows: each chunk of rows (column_sum.hpp) sums its dweight and dbias terms
// while the row is in cache, and the chunks' sums are then added in chunk order, an order fixed
// by N whatever the thread count.
template <class T>
void layernorm_backward(host, T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const acc_t<T>* mean, const acc_t<T>* rstd, std::int64_t N, std::int64_t C) {
  using A = acc_t<T>;
  STRATA_CHECK(N >= 0 && C > 0, "layernorm_backward: need N >= 0 and C > 0, got N = ", N, ", C = ", C);
  STRATA_CHECK(mean != nullptr && rstd != nullptr,
               "layernorm_backward: mean and rstd from the forward pass are required");
  const column_sum::row_chunks chunks(N);
  std::vector<A> partial(std::size_t(chunks.count * 2 * C));  // per chunk: dweight, then dbias

#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (std::int64_t k = 0; k < chunks.count; ++k) {
    A* dw = partial.data() + k * 2 * C;
    A* db = dw + C;
    for (std::int64_t n = chunks.begin(k); n < chunks.end(k); ++n) {
      const T* x = inp + n * C;
      const T* dy = dout + n * C;
      const A m = mean[n], s = rstd[n];
      const A dnorm_sum = layernorm_detail::sum_in_lanes<A>(
          C, [dy, weight](std::int64_t c) { return convert<A>(dy[c]) * convert<A>(weight[c]); });
      const A dnorm_norm_sum = layernorm_detail::sum_in_lanes<A>(
          C, [=](std::int64_t c) { return convert<A>(dy[c]) * convert<A>(weight[c]) * ((convert<A>(x[c]) - m) * s); });
      layernorm_detail::backward_row(dinp + n * C, dw, db, x, dy, weight, C, m, s, dnorm_sum / A(C),
                                     dnorm_norm_sum / A(C));
    }
  }
  column_sum::add_chunk_sums(dweight, partial.data(), chunks.count, C, 2 * C);
  column_sum::add_chunk_sums(dbias, partial.data() + C, chunks.count, C, 2 * C);
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(layernorm_forward)
STRATA_HOST_KERNEL(layernorm_backward)

}  // namespace strata::kernels
