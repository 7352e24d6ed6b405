// strata/kernels/host/rope.hpp - rotary position embedding of the query and key heads, in place in
// the fused qkv buffer [B, T, (H + 2·KV)·d] (kernels/attention_shape.hpp).
//
// Rotate-half pairing (Hugging Face / Meta): in each head, element i < r/2 pairs with i + r/2 and
// both turn by the angle (pos0 + p) · theta^(-2i/r) at position p:
//   x[i]       <- x[i] cos - x[i + r/2] sin
//   x[i + r/2] <- x[i + r/2] cos + x[i] sin
// r is the rotary size: the whole head (d, rotary_dims = 0) or its first r elements (partial
// rotary, as GPT-NeoX with rotary_pct 0.25); elements r .. d-1 keep their values.
// The H query heads and the KV key heads are contiguous at the start of each token's row; the
// value heads are left alone. Backward applies the transpose (the opposite angle) to the same
// parts of the gradient, in place: the rotation is orthogonal.
//
// Each call builds a [T, r/2] cos/sin table first: the angle in double (positions reach 1e5 and
// more, where a float angle loses whole radians' worth of phase), cos and sin rounded once to
// acc_t. Tokens are independent and run in parallel; nothing is summed, so any thread count gives
// the same bits.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/attention_shape.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

namespace strata::kernels {

namespace rope_detail {
inline void check(const char* who, const attention_shape& s, double theta, std::int64_t pos0,
                  std::int64_t rotary_dims) {
  STRATA_CHECK(
      s.valid(), who,
      ": need batch, seq >= 0, heads, kv_heads, head_dim > 0 and kv_heads dividing heads, got batch = ", s.batch,
      ", seq = ", s.seq, ", heads = ", s.heads, ", kv_heads = ", s.kv_heads, ", head_dim = ", s.head_dim);
  STRATA_CHECK(s.head_dim % 2 == 0, who, ": head_dim = ", s.head_dim, " is odd; rotary pairs need an even one");
  STRATA_CHECK(std::isfinite(theta) && theta > 0, who, ": theta must be positive and finite, got ", theta);
  STRATA_CHECK(pos0 >= 0, who, ": negative starting position pos0 = ", pos0);
  STRATA_CHECK(rotary_dims >= 0 && rotary_dims <= s.head_dim && rotary_dims % 2 == 0, who,
               ": the rotary size must be even and within the head (", s.head_dim, "), got ", rotary_dims);
}

// cos [T, r/2] of (pos0 + p) · theta^(-2i/r), then sin [T, r/2]: two unit-stride tables, so the
// rotation loop vectorises.
template <class A>
std::vector<A> table(const attention_shape& s, double theta, std::int64_t pos0, std::int64_t r) {
  const std::int64_t T_ = s.seq, half = r / 2;
  std::vector<double> inv_freq(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i) inv_freq[i] = std::pow(theta, -2.0 * double(i) / double(r));
  std::vector<A> cs(static_cast<std::size_t>(2 * T_ * half));
#pragma omp parallel for schedule(static) if (T_ * half > 1024)
  for (std::int64_t p = 0; p < T_; ++p)
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = double(pos0 + p) * inv_freq[i];
      cs[p * half + i] = A(std::cos(angle));
      cs[(T_ + p) * half + i] = A(std::sin(angle));
    }
  return cs;
}

// Turns the q and k heads of every token by the table's angle, or by its opposite when
// `inverse` (sin negated: the transpose).
template <class T>
void rotate(T* qkv, const attention_shape& s, double theta, std::int64_t pos0, std::int64_t rotary_dims, bool inverse) {
  using A = acc_t<T>;
  const std::int64_t T_ = s.seq, d = s.head_dim, r = rotary_dims > 0 ? rotary_dims : d, half = r / 2, W = s.row_width();
  const std::int64_t heads = s.heads + s.kv_heads, rows = s.batch * T_;
  if (half == 0) return;
  const std::vector<A> cs = table<A>(s, theta, pos0, r);
  const A sign = inverse ? A(-1) : A(1);
#pragma omp parallel for schedule(static) if (rows * heads * d > 65536)
  for (std::int64_t row = 0; row < rows; ++row) {
    const A* cos_row = cs.data() + (row % T_) * half;
    const A* sin_row = cos_row + T_ * half;
    for (std::int64_t h = 0; h < heads; ++h) {
      T* x = qkv + row * W + h * d;
      for (std::int64_t i = 0; i < half; ++i) {
        const A c = cos_row[i], sn = sign * sin_row[i];
        const A x0 = convert<A>(x[i]), x1 = convert<A>(x[i + half]);
        x[i] = convert<T>(x0 * c - x1 * sn);
        x[i + half] = convert<T>(x1 * c + x0 * sn);
      }
    }
  }
}
}  // namespace rope_detail

// In place on qkv [B, T, row_width]: the first rotary_dims elements (0: all) of the q and k heads
// of token p turn by (pos0 + p) · theta^(-2i/rotary_dims).
template <class T>
void rope_forward(host, T* qkv, const attention_shape& s, double theta, std::int64_t pos0 = 0,
                  std::int64_t rotary_dims = 0) {
  rope_detail::check("rope_forward", s, theta, pos0, rotary_dims);
  rope_detail::rotate(qkv, s, theta, pos0, rotary_dims, false);
}

// In place on dqkv [B, T, row_width]: the q and k gradient parts turn back by the opposite angle
// (the rotation's transpose); the v part is untouched. The gradient given becomes the rotation's
// input gradient; nothing is added to anything.
template <class T>
void rope_backward(host, T* dqkv, const attention_shape& s, double theta, std::int64_t pos0 = 0,
                   std::int64_t rotary_dims = 0) {
  rope_detail::check("rope_backward", s, theta, pos0, rotary_dims);
  rope_detail::rotate(dqkv, s, theta, pos0, rotary_dims, true);
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(rope_forward)
STRATA_HOST_KERNEL(rope_backward)

}  // namespace strata::kernels
