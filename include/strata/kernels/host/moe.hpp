// strata/kernels/host/moe.hpp - a mixture-of-experts layer's kernels: the router, its per-sequence
// statistics, the dispatch plan, the token permutation, the weighted combine and the per-expert
// linear layers.
//
//   logits [N, E] -> probs = softmax(logits), lse = logsumexp;  the top k experts of each token
//   (experts [N, k], weights [N, k]);  the dispatch plan sorts the N·k (token, slot) pairs by
//   expert into rows; permute gathers each kept pair's token into its row [M, C]; the experts
//   run on their rows (grouped_linear); combine sums each token's rows back, weighted.
//
// Router quantities (probs, lse, weights and their gradients) are acc_t: they feed a loss, and a
// bf16 weight would round every token's mix. Expert ids and rows are int32, as the embedding's
// token ids; offsets and counts are int64.
//
// The dispatch plan is one serial pass over the pairs: a counting sort is memory-bound and its
// order (token, then slot, within an expert) is the same whatever the thread count. The backward
// of permute and combine gathers per token in slot order instead of scattering per row: no
// atomics, and the same bits on any thread count.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/kernels/host/linear.hpp"
#include "strata/kernels/host/vector_math.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

namespace strata::kernels {

namespace moe_detail {
inline void check_route_sizes(const char* who, std::int64_t N, std::int64_t E, std::int64_t k) {
  STRATA_CHECK(N >= 0 && E > 0, who, ": need N >= 0 and E > 0, got N = ", N, ", E = ", E);
  STRATA_CHECK(k >= 1 && k <= E, who, ": k = ", k, " experts per token is not between 1 and E = ", E);
}

// Serial, before any parallel loop: a bad id would index out of bounds there, and an exception
// cannot leave an OpenMP region.
inline void check_experts(const char* who, const std::int32_t* experts, std::int64_t N, std::int64_t k,
                          std::int64_t E) {
  for (std::int64_t i = 0; i < N * k; ++i)
    if (experts[i] < 0 || experts[i] >= E)
      fail(who, ": expert id ", experts[i], " at token ", i / k, ", slot ", i % k, " is not in [0, ", E, ")");
}

inline void check_sequences(const char* who, std::int64_t N, std::int64_t seq) {
  STRATA_CHECK(seq > 0 && N % seq == 0, who, ": the sequence length seq = ", seq, " does not divide N = ", N);
}

// Selection order of the top-k: larger probability first, ties to the lower index. A NaN ranks
// below everything, so the k ids are always distinct and in range, and the NaN reaches the loss
// through the weights rather than an out-of-range row.
template <class A>
A rank_key(A p) {
  return p == p ? p : -std::numeric_limits<A>::infinity();
}
}  // namespace moe_detail

// probs [N, E] = softmax of each row of logits, lse [N] its logsumexp; experts [N, k] the k most
// probable experts, largest first, ties to the lower index; weights [N, k] their probabilities,
// divided by the sum of the k when renormalize.
template <class T>
void moe_route_forward(host, acc_t<T>* probs, acc_t<T>* lse, std::int32_t* experts, acc_t<T>* weights, const T* logits,
                       std::int64_t N, std::int64_t E, std::int64_t k, bool renormalize) {
  using A = acc_t<T>;
  moe_detail::check_route_sizes("moe_route_forward", N, E, k);
#pragma omp parallel for schedule(static) if (N * E * k > 32768)
  for (std::int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * E;
    A* p = probs + n * E;
    A m = -std::numeric_limits<A>::infinity();
    for (std::int64_t j = 0; j < E; ++j) {
      const A v = convert<A>(x[j]);
      m = v > m ? v : m;
    }
    A sum = 0;
    for (std::int64_t j = 0; j < E; ++j) {
      p[j] = exp_fast(convert<A>(x[j]) - m);
      sum += p[j];
    }
    for (std::int64_t j = 0; j < E; ++j) p[j] /= sum;
    lse[n] = m + std::log(sum);

    // k passes, each taking the best expert ranked after the previous pick: no chosen-set
    // buffer, and O(k·E) with k small.
    std::int32_t* ids = experts + n * k;
    A* w = weights + n * k;
    A picked = 0;
    for (std::int64_t s = 0; s < k; ++s) {
      const std::int64_t prev = s > 0 ? ids[s - 1] : -1;
      const A prev_key = s > 0 ? moe_detail::rank_key(p[prev]) : A(0);
      std::int64_t best = -1;
      A best_key = 0;
      for (std::int64_t j = 0; j < E; ++j) {
        const A key = moe_detail::rank_key(p[j]);
        const bool after_prev = s == 0 || key < prev_key || (key == prev_key && j > prev);
        if (after_prev && (best < 0 || key > best_key)) {
          best = j;
          best_key = key;
        }
      }
      ids[s] = static_cast<std::int32_t>(best);
      w[s] = p[best];
      picked += p[best];
    }
    if (renormalize)
      for (std::int64_t s = 0; s < k; ++s) w[s] /= picked;
  }
}

// Writes dlogits [N, E]. The probability gradient of token n is
//   dp_{e_s} = dweights[n, s]                           without renormalisation,
//   dp_{e_s} = (dweights[n, s] - sum_r dw_r w_r) / S    with it (w_s = p_{e_s} / S, S = sum_r p_{e_r}),
// plus dprobs_per_sequence[n / seq, :] (nullable: none) on every expert; then through the softmax,
// dlogit_j = p_j (dp_j - sum_i p_i dp_i), plus the z-loss's p_j · dlse_per_lse · lse_n (dlse_per_lse
// is z for the loss (z/2) sum lse²; 0: none).
template <class T>
void moe_route_backward(host, T* dlogits, const acc_t<T>* dweights, const acc_t<T>* dprobs_per_sequence /*nullable*/,
                        std::int64_t seq, acc_t<T> dlse_per_lse, const acc_t<T>* probs, const acc_t<T>* lse,
                        const std::int32_t* experts, const acc_t<T>* weights, std::int64_t N, std::int64_t E,
                        std::int64_t k, bool renormalize) {
  using A = acc_t<T>;
  moe_detail::check_route_sizes("moe_route_backward", N, E, k);
  STRATA_CHECK(dweights != nullptr, "moe_route_backward: dweights must not be null");
  if (dprobs_per_sequence) moe_detail::check_sequences("moe_route_backward", N, seq);
  moe_detail::check_experts("moe_route_backward", experts, N, k, E);
#pragma omp parallel for schedule(static) if (N * E * k > 32768)
  for (std::int64_t n = 0; n < N; ++n) {
    const A* p = probs + n * E;
    const A* base = dprobs_per_sequence ? dprobs_per_sequence + (n / seq) * E : nullptr;
    const std::int32_t* ids = experts + n * k;
    const A* dw = dweights + n * k;
    const A* w = weights + n * k;
    // The selected experts' extra dp, kept apart from the per-sequence part so no [E] scratch
    // row is needed: dp_j = base_j + (the slot's term when j is selected).
    A S = 1, dot = 0;
    if (renormalize) {
      S = 0;
      for (std::int64_t s = 0; s < k; ++s) S += p[ids[s]], dot += dw[s] * w[s];
    }
    auto selected = [&](std::int64_t s) { return renormalize ? (dw[s] - dot) / S : dw[s]; };
    A D = 0;
    if (base)
      for (std::int64_t j = 0; j < E; ++j) D += p[j] * base[j];
    for (std::int64_t s = 0; s < k; ++s) D += p[ids[s]] * selected(s);
    const A z = dlse_per_lse * lse[n];
    T* out = dlogits + n * E;
    for (std::int64_t j = 0; j < E; ++j) out[j] = convert<T>(p[j] * ((base ? base[j] : A(0)) - D + z));
    // Selected entries rewritten whole: one rounding to T.
    for (std::int64_t s = 0; s < k; ++s) {
      const std::int64_t j = ids[s];
      out[j] = convert<T>(p[j] * ((base ? base[j] : A(0)) + selected(s) - D + z));
    }
  }
}

// stats [N / seq, 2E + 1], written per sequence of seq tokens: columns 0 .. E-1 the sum of probs
// over its tokens, E .. 2E-1 how many of its (token, slot) pairs chose each expert, 2E the sum of
// lse². The load-balancing and z losses are functions of these. Templated on the router's type
// A = acc_t<T> (float or double), not the storage type: it reads no T, and A deduces.
template <class A>
void moe_sequence_stats(host, A* stats, const A* probs, const A* lse, const std::int32_t* experts, std::int64_t N,
                        std::int64_t seq, std::int64_t E, std::int64_t k) {
  static_assert(std::is_same_v<A, float> || std::is_same_v<A, double>,
                "moe_sequence_stats: the router's type is float or double (acc_t of the storage type)");
  moe_detail::check_route_sizes("moe_sequence_stats", N, E, k);
  moe_detail::check_sequences("moe_sequence_stats", N, seq);
  moe_detail::check_experts("moe_sequence_stats", experts, N, k, E);
  const std::int64_t B = N / seq, W = 2 * E + 1;
#pragma omp parallel for schedule(static) if (N * E > 32768)
  for (std::int64_t b = 0; b < B; ++b) {
    A* row = stats + b * W;
    for (std::int64_t j = 0; j < W; ++j) row[j] = 0;
    for (std::int64_t n = b * seq; n < (b + 1) * seq; ++n) {
      for (std::int64_t j = 0; j < E; ++j) row[j] += probs[n * E + j];
      for (std::int64_t s = 0; s < k; ++s) row[E + experts[n * k + s]] += A(1);
      row[2 * E] += lse[n] * lse[n];
    }
  }
}

// Counting sort of the N·k (token, slot) pairs by expert; within an expert by token, then slot.
// capacity > 0: in each group of `group` consecutive tokens (group divides N) only the first
// `capacity` pairs of each expert, in that order, are kept; capacity = 0: all are kept. Writes
//   offsets [E + 1]   rows offsets[e] .. offsets[e+1]-1 are expert e's; offsets[E] = kept pairs
//   slot_row [N, k]   the row of pair (n, s), -1 when dropped
//   row_token [N·k]   the token of each row, -1 from offsets[E] on
//   dropped [E]       pairs dropped per expert
inline void moe_dispatch_plan(host, std::int64_t* offsets, std::int32_t* slot_row, std::int32_t* row_token,
                              std::int64_t* dropped, const std::int32_t* experts, std::int64_t N, std::int64_t k,
                              std::int64_t E, std::int64_t group, std::int64_t capacity) {
  moe_detail::check_route_sizes("moe_dispatch_plan", N, E, k);
  STRATA_CHECK(N <= std::numeric_limits<std::int32_t>::max() / k, "moe_dispatch_plan: N·k = ", N, "·", k,
               " (token, slot) pairs exceed the int32 range of the rows");
  STRATA_CHECK(capacity >= 0, "moe_dispatch_plan: capacity = ", capacity, " is negative (0 keeps every pair)");
  if (capacity > 0)
    STRATA_CHECK(group > 0 && N % group == 0, "moe_dispatch_plan: the capacity group of ", group,
                 " tokens does not divide N = ", N);
  moe_detail::check_experts("moe_dispatch_plan", experts, N, k, E);

  // Pass 1: keep or drop each pair (slot_row holds 0 or -1 until pass 2), count the kept ones.
  std::vector<std::int64_t> kept(static_cast<std::size_t>(E), 0), in_group(static_cast<std::size_t>(E), 0),
      last_group(static_cast<std::size_t>(E), -1);
  for (std::int64_t e = 0; e < E; ++e) dropped[e] = 0;
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t g = capacity > 0 ? n / group : 0;
    for (std::int64_t s = 0; s < k; ++s) {
      const auto e = static_cast<std::size_t>(experts[n * k + s]);
      if (last_group[e] != g) last_group[e] = g, in_group[e] = 0;
      const bool keep = capacity == 0 || in_group[e] < capacity;
      ++in_group[e];
      slot_row[n * k + s] = keep ? 0 : -1;
      if (keep) ++kept[e];
      else ++dropped[e];
    }
  }
  offsets[0] = 0;
  for (std::int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + kept[static_cast<std::size_t>(e)];

  // Pass 2: place the kept pairs, each expert's rows filled in (token, slot) order.
  std::vector<std::int64_t> next(offsets, offsets + E);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t s = 0; s < k; ++s) {
      std::int32_t& row = slot_row[n * k + s];
      if (row < 0) continue;
      const std::int64_t r = next[static_cast<std::size_t>(experts[n * k + s])]++;
      row = static_cast<std::int32_t>(r);
      row_token[r] = static_cast<std::int32_t>(n);
    }
  for (std::int64_t r = offsets[E]; r < N * k; ++r) row_token[r] = -1;
}

