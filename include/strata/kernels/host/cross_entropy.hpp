// strata/kernels/host/cross_entropy.hpp - softmax cross-entropy over the vocabulary, fused with
// its backward so no probability buffer is ever held.
//
//   logits [N, Vp]  row stride Vp >= V; columns V .. Vp-1 are padding (never part of the softmax)
//   targets [N] in [0, V),  losses [N] (acc_t):  losses[i] = logsumexp(row_i) - row_i[target_i]
//
// forward_backward then overwrites each row with dL/dlogits for L = dloss * sum_i losses[i]:
//   row[v] = (softmax(row)[v] - [v == target]) * dloss  for v < V,  0 for the padding.
// It sets rather than accumulates: the logits are consumed, there is nothing to add to.
#pragma once
#include <cmath>
#include <cstdint>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cross_entropy_detail {
inline void check_args(const char* who, const std::int32_t* targets, std::int64_t N, std::int64_t V,
                       std::int64_t Vp) {
  STRATA_CHECK(N >= 0 && V > 0, who, ": need N >= 0 and V > 0, got N = ", N, ", V = ", V);
  STRATA_CHECK(Vp >= V, who, ": padded row length Vp = ", Vp, " is less than the vocab V = ", V);
  for (std::int64_t i = 0; i < N; ++i)
    if (targets[i] < 0 || targets[i] >= V)
      fail("cross_entropy: target ", targets[i], " at position ", i, " is out of range for vocab ", V);
}

// Returns the row's max and sum of exp(x - max) over the first V columns.
template <class T, class A = acc_t<T>>
void softmax_stats(const T* row, std::int64_t V, A& max_out, A& sum_out) {
  A m = -INFINITY;
  for (std::int64_t v = 0; v < V; ++v) {
    const A x = convert<A>(row[v]);
    if (x > m) m = x;
  }
  A s = 0;
  for (std::int64_t v = 0; v < V; ++v) s += std::exp(convert<A>(row[v]) - m);
  max_out = m;
  sum_out = s;
}
}  // namespace cross_entropy_detail

template <class T>
void cross_entropy_forward(host, acc_t<T>* losses, const T* logits, const std::int32_t* targets,
                           std::int64_t N, std::int64_t V, std::int64_t Vp) {
  using A = acc_t<T>;
  cross_entropy_detail::check_args("cross_entropy_forward", targets, N, V, Vp);
#pragma omp parallel for schedule(static) if (N * V > 32768)
  for (std::int64_t i = 0; i < N; ++i) {
    const T* row = logits + i * Vp;
    A m, s;
    cross_entropy_detail::softmax_stats(row, V, m, s);
    losses[i] = m + std::log(s) - convert<A>(row[targets[i]]);
  }
}

template <class T>
void cross_entropy_forward_backward(host, acc_t<T>* losses, T* logits, const std::int32_t* targets,
                                    std::int64_t N, std::int64_t V, std::int64_t Vp, acc_t<T> dloss) {
  using A = acc_t<T>;
  cross_entropy_detail::check_args("cross_entropy_forward_backward", targets, N, V, Vp);
#pragma omp parallel for schedule(static) if (N * V > 32768)
  for (std::int64_t i = 0; i < N; ++i) {
    T* row = logits + i * Vp;
    const std::int64_t target = targets[i];
    A m, s;
    cross_entropy_detail::softmax_stats(row, V, m, s);
    losses[i] = m + std::log(s) - convert<A>(row[target]);
    const A inv_sum = A(1) / s;
    for (std::int64_t v = 0; v < V; ++v) {
      const A p = std::exp(convert<A>(row[v]) - m) * inv_sum;
      row[v] = convert<T>((p - (v == target ? A(1) : A(0))) * dloss);
    }
    for (std::int64_t v = V; v < Vp; ++v) row[v] = convert<T>(A(0));
  }
}

}  // namespace strata::kernels
