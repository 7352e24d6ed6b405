// strata/kernels/host/qkv_layout.hpp - a fused QKV row between the per-head layout and the
// grouped one (kernels/qkv_layout.hpp), on the host.
//
//   per_head [rows, heads, 3, d]:  head h's q at (3h)·d, its k at (3h + 1)·d, its v at (3h + 2)·d
//   grouped  [rows, 3, heads, d]:  head h's q at h·d, its k at (H + h)·d, its v at (2H + h)·d
//
// A permutation (multi-head attention only: as many key/value heads as query heads): values are
// copied, never changed, so backward is the opposite permutation of the gradient. Out of place:
// the two buffers must not overlap.
#pragma once
#include <algorithm>
#include <cstdint>

#include "strata/core/error.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

namespace strata::kernels {

namespace qkv_layout_detail {
inline void check(const char* who, std::int64_t rows, std::int64_t heads, std::int64_t head_dim) {
  STRATA_CHECK(rows >= 0 && heads > 0 && head_dim > 0, who,
               ": need rows >= 0 and heads, head_dim > 0, got rows = ", rows, ", heads = ", heads,
               ", head_dim = ", head_dim);
}
// Copies each (row, part, head)'s d values between the layouts; to_grouped says which way.
template <class T>
void permute(T* out, const T* in, std::int64_t rows, std::int64_t H, std::int64_t d, bool to_grouped) {
  const std::int64_t W = 3 * H * d;
#pragma omp parallel for schedule(static) if (rows * W > 65536)
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t part = 0; part < 3; ++part) {
        const std::int64_t per_head = r * W + (3 * h + part) * d, grouped = r * W + (part * H + h) * d;
        if (to_grouped) std::copy_n(in + per_head, d, out + grouped);
        else std::copy_n(in + grouped, d, out + per_head);
      }
}
}  // namespace qkv_layout_detail

// grouped [rows, 3·H·d] from per_head [rows, 3·H·d].
template <class T>
void qkv_from_per_head(host, T* grouped, const T* per_head, std::int64_t rows, std::int64_t heads,
                       std::int64_t head_dim) {
  qkv_layout_detail::check("qkv_from_per_head", rows, heads, head_dim);
  qkv_layout_detail::permute(grouped, per_head, rows, heads, head_dim, true);
}

// per_head [rows, 3·H·d] from grouped [rows, 3·H·d]: the inverse, and so the gradient's way back.
template <class T>
void qkv_to_per_head(host, T* per_head, const T* grouped, std::int64_t rows, std::int64_t heads,
                     std::int64_t head_dim) {
  qkv_layout_detail::check("qkv_to_per_head", rows, heads, head_dim);
  qkv_layout_detail::permute(per_head, grouped, rows, heads, head_dim, false);
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(qkv_from_per_head)
STRATA_HOST_KERNEL(qkv_to_per_head)

}  // namespace strata::kernels
