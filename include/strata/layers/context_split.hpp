// strata/layers/context_split.hpp - which tokens of every sequence a context-parallel rank holds.
//
// Under context parallelism over cp ranks each sequence of T tokens is cut into 2·cp chunks of
// T/(2·cp); rank i holds chunk i and chunk 2·cp-1-i, in that order, as its T/cp local rows.
// With causal attention a query at position p sees p+1 keys, so an early chunk is cheap and a
// late one dear; pairing the i-th cheapest with the i-th dearest gives every rank the same work:
//
//   cp = 2, T = 8 (chunks of 2):  rank 0 holds positions 0 1 6 7, rank 1 holds 2 3 4 5
//
// With cp = 1 the one rank holds the sequence in order and T may be anything.
#pragma once
#include <cstdint>

#include "strata/core/config.hpp"
#include "strata/core/error.hpp"

namespace strata {

// How attention reaches the other ranks' tokens (policy tags strata::ring, strata::all_to_all):
// key/value blocks passed around the ring, or heads and sequence exchanged by all-to-all.
enum class context_form { ring, all_to_all };

struct context_split {
  std::int64_t seq = 0;  // tokens of a whole sequence
  int degree = 1;        // cp
  int rank = 0;          // this rank's place in the cp group

  // Fails, naming the numbers, when the sequence does not cut into 2·cp equal chunks.
  static context_split checked(std::int64_t seq, int degree, int rank) {
    STRATA_CHECK(degree >= 1 && rank >= 0 && rank < degree, "context parallelism: rank ", rank,
                 " is not in a group of ", degree);
    STRATA_CHECK(seq >= 0, "context parallelism: negative sequence length ", seq);
    STRATA_CHECK(degree == 1 || seq % (2 * degree) == 0, "context parallelism cp=", degree,
                 " cuts each sequence into 2·cp = ", 2 * degree, " chunks, which do not divide the sequence length ",
                 seq);
    return {seq, degree, rank};
  }

  // These four run in device code too (context parallelism's copies by position).
  STRATA_HD constexpr std::int64_t local_seq() const { return degree == 1 ? seq : seq / degree; }
  STRATA_HD constexpr std::int64_t chunk() const { return degree == 1 ? seq : seq / (2 * degree); }

  // The absolute position of local row `row` of rank `r`.
  STRATA_HD constexpr std::int64_t position_of(int r, std::int64_t row) const {
    if (degree == 1) return row;
    const std::int64_t c = chunk();
    return row < c ? r * c + row : (2 * degree - 1 - r) * c + (row - c);
  }
  STRATA_HD constexpr std::int64_t position(std::int64_t row) const { return position_of(rank, row); }

  // This rank's rows of whole sequences: local [B, T/cp, width] from whole [B, T, width]...
  template <class T>
  void take(const T* whole, T* local, std::int64_t batch, std::int64_t width) const {
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t i = 0; i < local_seq(); ++i) {
        const T* src = whole + (b * seq + position(i)) * width;
        T* dst = local + (b * local_seq() + i) * width;
        for (std::int64_t j = 0; j < width; ++j) dst[j] = src[j];
      }
  }
  // ...and back: this rank's rows written into their places of whole [B, T, width].
  template <class T>
  void place(const T* local, T* whole, std::int64_t batch, std::int64_t width) const {
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t i = 0; i < local_seq(); ++i) {
        const T* src = local + (b * local_seq() + i) * width;
        T* dst = whole + (b * seq + position(i)) * width;
        for (std::int64_t j = 0; j < width; ++j) dst[j] = src[j];
      }
  }
};

}  // namespace strata
