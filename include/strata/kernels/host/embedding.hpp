// strata/kernels/host/embedding.hpp - token plus position embedding.
//
//   tokens [B, T] (int32),  wte [V, C] token table,  wpe [maxT, C] position table (T <= maxT)
//   out [B, T, C]:  out[b, t] = wte[tokens[b, t]] + wpe[t]
//
// (T_ is the sequence length T; the template parameter T is the storage type.)
// The backward scatters rows of dout into dwte. To stay deterministic without atomics it groups
// positions by token id (a stable sort, so each group is in position order) and lets one thread
// own each distinct token's row: a fixed sequential sum, rounded into dwte once.
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/policy/device.hpp"

namespace strata::kernels {

template <class T>
void embedding_forward(host, T* out, const std::int32_t* tokens, const T* wte, const T* wpe,
                       std::int64_t B, std::int64_t T_, std::int64_t C, std::int64_t V) {
  using A = acc_t<T>;
  STRATA_CHECK(B >= 0 && T_ >= 0 && C >= 0 && V > 0, "embedding_forward: need B, T, C >= 0 and V > 0, got B = ",
               B, ", T = ", T_, ", C = ", C, ", V = ", V);
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

// Accumulates (+=) into dwte [V, C] (only the rows of tokens present) and dwpe [maxT, C]
// (rows 0 .. T-1). Token ids are not re-checked against V (no V here): the forward pass did.
template <class T>
void embedding_backward(host, T* dwte, T* dwpe, const T* dout, const std::int32_t* tokens,
                        std::int64_t B, std::int64_t T_, std::int64_t C) {
  using A = acc_t<T>;
  STRATA_CHECK(B >= 0 && T_ >= 0 && C >= 0, "embedding_backward: negative size B = ", B, ", T = ", T_,
               ", C = ", C);
  const std::int64_t count = B * T_;
  for (std::int64_t i = 0; i < count; ++i)
    if (tokens[i] < 0) fail("embedding: token id ", tokens[i], " at position ", i, " is negative");

  // Positions sorted by token id, ties kept in position order; group g spans
  // order[starts[g] .. starts[g+1]).
  std::vector<std::int64_t> order(static_cast<std::size_t>(count));
  std::iota(order.begin(), order.end(), std::int64_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [tokens](std::int64_t x, std::int64_t y) { return tokens[x] < tokens[y]; });
  std::vector<std::int64_t> starts;
  for (std::int64_t j = 0; j < count; ++j)
    if (j == 0 || tokens[order[std::size_t(j)]] != tokens[order[std::size_t(j - 1)]]) starts.push_back(j);
  starts.push_back(count);
  const std::int64_t groups = std::int64_t(starts.size()) - 1;

  constexpr std::int64_t block = 64;
#pragma omp parallel for schedule(dynamic, 4) if (count * C > 32768)
  for (std::int64_t g = 0; g < groups; ++g) {
    const std::int64_t first = starts[std::size_t(g)], last = starts[std::size_t(g + 1)];
    T* row = dwte + std::int64_t(tokens[order[std::size_t(first)]]) * C;
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

  // dwpe[t] gets every batch row's dout[b, t], summed over b in order.
#pragma omp parallel for schedule(static) if (count * C > 32768)
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

}  // namespace strata::kernels
