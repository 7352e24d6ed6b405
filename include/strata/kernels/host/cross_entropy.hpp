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
#include <type_traits>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/host/vector_math.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

namespace strata::kernels {

namespace cross_entropy_detail {
inline void check_args(const char* who, const std::int32_t* targets, std::int64_t N, std::int64_t V, std::int64_t Vp) {
  STRATA_CHECK(N >= 0 && V > 0, who, ": need N >= 0 and V > 0, got N = ", N, ", V = ", V);
  STRATA_CHECK(Vp >= V, who, ": padded row length Vp = ", Vp, " is less than the vocab V = ", V);
  for (std::int64_t i = 0; i < N; ++i)
    if (targets[i] < 0 || targets[i] >= V)
      fail("cross_entropy: target ", targets[i], " at position ", i, " is out of range for vocab ", V);
}

// The sum over the vocabulary is taken in double: exp(x - max) is computed in acc_t as before,
// but a float accumulator added to one term at a time loses the small terms once the sum is large
// (at V = 50257 the loss came out 1e-6 to 3e-6 relative too low); in double the sum's error stays far
// below one float rounding for any vocabulary. The order is fixed by V alone (column v into
// partial sum v % 8, the eight combined in a fixed tree), so a row gives the same bits whatever the
// thread count, forward and forward_backward agree, and the loop vectorises. The exps are
// exp_fast (vector_math.hpp).
using sum_t = double;
constexpr int lanes = 8;

// The row's max over the first V columns. Sixteen running maxima, combined at the end: one
// running max is a chain of dependent compares that does not vectorise. The max is the same
// whatever the order (a NaN is skipped either way; a signed zero only ever meets exp(0)).
template <class T, class A = acc_t<T>>
A row_max(const T* row, std::int64_t V) {
  constexpr int width = 16;
  A part[width];
  for (int j = 0; j < width; ++j) part[j] = -INFINITY;
  std::int64_t v = 0;
  for (; v + width <= V; v += width)
    for (int j = 0; j < width; ++j) {
      const A x = convert<A>(row[v + j]);
      part[j] = x > part[j] ? x : part[j];
    }
  A m = -INFINITY;
  for (; v < V; ++v) {
    const A x = convert<A>(row[v]);
    m = x > m ? x : m;
  }
  for (int j = 0; j < width; ++j) m = part[j] > m ? part[j] : m;
  return m;
}

// sum over the first V columns of exp(x - m), each term rounded to acc_t, summed in sum_t. With
// Keep (full-precision storage), each term also replaces its logit in the row.
template <bool Keep = false, class T, class A>
sum_t sum_exp(T* row, std::int64_t V, A m) {
  sum_t part[lanes] = {};
  std::int64_t v = 0;
  for (; v + lanes <= V; v += lanes)
    for (int j = 0; j < lanes; ++j) {
      const A e = exp_fast(convert<A>(row[v + j]) - m);
      if constexpr (Keep) row[v + j] = e;
      part[j] += sum_t(e);
    }
  for (; v < V; ++v) {
    const A e = exp_fast(convert<A>(row[v]) - m);
    if constexpr (Keep) row[v] = e;
    part[0] += sum_t(e);
  }
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// logsumexp - target logit, rounded once to acc_t.
template <class A>
A loss_of(A m, sum_t s, A target_logit) {
  return A(sum_t(m) + std::log(s) - sum_t(target_logit));
}
}  // namespace cross_entropy_detail

template <class T>
void cross_entropy_forward(host, acc_t<T>* losses, const T* logits, const std::int32_t* targets, std::int64_t N,
                           std::int64_t V, std::int64_t Vp) {
  using A = acc_t<T>;
  cross_entropy_detail::check_args("cross_entropy_forward", targets, N, V, Vp);
#pragma omp parallel for schedule(static) if (N * V > 32768)
  for (std::int64_t i = 0; i < N; ++i) {
    const T* row = logits + i * Vp;
    const A m = cross_entropy_detail::row_max(row, V);
    const auto s = cross_entropy_detail::sum_exp(row, V, m);
    losses[i] = cross_entropy_detail::loss_of(m, s, convert<A>(row[targets[i]]));
  }
}

template <class T>
void cross_entropy_forward_backward(host, acc_t<T>* losses, T* logits, const std::int32_t* targets, std::int64_t N,
                                    std::int64_t V, std::int64_t Vp, acc_t<T> dloss) {
  using A = acc_t<T>;
  cross_entropy_detail::check_args("cross_entropy_forward_backward", targets, N, V, Vp);
#pragma omp parallel for schedule(static) if (N * V > 32768)
  for (std::int64_t i = 0; i < N; ++i) {
    T* row = logits + i * Vp;
    const std::int64_t target = targets[i];
    const A m = cross_entropy_detail::row_max(row, V);
    const A target_logit = convert<A>(row[target]);
    if constexpr (std::is_same_v<T, A>) {
      // Stored at full precision: keep each exp(x - m) in the row, so the gradient pass need not
      // compute it again (the same values and the same sum as sum_exp, bit for bit).
      const auto s = cross_entropy_detail::sum_exp<true>(row, V, m);
      losses[i] = cross_entropy_detail::loss_of(m, s, target_logit);
      const A inv_sum = A(1 / s);
      for (std::int64_t v = 0; v < V; ++v) row[v] = (row[v] * inv_sum - (v == target ? A(1) : A(0))) * dloss;
    } else {
      const auto s = cross_entropy_detail::sum_exp(row, V, m);
      losses[i] = cross_entropy_detail::loss_of(m, s, target_logit);
      const A inv_sum = A(1 / s);
      for (std::int64_t v = 0; v < V; ++v) {
        const A p = exp_fast(convert<A>(row[v]) - m) * inv_sum;
        row[v] = convert<T>((p - (v == target ? A(1) : A(0))) * dloss);
      }
    }
    for (std::int64_t v = V; v < Vp; ++v) row[v] = convert<T>(A(0));
  }
}

// Vocabulary-parallel cross-entropy (tensor parallelism): this rank holds columns
// [v_begin, v_begin + Vl) of every row's logits, logits [N, Vl]; global columns >= V are padding.
// The caller combines the pieces over the group between the three steps:
//   1. vocab_parallel_max      row_max[i] = max over this rank's real columns (-inf if none)
//                              -> all-reduce max
//   2. vocab_parallel_sums     sums[2i] = sum of exp(x - row_max) over them (summed in double,
//                              rounded once),
//                              sums[2i+1] = the target's logit if this rank holds it, else 0
//                              -> all-reduce sum
//   3. vocab_parallel_finish   losses[i] = row_max + log(sum) - target logit; with logits not
//                              null, overwrites them with (softmax - onehot) * dloss (0 on padding)
// No rank ever holds a whole row of logits.
template <class T>
void vocab_parallel_max(host, acc_t<T>* row_max, const T* logits, const std::int32_t* targets, std::int64_t N,
                        std::int64_t Vl, std::int64_t v_begin, std::int64_t V) {
  cross_entropy_detail::check_args("vocab_parallel_max", targets, N, V, V);
  const std::int64_t real = std::max<std::int64_t>(0, std::min(Vl, V - v_begin));
#pragma omp parallel for schedule(static) if (N * Vl > 32768)
  for (std::int64_t i = 0; i < N; ++i) row_max[i] = cross_entropy_detail::row_max(logits + i * Vl, real);
}

template <class T>
void vocab_parallel_sums(host, acc_t<T>* sums, const T* logits, const acc_t<T>* row_max, const std::int32_t* targets,
                         std::int64_t N, std::int64_t Vl, std::int64_t v_begin, std::int64_t V) {
  using A = acc_t<T>;
  const std::int64_t real = std::max<std::int64_t>(0, std::min(Vl, V - v_begin));
#pragma omp parallel for schedule(static) if (N * Vl > 32768)
  for (std::int64_t i = 0; i < N; ++i) {
    const T* row = logits + i * Vl;
    const std::int64_t t = std::int64_t(targets[i]) - v_begin;
    sums[2 * i] = A(cross_entropy_detail::sum_exp(row, real, row_max[i]));  // one rounding per rank
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
    const A m = row_max[i];
    const auto s = cross_entropy_detail::sum_t(sums[2 * i]);
    losses[i] = cross_entropy_detail::loss_of(m, s, sums[2 * i + 1]);
    if (!logits) continue;
    T* row = logits + i * Vl;
    const std::int64_t t = std::int64_t(targets[i]) - v_begin;
    const A inv_sum = A(1 / s);
    for (std::int64_t v = 0; v < real; ++v) {
      const A p = exp_fast(convert<A>(row[v]) - m) * inv_sum;
      row[v] = convert<T>((p - (v == t ? A(1) : A(0))) * dloss);
    }
    for (std::int64_t v = real; v < Vl; ++v) row[v] = convert<T>(A(0));
  }
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(cross_entropy_forward)
STRATA_HOST_KERNEL(cross_entropy_forward_backward)
STRATA_HOST_KERNEL(vocab_parallel_max)
STRATA_HOST_KERNEL(vocab_parallel_sums)
STRATA_HOST_KERNEL(vocab_parallel_finish)

}  // namespace strata::kernels
