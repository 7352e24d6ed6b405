// strata/core/hd_math.hpp - the few math functions that code run on both the CPU and the GPU
// (STRATA_HD) needs: one spelling that calls the host's std:: function in host code and CUDA's
// in device code, so a CPU test runs exactly the code a kernel runs.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "strata/core/config.hpp"

namespace strata::hd {

STRATA_HD inline bool is_finite(double x) {
  std::uint64_t u;
  static_assert(sizeof u == sizeof x);
  std::memcpy(&u, &x, sizeof u);
  return (u & 0x7ff0000000000000ull) != 0x7ff0000000000000ull;
}
STRATA_HD inline double sqrt(double x) {
#if defined(__CUDA_ARCH__)
  return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}
STRATA_HD inline float sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return ::sqrtf(x);
#else
  return std::sqrt(x);
#endif
}
STRATA_HD inline double erfc(double x) {
#if defined(__CUDA_ARCH__)
  return ::erfc(x);
#else
  return std::erfc(x);
#endif
}
STRATA_HD inline float erfc(float x) {
#if defined(__CUDA_ARCH__)
  return ::erfcf(x);
#else
  return std::erfc(x);
#endif
}
STRATA_HD inline double pow(double x, double y) {
#if defined(__CUDA_ARCH__)
  return ::pow(x, y);
#else
  return std::pow(x, y);
#endif
}

}  // namespace strata::hd
