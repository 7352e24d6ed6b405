// strata/kernels/host/embedding.hpp - token plus position embedding.
//
//   tokens [B, T] (int32),  wte [V, C] token table,  wpe [maxT, C] position table (T <= maxT)
//   out [B, T, C]:  out[b, t] = wte[tokens[b, t]] + wpe[t]
//
// (T_ is the sequence length T; the template parameter T is the storage type.)
// The backward scatters rows of dout into dwte (see embedding_backward for how it stays
// deterministic). Under tensor parallelism the table is split by vocabulary rows: the *_range
// and position_* pieces below let the layer look up, reduce, and only then add positions.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

namespace strata::kernels {

template <class T>
void embedding_forward(host, T* out, const std::int32_t* tokens, const T* wte, const T* wpe, std::int64_t B,
                       std::int64_t T_, std::int64_t C, std::int64_t V) {
  using A = acc_t<T>;
  STRATA_CHECK(B >= 0 && T_ >= 0 && C >= 0 && V > 0, "embedding_forward: need B, T, C >= 0 and V > 0, got B = ", B,
               ", T = ", T_, ", C = ", C, ", V = ", V);
  const std::int64_t count = B * T_;
  for (std::int64_t i = 0; i < count; ++i)
    if (tokens[i] < 0 || tokens[i] >= V)
      fail("embedding: token id ", tokens[i], " at position ", i, " is out of range for vocab ", V);

#pragma omp parallel for schedule(static) if (count * C > 32768)
  for (std::int64_t i = 0; i < count; ++i) {
    const T* tok_row = wte + std::int64_t(tokens[i]) * C;
    const T* pos_row = wpe + (i % T_) * C;
    T* o = out + i * C;
    for (std::int64_t c = 0; c < C; ++c) o[c] = convert<T>(convert<A>(tok_row[c]) + convert<A>(pos_row[c]));
  }
}

// Vocabulary-parallel pieces (tensor parallelism: this rank holds rows [v_begin, v_begin + Vl)
// of the token table as wte_local [Vl, C]).
//   out[i] = wte_local[tokens[i] - v_begin] for tokens in that range, 0 for the others
// Every token id is checked against the real vocabulary V.
template <class T>
void embedding_lookup_range(host, T* out, const std::int32_t* tokens, const T* wte_local, std::int64_t count,
                            std::int64_t C, std::int64_t v_begin, std::int64_t Vl, std::int64_t V) {
  STRATA_CHECK(count >= 0 && C >= 0 && V > 0 && Vl >= 0 && v_begin >= 0,
               "embedding_lookup_range: bad sizes count = ", count, ", C = ", C, ", V = ", V, ", Vl = ", Vl);
  for (std::int64_t i = 0; i < count; ++i)
    if (tokens[i] < 0 || tokens[i] >= V)
      fail("embedding: token id ", tokens[i], " at position ", i, " is out of range for vocab ", V);
#pragma omp parallel for schedule(static) if (count * C > 32768)
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t local = std::int64_t(tokens[i]) - v_begin;
    T* o = out + i * C;
    if (local >= 0 && local < Vl) {
      const T* row = wte_local + local * C;
      for (std::int64_t c = 0; c < C; ++c) o[c] = row[c];
    } else {
      for (std::int64_t c = 0; c < C; ++c) o[c] = convert<T>(0.0f);
    }
  }
}

// out[i] += wpe[(first_token + i) mod T] for `count` tokens of [B, T] flattened: the position
// embedding of a contiguous piece of the tokens (the whole batch when first_token = 0).
template <class T>
void position_embedding_add(host, T* out, const T* wpe, std::int64_t count, std::int64_t T_, std::int64_t first_token,
                            std::int64_t C) {
  using A = acc_t<T>;
  STRATA_CHECK(count >= 0 && T_ > 0 && C >= 0 && first_token >= 0, "position_embedding_add: bad sizes count = ", count,
               ", T = ", T_, ", C = ", C);
#pragma omp parallel for schedule(static) if (count * C > 32768)
  for (std::int64_t i = 0; i < count; ++i) {
    const T* pos_row = wpe + ((first_token + i) % T_) * C;
    T* o = out + i * C;
    for (std::int64_t c = 0; c < C; ++c) o[c] = convert<T>(convert<A>(o[c]) + convert<A>(pos_row[c]));
  }
}

