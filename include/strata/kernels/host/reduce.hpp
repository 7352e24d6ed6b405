// strata/kernels/host/reduce.hpp - whole-array helpers for the optimizer and loss scaling:
// the squared norm (for gradient clipping), a finiteness check (for fp16 loss scaling),
// in-place scaling, and elementwise conversion between storage types.
//
//   x, dst, src [n]
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

namespace strata::kernels {

namespace reduce_detail {
// Fixed chunk length: the partial sums are a function of n only, never of the thread count.
inline constexpr std::int64_t chunk = 8192;

// Exponent bits all ones means inf or NaN; for the 16-bit types this is read off the bits.
template <class T>
inline bool is_finite(T x) {
  if constexpr (std::is_same_v<T, bf16>) return (x.bits & 0x7f80u) != 0x7f80u;
  else if constexpr (std::is_same_v<T, fp16>) return (x.bits & 0x7c00u) != 0x7c00u;
  else return std::isfinite(x);
}
}  // namespace reduce_detail

// sum_i x[i]^2 in double: per-chunk partials in parallel, then combined in chunk order.
template <class T>
double sum_of_squares(host, const T* x, std::int64_t n) {
  STRATA_CHECK(n >= 0, "sum_of_squares: negative length ", n);
  const std::int64_t chunks = (n + reduce_detail::chunk - 1) / reduce_detail::chunk;
  std::vector<double> partial(std::size_t(chunks), 0.0);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::int64_t k = 0; k < chunks; ++k) {
    const std::int64_t lo = k * reduce_detail::chunk;
    const std::int64_t hi = lo + reduce_detail::chunk < n ? lo + reduce_detail::chunk : n;
    // 32 interleaved partial sums inside the chunk, combined in a fixed tree: vectorisable into
    // four independent chains of adds (eight lanes, one chain, took 1.2x as long over 14 M
    // gradients), still one order.
    constexpr int lanes = 32;
    double part[lanes] = {};
    std::int64_t i = lo;
    for (; i + lanes <= hi; i += lanes)
      for (int j = 0; j < lanes; ++j) {
        const double d = convert<double>(x[i + j]);
        part[j] += d * d;
      }
    for (; i < hi; ++i) {
      const double d = convert<double>(x[i]);
      part[0] += d * d;
    }
    for (int w = lanes / 2; w >= 1; w /= 2)
      for (int j = 0; j < w; ++j) part[j] += part[j + w];
    partial[std::size_t(k)] = part[0];
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

// *out = (accumulate ? *out : 0) + weight * sum_i x[i]^2, out in host memory (or a space the
// host reads, as the emulated device): the form the trainer's step uses on every device.
template <class T>
void sum_of_squares_into(host, const T* x, std::int64_t n, double* out, bool accumulate = false, double weight = 1.0) {
  const double total = weight * sum_of_squares(host{}, x, n);
  *out = accumulate ? *out + total : total;
}

// True when no element is inf or NaN.
template <class T>
bool all_finite(host, const T* x, std::int64_t n) {
  STRATA_CHECK(n >= 0, "all_finite: negative length ", n);
  int finite = 1;  // an integer reduction: order cannot change the answer
#pragma omp parallel for schedule(static) reduction(& : finite) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) finite &= int(reduce_detail::is_finite(x[i]));
  return finite == 1;
}

// x *= factor, in acc_t<T> (the factor narrowed to it first).
template <class T>
void scale_in_place(host, T* x, std::int64_t n, double factor) {
  using A = acc_t<T>;
  STRATA_CHECK(n >= 0, "scale_in_place: negative length ", n);
  const A f = A(factor);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) x[i] = convert<T>(convert<A>(x[i]) * f);
}

// dst[i] = convert<To>(src[i]): rounds to nearest even when narrowing.
template <class To, class From>
void convert_array(host, To* dst, const From* src, std::int64_t n) {
  STRATA_CHECK(n >= 0, "convert_array: negative length ", n);
  if constexpr (std::is_same_v<To, From>) {
    if (dst != src && n > 0) std::memcpy(static_cast<void*>(dst), src, std::size_t(n) * sizeof(To));
  } else {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (std::int64_t i = 0; i < n; ++i) dst[i] = convert<To>(src[i]);
  }
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(sum_of_squares)
STRATA_HOST_KERNEL(sum_of_squares_into)
STRATA_HOST_KERNEL(all_finite)
STRATA_HOST_KERNEL(scale_in_place)

}  // namespace strata::kernels
