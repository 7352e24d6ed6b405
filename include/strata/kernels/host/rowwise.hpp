// strata/kernels/host/rowwise.hpp - the host half of the row-wise building blocks
// (kernels/rowwise.hpp says what they do).
//
// row_reduce: rows in parallel (OpenMP, static schedule, above rowwise_parallel_threshold
// elements); each row's sum in layernorm's fixed 16-lane order, so a row's result depends on the
// row alone. sum_columns: the rows cut into fixed chunks (column_sum.hpp's row_chunks, a function
// of the row count only), each chunk's column sums in row order, then each column's chunk sums in
// chunk order: the same bits at any thread count.
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "strata/core/config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/host/column_sum.hpp"
#include "strata/kernels/host/layernorm.hpp"  // layernorm_detail::sum_in_lanes
#include "strata/policy/device.hpp"

namespace strata::kernels {

// Rows x columns above this run in parallel on the host (the library's norms' own threshold).
inline constexpr std::int64_t rowwise_parallel_threshold = 16384;

namespace rowwise_detail {
template <class Op>
using term_t = std::remove_cvref_t<decltype(std::declval<const Op&>().term(std::int64_t(0), std::int64_t(0)))>;
template <class Term>
using column_term_t = std::remove_cvref_t<decltype(std::declval<const Term&>()(std::int64_t(0), std::int64_t(0)))>;
}  // namespace rowwise_detail

// For each row r of [rows, cols]: s = the sum over c of op.term(r, c); v = op.finish(r, s), once;
// then op.write(r, c, v) for every c.
template <class Op>
void row_reduce(host, std::int64_t rows, std::int64_t cols, Op op) {
  using A = rowwise_detail::term_t<Op>;
  STRATA_CHECK(rows >= 0 && cols > 0, "row_reduce: need rows >= 0 and cols > 0, got ", rows, " x ", cols);
#pragma omp parallel for schedule(static) if (rows * cols > rowwise_parallel_threshold)
  for (std::int64_t r = 0; r < rows; ++r) {
    const A s = layernorm_detail::sum_in_lanes<A>(cols, [&op, r](std::int64_t c) { return op.term(r, c); });
    const auto v = op.finish(r, s);
    for (std::int64_t c = 0; c < cols; ++c) op.write(r, c, v);
  }
}

// out[c] += the sum over r of term(r, c), for c < cols: summed in term's type, one rounding into
// out's.
template <class T, class Term>
void sum_columns(host, std::int64_t rows, std::int64_t cols, T* out, Term term) {
  using A = rowwise_detail::column_term_t<Term>;
  STRATA_CHECK(rows >= 0 && cols >= 0, "sum_columns: negative extent ", rows, " x ", cols);
  if (rows == 0 || cols == 0) return;
  const column_sum::row_chunks chunks(rows);
  std::vector<A> partial(static_cast<std::size_t>(chunks.count * cols));
#pragma omp parallel for schedule(static) if (rows * cols > rowwise_parallel_threshold)
  for (std::int64_t k = 0; k < chunks.count; ++k) {
    A* p = partial.data() + k * cols;
    for (std::int64_t c = 0; c < cols; ++c) p[c] = A(0);
    for (std::int64_t r = chunks.begin(k); r < chunks.end(k); ++r)
      for (std::int64_t c = 0; c < cols; ++c) p[c] += term(r, c);
  }
  column_sum::add_chunk_sums(out, partial.data(), chunks.count, cols, cols);
}

}  // namespace strata::kernels
