// tests/unit/rope_reference.hpp - the rotary embedding written out in double, the reference the
// RoPE kernels' tests hold them to: rotate-half, x·cos + rotate_half(x)·sin with
// rotate_half(x) = [-x2, x1], on the first r elements (0: all d) of every q and k head, element
// i < r/2 paired with i + r/2, the angle (pos0 + p) · theta^(-2i/r); the rest of each head and
// the value heads kept.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "strata/kernels/attention_shape.hpp"

namespace rope_test {

inline std::vector<double> reference(const std::vector<double>& qkv, const strata::kernels::attention_shape& s,
                                     double theta, std::int64_t pos0, std::int64_t rotary_dims = 0) {
  std::vector<double> y = qkv;
  const std::int64_t d = s.head_dim, r = rotary_dims > 0 ? rotary_dims : d, half = r / 2, W = s.row_width();
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t p = 0; p < s.seq; ++p)
      for (std::int64_t h = 0; h < s.heads + s.kv_heads; ++h) {
        const double* x = qkv.data() + (b * s.seq + p) * W + h * d;
        double* o = y.data() + (b * s.seq + p) * W + h * d;
        for (std::int64_t i = 0; i < r; ++i) {
          const std::int64_t pair = i % half;
          const double angle = double(pos0 + p) * std::pow(theta, -2.0 * double(pair) / double(r));
          const double rotated = i < half ? -x[i + half] : x[i - half];
          o[i] = x[i] * std::cos(angle) + rotated * std::sin(angle);
        }
      }
  return y;
}

}  // namespace rope_test
