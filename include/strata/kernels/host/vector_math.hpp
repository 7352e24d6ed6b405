// strata/kernels/host/vector_math.hpp - exp for loops the compiler vectorises.
//
// glibc's expf is a call per element, so a loop over it runs one element at a time. exp_fast is
// branch-free arithmetic the compiler turns into SIMD code: 2^n · e^f with n = round(x / ln 2),
// f = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 split in two parts, so f is exact to float), e^f by its
// Taylor polynomial to degree 7, and 2^n put into the exponent bits. Error: at most 2 ulp over
// the float range (checked against double in test_kernels_precision). exp_fast(-inf) = 0, exp of
// x > 88.72 is +inf, NaN stays NaN, and results that would be subnormal are flushed to 0 (below
// 1.2e-38: nothing a softmax or a sigmoid can tell from 0).
//
// For double, exp_fast is std::exp: the float64 references and finite-difference tests keep the
// library's exp to the last bit.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace strata::kernels {

namespace vector_math_detail {
inline float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace vector_math_detail

// Always inlined: as a call it would stop the caller's loop from vectorising.
[[gnu::always_inline]] inline float exp_fast(float x) {
  constexpr float log2e = 1.44269504088896341f;
  constexpr float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;  // ln 2 = hi + lo, hi exact in 9 bits
  constexpr float max_x = 88.7228390f, min_x = -87.3365448f;        // e^max_x = FLT_MAX, e^min_x = FLT_MIN
  const float xc = x > max_x ? max_x : (x < min_x ? min_x : x);
  // round to nearest by the 1.5·2^23 trick: exact for |t| < 2^22, branch-free.
  constexpr float shifter = 12582912.0f;
  const float n = (xc * log2e + shifter) - shifter;
  const float f = (xc - n * ln2_hi) - n * ln2_lo;
  float p = 1.0f / 5040.0f;
  p = p * f + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  // 2^n for n in [-126, 128]: n = 128 only at x = max_x, where p < 1 keeps the product finite
  // when formed as 2^127 · (2 p).
  const std::int32_t ni = static_cast<std::int32_t>(n);
  const bool top = ni > 127;
  const float scale = vector_math_detail::bits_to_float(static_cast<std::uint32_t>((top ? 127 : ni) + 127) << 23);
  float r = scale * (top ? 2.0f * p : p);
  r = x > max_x ? INFINITY : r;
  r = x < min_x ? 0.0f : r;
  return x != x ? x : r;
}

[[gnu::always_inline]] inline double exp_fast(double x) { return std::exp(x); }

}  // namespace strata::kernels