// out [M, C]: row r = x row row_token[r], for the M rows in use (M = offsets[E] of the plan).
template <class T>
void moe_permute_forward(host, T* out, const T* x, const std::int32_t* row_token, std::int64_t M, std::int64_t C) {
  STRATA_CHECK(M >= 0 && C > 0, "moe_permute_forward: need M >= 0 and C > 0, got M = ", M, ", C = ", C);
  for (std::int64_t r = 0; r < M; ++r)
    STRATA_CHECK(row_token[r] >= 0, "moe_permute_forward: row ", r, " of M = ", M, " holds no token (", row_token[r],
                 "): M is past the plan's kept rows");
#pragma omp parallel for schedule(static) if (M * C > 65536)
  for (std::int64_t r = 0; r < M; ++r) {
    const T* src = x + std::int64_t(row_token[r]) * C;
    T* dst = out + r * C;
    for (std::int64_t c = 0; c < C; ++c) dst[c] = src[c];
  }
}

// Writes dx [N, C]: row n = the sum of dout over its kept slots' rows, in slot order; 0 when none
// is kept.
template <class T>
void moe_permute_backward(host, T* dx, const T* dout, const std::int32_t* slot_row, std::int64_t N, std::int64_t k,
                          std::int64_t C) {
  using A = acc_t<T>;
  STRATA_CHECK(N >= 0 && k > 0 && C > 0, "moe_permute_backward: need N >= 0, k > 0 and C > 0, got N = ", N, ", k = ", k,
               ", C = ", C);
#pragma omp parallel for schedule(static) if (N * k * C > 65536)
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int32_t* rows = slot_row + n * k;
    T* d = dx + n * C;
    for (std::int64_t c = 0; c < C; ++c) {
      A sum = 0;
      for (std::int64_t s = 0; s < k; ++s)
        if (rows[s] >= 0) sum += convert<A>(dout[std::int64_t(rows[s]) * C + c]);
      d[c] = convert<T>(sum);
    }
  }
}

