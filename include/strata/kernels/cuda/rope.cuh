// strata/kernels/cuda/rope.cuh - rotary position embedding of the query and key heads, in place
// in a fused qkv buffer (kernels/attention_shape.hpp's layout), on the GPU.
//
//   qkv, dqkv [B, T, row_width]: per token heads query heads, kv_heads key heads, kv_heads value
//   heads of head_dim d each. Rotate-half pairing (Hugging Face / Meta) over the rotary size r (d,
//   or the first r elements of each head: partial rotary): for i < r/2 and position p = pos0 + t,
//   element i pairs with i + r/2 and both turn by angle = p * theta^(-2i/r):
//     out[i]       = x[i] cos - x[i + r/2] sin
//     out[i + r/2] = x[i + r/2] cos + x[i] sin
//   Value heads, and elements r .. d-1, are untouched. Backward turns dqkv's q and k parts by -angle (the rotation is
//   orthogonal, so that is its transpose).
//
// One thread per (token, i): the angle, theta^(-2i/r) and its sine and cosine are computed once in
// double (as the host does, so both round the same cos and sin to float) and applied to that pair
// in every query and key head of the token (they sit contiguously at the start of the row). The
// rotation itself is fp32 arithmetic on the widened values, one rounding back to T.
#pragma once
#include <cstdint>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/attention_shape.hpp"
#include "strata/kernels/cuda/common.cuh"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {

// rows = B * T tokens; heads_qk = heads + kv_heads; hd the head size, rd the rotary size (the
// first rd elements of each head turn); sign +1 forward, -1 backward.
template <class T>
__global__ void rope_kernel(T* qkv, std::int64_t rows, std::int64_t seq, int heads_qk, int hd, int rd,
                            std::int64_t row_width, double theta, std::int64_t pos0, float sign) {
  const int half = rd / 2;
  const std::int64_t work = rows * half;
  for (std::int64_t k = thread_index(); k < work; k += grid_stride()) {
    const std::int64_t r = k / half;
    const int i = int(k % half);
    const double p = double(pos0 + r % seq);
    const double angle = p * ::pow(theta, -2.0 * double(i) / double(rd));
    double sn, cs;
    ::sincos(angle, &sn, &cs);
    const float c = float(cs), s = sign * float(sn);
    T* x = qkv + r * row_width + i;
    for (int h = 0; h < heads_qk; ++h, x += hd) {
      const float a = widen(x[0]), b = widen(x[half]);
      x[0] = narrow<T>(a * c - b * s);
      x[half] = narrow<T>(b * c + a * s);
    }
  }
}

inline void check_rope(const char* who, const attention_shape& s, double theta, std::int64_t pos0,
                       std::int64_t rotary_dims) {
  STRATA_CHECK(s.batch >= 0 && s.seq >= 0 && s.heads > 0 && s.kv_heads > 0 && s.head_dim > 0, who,
               ": need batch, seq >= 0 and heads, kv_heads, head_dim > 0, got batch = ", s.batch, ", seq = ", s.seq,
               ", heads = ", s.heads, ", kv_heads = ", s.kv_heads, ", head_dim = ", s.head_dim);
  STRATA_CHECK(s.head_dim % 2 == 0, who, ": the head size must be even, got ", s.head_dim);
  STRATA_CHECK(theta > 0, who, ": theta must be positive, got ", theta);
  STRATA_CHECK(pos0 >= 0, who, ": the first position must be >= 0, got ", pos0);
  STRATA_CHECK(s.heads + s.kv_heads <= (std::int64_t(1) << 30), who, ": too many heads");
  STRATA_CHECK(rotary_dims >= 0 && rotary_dims <= s.head_dim && rotary_dims % 2 == 0, who,
               ": the rotary size must be even and within the head (", s.head_dim, "), got ", rotary_dims);
}

template <class T>
void rope_launch(const char* who, T* qkv, const attention_shape& s, double theta, std::int64_t pos0,
                 std::int64_t rotary_dims, float sign) {
  static_assert(supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  check_rope(who, s, theta, pos0, rotary_dims);
  const std::int64_t rows = s.batch * s.seq, rd = rotary_dims > 0 ? rotary_dims : s.head_dim;
  if (rows == 0) return;
  const auto d = gpu::elementwise_launch(rows * (rd / 2), 1);
  rope_kernel<T><<<d.grid, d.block, 0, gpu::current_stream()>>>(
      qkv, rows, s.seq, int(s.heads + s.kv_heads), int(s.head_dim), int(rd), s.row_width(), theta, pos0, sign);
  STRATA_CUDA_CHECK_LAUNCH(who);
}

}  // namespace cuda_detail

// Rotates the query and key heads of qkv [B, T, row_width] in place (their first rotary_dims
// elements; 0: all); token t at position pos0 + t.
template <class T>
void rope_forward(cuda, T* qkv, const attention_shape& s, double theta, std::int64_t pos0 = 0,
                  std::int64_t rotary_dims = 0) {
  cuda_detail::rope_launch("rope_forward", qkv, s, theta, pos0, rotary_dims, 1.0f);
}

// The gradient through rope_forward, in place: dqkv's query and key parts turned back.
template <class T>
void rope_backward(cuda, T* dqkv, const attention_shape& s, double theta, std::int64_t pos0 = 0,
                   std::int64_t rotary_dims = 0) {
  cuda_detail::rope_launch("rope_backward", dqkv, s, theta, pos0, rotary_dims, -1.0f);
}

}  // namespace strata::kernels
