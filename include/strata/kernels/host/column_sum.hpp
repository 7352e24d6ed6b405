// strata/kernels/host/column_sum.hpp - column sums over rows that do not depend on the thread
// count, for the kernels that sum a gradient over tokens (layernorm's weight and bias, a bias
// before GELU) in the same pass that computes the rows.
//
//   row_chunks c(N);  for each chunk k (in parallel): partial row k = the sum of its rows, in order
//   add_chunk_sums(out, partial, c.count, C, ld): out[j] += the chunks' partials of column j, in order
//
// The chunks depend on N alone (at least 64 rows each, at most 64 of them, so the partials stay
// a small [count, C] block), so every column sum has one fixed order. kernels/cuda/column_sum.cuh
// keeps its own chunks, sized for a GPU.
#pragma once
#include <algorithm>
#include <cstdint>

#include "strata/core/dtype.hpp"

namespace strata::kernels::column_sum {

struct row_chunks {
  std::int64_t n, rows, count;
  explicit row_chunks(std::int64_t N)
      : n(N), rows(std::max<std::int64_t>(64, (N + 63) / 64)), count((N + rows - 1) / rows) {}
  std::int64_t begin(std::int64_t k) const { return k * rows; }
  std::int64_t end(std::int64_t k) const { return std::min(n, (k + 1) * rows); }
};

// out[j] += sum over k < count of partial[k * ld + j], k in order, for j < C.
template <class T, class A>
void add_chunk_sums(T* out, const A* partial, std::int64_t count, std::int64_t C, std::int64_t ld) {
#pragma omp parallel for schedule(static) if (count * C > 16384)
  for (std::int64_t j = 0; j < C; ++j) {
    A sum = 0;
    for (std::int64_t k = 0; k < count; ++k) sum += partial[k * ld + j];
    out[j] = convert<T>(convert<A>(out[j]) + sum);
  }
}

}  // namespace strata::kernels::column_sum