// y [N, C], written: row n = sum over its kept slots of weights[n, s] · expert_out row
// slot_row[n, s], summed in acc_t in slot order.
template <class T>
void moe_combine_forward(host, T* y, const T* expert_out, const acc_t<T>* weights, const std::int32_t* slot_row,
                         std::int64_t N, std::int64_t k, std::int64_t C) {
  using A = acc_t<T>;
  STRATA_CHECK(N >= 0 && k > 0 && C > 0, "moe_combine_forward: need N >= 0, k > 0 and C > 0, got N = ", N, ", k = ", k,
               ", C = ", C);
#pragma omp parallel for schedule(static) if (N * k * C > 65536)
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int32_t* rows = slot_row + n * k;
    const A* w = weights + n * k;
    T* out = y + n * C;
    for (std::int64_t c = 0; c < C; ++c) {
      A sum = 0;
      for (std::int64_t s = 0; s < k; ++s)
        if (rows[s] >= 0) sum += w[s] * convert<A>(expert_out[std::int64_t(rows[s]) * C + c]);
      out[c] = convert<T>(sum);
    }
  }
}

// Writes dexpert_out [M, C] (row slot_row[n, s] = weights[n, s] · dy row n; every kept row belongs
// to one pair, so each is written once) and dweights [N, k] (dot(dy row n, expert_out row) in
// acc_t; 0 for a dropped slot).
template <class T>
void moe_combine_backward(host, T* dexpert_out, acc_t<T>* dweights, const T* dy, const T* expert_out,
                          const acc_t<T>* weights, const std::int32_t* slot_row, std::int64_t N, std::int64_t k,
                          std::int64_t C) {
  using A = acc_t<T>;
  STRATA_CHECK(N >= 0 && k > 0 && C > 0, "moe_combine_backward: need N >= 0, k > 0 and C > 0, got N = ", N, ", k = ", k,
               ", C = ", C);
#pragma omp parallel for schedule(static) if (N * k * C > 65536)
  for (std::int64_t n = 0; n < N; ++n) {
    const T* g = dy + n * C;
    for (std::int64_t s = 0; s < k; ++s) {
      const std::int64_t r = slot_row[n * k + s];
      if (r < 0) {
        dweights[n * k + s] = 0;
        continue;
      }
      const A w = weights[n * k + s];
      const T* e = expert_out + r * C;
      T* d = dexpert_out + r * C;
      A dot = 0;
      for (std::int64_t c = 0; c < C; ++c) {
        const A gc = convert<A>(g[c]);
        dot += gc * convert<A>(e[c]);
        d[c] = convert<T>(w * gc);
      }
      dweights[n * k + s] = dot;
    }
  }
}

