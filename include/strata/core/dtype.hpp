// strata/core/dtype.hpp - the storage types strata computes with: fp32, bf16 and fp16.
//
// bf16 and fp16 are 16-bit storage formats; arithmetic happens after widening to float.
// Narrowing rounds to nearest, ties to even, on the host and the device alike, so a weight
// rounded on the CPU matches the GPU bit for bit. NaN stays NaN; overflow goes to infinity.
//
// fp16 on a CPU with F16C (the compiler targets it: -march=native) converts with the hardware's
// one-instruction conversions, which round the same way (a test holds them to the portable code
// below over every half and a sweep of floats); only a NaN's payload bits may differ.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "strata/core/config.hpp"

#if defined(__F16C__) && !defined(__CUDACC__)
#include <immintrin.h>
#define STRATA_HOST_F16C 1
#else
#define STRATA_HOST_F16C 0
#endif

namespace strata {

namespace detail {
STRATA_HD STRATA_ALWAYS_INLINE inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
STRATA_HD STRATA_ALWAYS_INLINE inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace detail

// bfloat16: the top 16 bits of an IEEE float (8 exponent bits, 7 mantissa bits).
struct bf16 {
  std::uint16_t bits = 0;

  bf16() = default;
  STRATA_HD STRATA_ALWAYS_INLINE explicit bf16(float f) : bits(from_float(f)) {}
  STRATA_HD STRATA_ALWAYS_INLINE explicit operator float() const {
    return detail::bits_float(std::uint32_t(bits) << 16);
  }

  STRATA_HD static bf16 from_bits(std::uint16_t b) {
    bf16 h;
    h.bits = b;
    return h;
  }
  STRATA_HD STRATA_ALWAYS_INLINE static std::uint16_t from_float(float f) {
    std::uint32_t u = detail::float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40u);  // quiet NaN
    // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
    std::uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb;
    return std::uint16_t(u >> 16);
  }
};

// IEEE 754 binary16: 5 exponent bits (bias 15), 10 mantissa bits, subnormals below 2^-14.
struct fp16 {
  std::uint16_t bits = 0;

  fp16() = default;
  STRATA_HD STRATA_ALWAYS_INLINE explicit fp16(float f) : bits(from_float(f)) {}
  STRATA_HD STRATA_ALWAYS_INLINE explicit operator float() const { return to_float(bits); }

  STRATA_HD static fp16 from_bits(std::uint16_t b) {
    fp16 h;
    h.bits = b;
    return h;
  }

  STRATA_HD STRATA_ALWAYS_INLINE static std::uint16_t from_float(float f) {
#if STRATA_HOST_F16C
    return std::uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
#else
    return from_float_portable(f);
#endif
  }
  STRATA_HD STRATA_ALWAYS_INLINE static float to_float(std::uint16_t h) {
#if STRATA_HOST_F16C
    return _cvtsh_ss(h);
#else
    return to_float_portable(h);
#endif
  }

  // The conversions in plain integer arithmetic (the device's, and the host's without F16C).
  STRATA_HD STRATA_ALWAYS_INLINE static std::uint16_t from_float_portable(float f) {
    std::uint32_t u = detail::float_bits(f);
    std::uint32_t sign = (u >> 16) & 0x8000u;
    std::uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return std::uint16_t(sign | 0x7e00u);   // NaN
    if (abs >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
    if (abs < 0x38800000u) {
      // Result is subnormal (or zero): value = m * 2^-24 with m < 1024. Add 0.5 (as float)
      // so the FPU's own round-to-nearest-even lands the integer in the low mantissa bits.
      float shifted = detail::bits_float(abs) + 0.5f;
      return std::uint16_t(sign | (detail::float_bits(shifted) - 0x3f000000u));
    }
    // Normal: rebias the exponent (127 -> 15) and round 13 dropped bits to nearest even.
    std::uint32_t lsb = (abs >> 13) & 1u;
    abs += 0xfffu + lsb;
    abs -= (127u - 15u) << 23;
    return std::uint16_t(sign | (abs >> 13));
  }

  STRATA_HD STRATA_ALWAYS_INLINE static float to_float_portable(std::uint16_t h) {
    std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
    std::uint32_t exp = (h >> 10) & 0x1fu;
    std::uint32_t man = h & 0x3ffu;
    if (exp == 0x1fu) return detail::bits_float(sign | 0x7f800000u | (man << 13));  // inf/NaN
    if (exp == 0) {
      // Subnormal or zero: exact as man * 2^-24.
      float v = float(man) * (1.0f / 16777216.0f);
      return sign ? -v : v;
    }
    return detail::bits_float(sign | ((exp + 127u - 15u) << 23) | (man << 13));
  }
};

// Widening and narrowing between any two strata scalar types.
template <class To, class From>
STRATA_HD STRATA_ALWAYS_INLINE inline To convert(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (std::is_same_v<From, bf16> || std::is_same_v<From, fp16>) {
    return convert<To>(static_cast<float>(x));
  } else if constexpr (std::is_same_v<To, bf16> || std::is_same_v<To, fp16>) {
    return To(static_cast<float>(x));
  } else {
    return static_cast<To>(x);
  }
}

// The type arithmetic on a storage type is carried out in: double stays double (used by the
// gradient checks), everything narrower accumulates in float.
template <class T>
struct accumulate_type {
  using type = float;
};
template <>
struct accumulate_type<double> {
  using type = double;
};
template <class T>
using acc_t = typename accumulate_type<T>::type;

template <class T>
inline constexpr bool is_scalar_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

template <class T>
constexpr const char* dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "fp32";
  else if constexpr (std::is_same_v<T, double>) return "fp64";
  else if constexpr (std::is_same_v<T, bf16>) return "bf16";
  else if constexpr (std::is_same_v<T, fp16>) return "fp16";
  else return "unknown";
}

static_assert(sizeof(bf16) == 2 && sizeof(fp16) == 2, "16-bit storage types must be 2 bytes");

}  // namespace strata
