// strata/core/checked_math.hpp - size arithmetic that says when it overflows.
//
// Sizes read from files (shapes, offsets, counts) are whatever the file says: a product of two
// dimensions of 2^31 or 2^62 must be refused, not wrapped (signed overflow is undefined
// behaviour, and a wrapped size passes the checks that follow it). These return nullopt instead.
#pragma once
#include <cstdint>
#include <optional>
#include <span>

namespace strata {

inline std::optional<std::int64_t> checked_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<std::int64_t> checked_add(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The element count of a shape: nullopt when a dimension is negative or the product of the
// non-zero dimensions overflows (so the answer does not depend on where a zero sits).
inline std::optional<std::int64_t> checked_numel(std::span<const std::int64_t> dims) {
  std::int64_t n = 1;
  bool empty = false;
  for (const auto d : dims) {
    if (d < 0) return std::nullopt;
    if (d == 0) {
      empty = true;
      continue;
    }
    const auto next = checked_mul(n, d);
    if (!next) return std::nullopt;
    n = *next;
  }
  return empty ? 0 : n;
}

}  // namespace strata