namespace moe_detail {
inline void check_offsets(const char* who, const std::int64_t* offsets, std::int64_t E, std::int64_t in,
                          std::int64_t out) {
  STRATA_CHECK(E > 0 && in > 0 && out > 0, who, ": need E, in and out > 0, got E = ", E, ", in = ", in,
               ", out = ", out);
  STRATA_CHECK(offsets[0] >= 0, who, ": offsets[0] = ", offsets[0], " is negative");
  for (std::int64_t e = 0; e < E; ++e)
    STRATA_CHECK(offsets[e + 1] >= offsets[e], who, ": offsets decrease at expert ", e, ": ", offsets[e], " then ",
                 offsets[e + 1]);
}
}  // namespace moe_detail

// Grouped linear layer: rows offsets[e] .. offsets[e+1]-1 of x [M, in] times expert e's weight
// [out, in] transposed (linear_forward's layout) into the same rows of y [M, out]. One GEMM per
// expert with rows; an expert with none is skipped (its weight may be null).
template <class T>
void grouped_linear_forward(host, workspace& ws, T* y, const T* x, const T* const* weights, const std::int64_t* offsets,
                            std::int64_t E, std::int64_t in, std::int64_t out) {
  moe_detail::check_offsets("grouped_linear_forward", offsets, E, in, out);
  for (std::int64_t e = 0; e < E; ++e) {
    const std::int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
    if (rows == 0) continue;
    STRATA_CHECK(weights[e] != nullptr, "grouped_linear_forward: expert ", e, " has ", rows, " rows but no weight");
    linear_forward(host{}, ws, y + r0 * out, x + r0 * in, weights[e], nullptr, rows, in, out);
  }
}

