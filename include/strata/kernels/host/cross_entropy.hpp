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
#include <algorithm>
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

// Vocabulary-parallel cross-entropy (tensor parallelism): this rank holds columns
// [v_begin, v_begin + Vl) of every row's logits, logits [N, Vl]; global columns >= V are padding.
// The caller combines the pieces over the group between the three steps:
//   1. vocab_parallel_max      row_max[i] = max over this rank's real columns (-inf if none)
//                              -> all-reduce max
//   2. vocab_parallel_sums     sums[2i] = sum of exp(x - row_max) over them,
//                              sums[2i+1] = the target's logit if this rank holds it, else 0
//                              -> all-reduce sum
//   3. vocab_parallel_finish   losses[i] = row_max + log(sum) - target logit; with logits not
//                              null, overwrites them with (softmax - onehot) * dloss (0 on padding)
// No rank ever holds a whole row of logits.
template <class T>
void vocab_parallel_max(host, acc_t<T>* row_max, const T* logits, const std::int32_t* targets, std::int64_t N,
                        std::int64_t Vl, std::int64_t v_begin, std::int64_t V) {
  using A = acc_t<T>;
  cross_entropy_detail::check_args("vocab_parallel_max", targets, N, V, V);
  const std::int64_t real = std::max<std::int64_t>(0, std::min(Vl, V - v_begin));
#pragma omp parallel for schedule(static) if (N * Vl > 32768)
  for (std::int64_t i = 0; i < N; ++i) {
    const T* row = logits + i * Vl;
    A m = -INFINITY;
    for (std::int64_t v = 0; v < real; ++v) m = std::max(m, convert<A>(row[v]));
    row_max[i] = m;
  }
}

template <class T>
void vocab_parallel_sums(host, acc_t<T>* sums, const T* logits, const acc_t<T>* row_max, const std::int32_t* targets,
                         std::int64_t N, std::int64_t Vl, std::int64_t v_begin, std::int64_t V) {
  using A = acc_t<T>;
  const std::int64_t real = std::max<std::int64_t>(0, std::min(Vl, V - v_begin));
#pragma omp parallel for schedule(static) if (N * Vl > 32768)
  for (std::int64_t i = 0; i < N; ++i) {
    const T* row = logits + i * Vl;
    A s = 0;
    for (std::int64_t v = 0; v < real; ++v) s += std::exp(convert<A>(row[v]) - row_max[i]);
    const std::int64_t t = std::int64_t(targets[i]) - v_begin;
    sums[2 * i] = s;
    sums[2 * i + 1] = (t >= 0 && t < real) ? convert<A>(row[t]) : A(0);
  }
}

template <class T>
void vocab_parallel_finish(host, acc_t<T>* losses, T* logits /*nullable*/, const acc_t<T>* row_max,
                           const acc_t<T>* sums, const std::int32_t* targets, std::int64_t N, std::int64_t Vl,
                           std::int64_t v_begin, std::int64_t V, acc_t<T> dloss) {
  using A = acc_t<T>;
  const std::int64_t real = std::max<std::int64_t>(0, std::min(Vl, V - v_begin));
#pragma omp parallel for schedule(static) if (N * Vl > 32768)
  for (std::int64_t i = 0; i < N; ++i) {
    const A m = row_max[i], s = sums[2 * i];
    losses[i] = m + std::log(s) - sums[2 * i + 1];
    if (!logits) continue;
    T* row = logits + i * Vl;
    const std::int64_t t = std::int64_t(targets[i]) - v_begin;
    const A inv_sum = A(1) / s;
    for (std::int64_t v = 0; v < real; ++v) {
      const A p = std::exp(convert<A>(row[v]) - m) * inv_sum;
      row[v] = convert<T>((p - (v == t ? A(1) : A(0))) * dloss);
    }
    for (std::int64_t v = real; v < Vl; ++v) row[v] = convert<T>(A(0));
  }
}

}  // namespace strata::kernels