// Accumulates (+=) into dwte rows [v_begin, v_begin + Vl) (dwte points at row v_begin) the
// rows of dout whose token falls there; other tokens are skipped.
template <class T>
void token_embedding_backward(host, T* dwte, const T* dout, const std::int32_t* tokens, std::int64_t count,
                              std::int64_t C, std::int64_t v_begin, std::int64_t Vl) {
  using A = acc_t<T>;
  STRATA_CHECK(count >= 0 && C >= 0, "token_embedding_backward: negative size count = ", count, ", C = ", C);
  for (std::int64_t i = 0; i < count; ++i)
    if (tokens[i] < 0) fail("embedding: token id ", tokens[i], " at position ", i, " is negative");

  // Positions sorted by token id, ties kept in position order; group g spans
  // order[starts[g] .. starts[g+1]).
  std::vector<std::int64_t> order;
  order.reserve(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i)
    if (tokens[i] >= v_begin && tokens[i] - v_begin < Vl) order.push_back(i);
  const auto kept = static_cast<std::int64_t>(order.size());
  std::stable_sort(order.begin(), order.end(),
                   [tokens](std::int64_t x, std::int64_t y) { return tokens[x] < tokens[y]; });
  std::vector<std::int64_t> starts;
  for (std::int64_t j = 0; j < kept; ++j)
    if (j == 0 || tokens[order[std::size_t(j)]] != tokens[order[std::size_t(j - 1)]]) starts.push_back(j);
  starts.push_back(kept);
  const std::int64_t groups = std::int64_t(starts.size()) - 1;

  constexpr std::int64_t block = 64;
#pragma omp parallel for schedule(dynamic, 4) if (count * C > 32768)
  for (std::int64_t g = 0; g < groups; ++g) {
    const std::int64_t first = starts[std::size_t(g)], last = starts[std::size_t(g + 1)];
    T* row = dwte + (std::int64_t(tokens[order[std::size_t(first)]]) - v_begin) * C;
    for (std::int64_t lo = 0; lo < C; lo += block) {
      const std::int64_t hi = lo + block < C ? lo + block : C;
      A sum[block] = {};
      for (std::int64_t j = first; j < last; ++j) {
        const T* dy = dout + order[std::size_t(j)] * C;
        for (std::int64_t c = lo; c < hi; ++c) sum[c - lo] += convert<A>(dy[c]);
      }
      for (std::int64_t c = lo; c < hi; ++c) row[c] = convert<T>(convert<A>(row[c]) + sum[c - lo]);
    }
  }
}

// Accumulates (+=) into dwpe rows 0 .. T-1: dwpe[t] gets every batch row's dout[b, t], summed
// over b in order.
template <class T>
void position_embedding_backward(host, T* dwpe, const T* dout, std::int64_t B, std::int64_t T_, std::int64_t C) {
  using A = acc_t<T>;
  constexpr std::int64_t block = 64;
#pragma omp parallel for schedule(static) if (B * T_ * C > 32768)
  for (std::int64_t t = 0; t < T_; ++t) {
    for (std::int64_t lo = 0; lo < C; lo += block) {
      const std::int64_t hi = lo + block < C ? lo + block : C;
      A sum[block] = {};
      for (std::int64_t b = 0; b < B; ++b) {
        const T* dy = dout + (b * T_ + t) * C;
        for (std::int64_t c = lo; c < hi; ++c) sum[c - lo] += convert<A>(dy[c]);
      }
      T* row = dwpe + t * C;
      for (std::int64_t c = lo; c < hi; ++c) row[c] = convert<T>(convert<A>(row[c]) + sum[c - lo]);
    }
  }
}

// Accumulates (+=) into dwte [V, C] (only the rows of tokens present) and dwpe [maxT, C]
// (rows 0 .. T-1). Token ids are not re-checked against V (no V here): the forward pass did.
// To stay deterministic without atomics the token rows are summed per distinct token: a stable
// sort groups positions by id (each group in position order) and one thread owns each group.
template <class T>
void embedding_backward(host, T* dwte, T* dwpe, const T* dout, const std::int32_t* tokens, std::int64_t B,
                        std::int64_t T_, std::int64_t C) {
  STRATA_CHECK(B >= 0 && T_ >= 0 && C >= 0, "embedding_backward: negative size B = ", B, ", T = ", T_, ", C = ", C);
  token_embedding_backward(host{}, dwte, dout, tokens, B * T_, C, 0, std::numeric_limits<std::int64_t>::max());
  position_embedding_backward(host{}, dwpe, dout, B, T_, C);
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(embedding_forward)
STRATA_HOST_KERNEL(embedding_lookup_range)
STRATA_HOST_KERNEL(position_embedding_add)
STRATA_HOST_KERNEL(token_embedding_backward)
STRATA_HOST_KERNEL(position_embedding_backward)
STRATA_HOST_KERNEL(embedding_backward)

}  // namespace strata::kernels