// Writes dx [M, in] (nullable: not computed) and accumulates dweights[e] [out, in] += dyᵀ · x over
// expert e's rows.
template <class T>
void grouped_linear_backward(host, workspace& ws, T* dx /*nullable*/, T* const* dweights, const T* dy, const T* x,
                             const T* const* weights, const std::int64_t* offsets, std::int64_t E, std::int64_t in,
                             std::int64_t out) {
  moe_detail::check_offsets("grouped_linear_backward", offsets, E, in, out);
  for (std::int64_t e = 0; e < E; ++e) {
    const std::int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
    if (rows == 0) continue;
    STRATA_CHECK(weights[e] != nullptr && dweights[e] != nullptr, "grouped_linear_backward: expert ", e, " has ", rows,
                 " rows but no weight or weight gradient");
    linear_backward(host{}, ws, dx ? dx + r0 * in : nullptr, dweights[e], nullptr, dy + r0 * out, x + r0 * in,
                    weights[e], rows, in, out);
  }
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(moe_route_forward)
STRATA_HOST_KERNEL(moe_route_backward)
STRATA_HOST_KERNEL_AS(float, decltype(moe_sequence_stats<float>) moe_sequence_stats<float>)
STRATA_HOST_KERNEL_AS(double, decltype(moe_sequence_stats<double>) moe_sequence_stats<double>)
STRATA_HOST_KERNEL(moe_permute_forward)
STRATA_HOST_KERNEL(moe_permute_backward)
STRATA_HOST_KERNEL(moe_combine_forward)
STRATA_HOST_KERNEL(moe_combine_backward)
STRATA_HOST_KERNEL(grouped_linear_forward)
STRATA_HOST_KERNEL(grouped_linear_backward)

}  // namespace strata::kernels
