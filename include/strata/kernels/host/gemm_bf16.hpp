// strata/kernels/host/gemm_bf16.hpp - strata's own packed GEMM: bf16 on CPUs with a bf16
// dot-product unit, for kernels::gemm<bf16> (the inputs are never widened to fp32 copies), and the
// same blocking in fp32 on AVX-512, for kernels::gemm<float> where the BLAS runs without AVX-512.
//
//   c32[M,N] = op(A)[M,K] · op(B)[K,N], A and B bf16 (or float), c32 fp32 (kernels::gemm then
//   forms alpha · c32 + beta · C and, for bf16, rounds once)
//
// Three micro-kernels run the same packed blocks:
// - AMX (Intel's tile matrix unit): one tdpbf16ps multiplies a 16 x 32 bf16 tile by a 32 x 16
//   one into a 16 x 16 fp32 tile.
// - AVX-512 BF16 (Cooper Lake, Sapphire Rapids and later Xeons, AMD Zen 4 and 5): one vdpbf16ps
//   adds to each of 16 fp32 lanes the two products of a k pair; the micro-kernel keeps 8 rows x
//   32 columns of C in 16 vector registers and broadcasts each row's k pair from the A pack.
// - AVX-512 fp32: the same loop with one float per 32-bit word where bf16 has a k pair, and a
//   fused multiply-add per word.
// bf16 products are exact and every sum is fp32. The usual blocking: per (MC x KC) block op(A) is
// packed into tiles of 16 rows of 64 bytes (32 bf16 k, or 16 float k), per (KC x NC) block op(B)
// into tiles of 16 columns, 64 bytes per k pair (bf16, the layout both bf16 instructions read) or
// per k (fp32); a micro-kernel sums a 32 x 32 block of C over the K block. One thread sums each
// (MC x NC) block of C over its K blocks in order (product() says how the blocks are shared), so
// every element's sum runs in an order fixed by the shape alone: the result does not depend on
// the thread count. Edges of M, N and K are zero-padded in the packs.
//
// Precision: kernels::gemm's contract (fp32 accumulation of exact products); the bf16 units flush
// subnormal inputs and results (below 1.2e-38) to zero.
//
// Compiled where the compiler targets a unit (-march=native on such a CPU). For bf16, AMX is used
// when the kernel grants the process the tile state (Linux 5.16+, arch_prctl
// ARCH_REQ_XCOMP_PERM), else AVX-512 BF16 where the CPU has it; with neither, unit() is none and
// bf16 goes through fp32 copies and sgemm. fp32 runs here only where kernels/host/gemm.hpp finds
// the BLAS without AVX-512 (gemm_detail::own_fp32_kernel).
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define STRATA_HOST_BF16_AMX 1
#else
#define STRATA_HOST_BF16_AMX 0
#endif
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define STRATA_HOST_BF16_AVX512 1
#else
#define STRATA_HOST_BF16_AVX512 0
#endif
#if STRATA_HOST_BF16_AMX || STRATA_HOST_BF16_AVX512
#define STRATA_HOST_BF16_GEMM 1
#else
#define STRATA_HOST_BF16_GEMM 0
#endif
// The same blocking in fp32 with AVX-512 FMAs, for a BLAS that runs without AVX-512 on a CPU that
// has it (kernels/host/gemm.hpp decides).
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define STRATA_HOST_FP32_AVX512 1
#else
#define STRATA_HOST_FP32_AVX512 0
#endif

#include <string>

namespace strata::kernels::gemm_bf16 {
enum class unit { none, amx, avx512_bf16 };
}  // namespace strata::kernels::gemm_bf16

#if STRATA_HOST_BF16_GEMM || STRATA_HOST_FP32_AVX512
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/kernels/host/openmp.hpp"

// GCC 12's AVX-512 intrinsics start from an undefined vector, which it then reports as
// uninitialised, or maybe so, wherever they are inlined (fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace strata::kernels::gemm_bf16 {

inline constexpr std::int64_t TK = 32;                       // k per tile
inline constexpr std::int64_t KC = 384, MC = 192, NC = 256;  // multiples of 32

// The unit this process multiplies on, decided once: AMX where compiled and the kernel grants the
// tile registers, else AVX-512 BF16 where compiled and the CPU has it.
inline unit in_use() {
  static const unit chosen = [] {
#if STRATA_HOST_BF16_AMX
    constexpr long req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    if (syscall(SYS_arch_prctl, req_xcomp_perm, xfeature_xtiledata) == 0) return unit::amx;
#endif
#if STRATA_HOST_BF16_AVX512
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512bf16")) return unit::avx512_bf16;
#endif
    return unit::none;
  }();
  return chosen;
}
inline bool available() { return in_use() != unit::none; }

// Every tile 16 rows of 64 bytes: C (0-3) 16 x 16 fp32, A (4, 5) 16 x 32 bf16, B (6, 7) 16 pairs x 16.
struct alignas(64) tile_config {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// op(X)[r, c] of a row-major X with leading dimension ld (op(X) = Xᵀ when trans).
inline std::uint16_t at(const bf16* x, std::int64_t ld, bool trans, std::int64_t r, std::int64_t c) {
  return trans ? x[c * ld + r].bits : x[r * ld + c].bits;
}

#if defined(__AVX512F__)
// Stores the 16 x 16 transpose of w's 32-bit words as a tile's 16 rows: row i holds word i of
// every w[j]. Pairs of rows interleaved by 32 and then 64 bits leave, in 128-bit lane l of
// u[4g + c], words 4l + c of w[4g .. 4g+3]; the lanes then move into place.
inline void store_transposed_words(std::uint16_t* tile, const __m512i (&w)[16]) {
  __m512i t[16], u[16];
  for (int g = 0; g < 8; ++g) {
    t[2 * g] = _mm512_unpacklo_epi32(w[2 * g], w[2 * g + 1]);
    t[2 * g + 1] = _mm512_unpackhi_epi32(w[2 * g], w[2 * g + 1]);
  }
  for (int g = 0; g < 4; ++g) {
    u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), x1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
    const __m512i y0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44),
                  y1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    _mm512_storeu_si512(tile + c * TK, _mm512_shuffle_i32x4(x0, y0, 0x88));
    _mm512_storeu_si512(tile + (4 + c) * TK, _mm512_shuffle_i32x4(x0, y0, 0xDD));
    _mm512_storeu_si512(tile + (8 + c) * TK, _mm512_shuffle_i32x4(x1, y1, 0x88));
    _mm512_storeu_si512(tile + (12 + c) * TK, _mm512_shuffle_i32x4(x1, y1, 0xDD));
  }
}

// One whole tile of a transposed A: tile[r * TK + kk] = A[(col0 + kk) * lda + row0 + r]. Each
// pair of source rows (k, k + 1) becomes one vector of 32-bit words (a k pair per row r), whose
// transpose is the tile: 16 vector stores instead of 512 scattered 16-bit ones.
inline void pack_transposed_a_tile(std::uint16_t* tile, const bf16* A, std::int64_t lda, std::int64_t row0,
                                   std::int64_t col0) {
  __m512i w[16];
  for (int q = 0; q < 16; ++q) {
    const auto* even = reinterpret_cast<const __m256i*>(A + (col0 + 2 * q) * lda + row0);
    const auto* odd = reinterpret_cast<const __m256i*>(A + (col0 + 2 * q + 1) * lda + row0);
    w[q] = _mm512_or_si512(_mm512_cvtepu16_epi32(_mm256_loadu_si256(even)),
                           _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(odd)), 16));
  }
  store_transposed_words(tile, w);
}

// One whole tile of a transposed B: row p, word c holds op(B)'s k pair 2p, 2p + 1 of column c,
// which is word p of B's row col0 + c (contiguous in k): a transpose of 16 rows of 16 words.
inline void pack_transposed_b_tile(std::uint16_t* tile, const bf16* B, std::int64_t ldb, std::int64_t row0,
                                   std::int64_t col0) {
  __m512i w[16];
  for (int c = 0; c < 16; ++c) w[c] = _mm512_loadu_si512(B + (col0 + c) * ldb + row0);
  store_transposed_words(tile, w);
}

#if defined(__AVX512BW__)
// One whole tile of an untransposed B: row p interleaves rows row0 + 2p and row0 + 2p + 1 of B,
// 16 columns from col0 (even, odd, even, odd, ...): one permutation of the two rows per row.
inline void pack_interleaved_tile(std::uint16_t* tile, const bf16* B, std::int64_t ldb, std::int64_t row0,
                                  std::int64_t col0) {
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                         5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (std::int64_t p = 0; p < TK / 2; ++p) {
    const auto* even = reinterpret_cast<const __m256i*>(B + (row0 + 2 * p) * ldb + col0);
    const auto* odd = reinterpret_cast<const __m256i*>(B + (row0 + 2 * p + 1) * ldb + col0);
    const __m512i both =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(even)), _mm256_loadu_si256(odd), 1);
    _mm512_storeu_si512(tile + p * TK, _mm512_permutexvar_epi16(order, both));
  }
}
#endif
#endif

// op(A)[i0 .. i0+mc, k0 .. k0+kc] as 16 x 32 tiles: tile (g, s) holds rows i0 + 16g .., k from
// k0 + 32s; outside the block, zeros. Whole tiles copy rows (or gather columns of a transposed A).
inline void pack_a(std::uint16_t* dst, const bf16* A, std::int64_t lda, bool trans, std::int64_t i0, std::int64_t mc,
                   std::int64_t k0, std::int64_t kc) {
  const std::int64_t groups = (mc + 15) / 16, steps = (kc + TK - 1) / TK;
  for (std::int64_t g = 0; g < groups; ++g)
    for (std::int64_t s = 0; s < steps; ++s) {
      std::uint16_t* tile = dst + (g * steps + s) * 16 * TK;
      const std::int64_t row0 = i0 + g * 16, col0 = k0 + s * TK;
      if (g * 16 + 16 <= mc && s * TK + TK <= kc) {
        if (!trans) {
          for (std::int64_t r = 0; r < 16; ++r) std::memcpy(tile + r * TK, A + (row0 + r) * lda + col0, TK * 2);
        } else {
#if defined(__AVX512F__)
          pack_transposed_a_tile(tile, A, lda, row0, col0);
#else
          for (std::int64_t kk = 0; kk < TK; ++kk) {
            const bf16* src = A + (col0 + kk) * lda + row0;
            for (std::int64_t r = 0; r < 16; ++r) tile[r * TK + kk] = src[r].bits;
          }
#endif
        }
        continue;
      }
      for (std::int64_t r = 0; r < 16; ++r) {
        const std::int64_t row = g * 16 + r;
        for (std::int64_t kk = 0; kk < TK; ++kk) {
          const std::int64_t k = s * TK + kk;
          tile[r * TK + kk] = row < mc && k < kc ? at(A, lda, trans, i0 + row, k0 + k) : 0;
        }
      }
    }
}

// op(B)[k0 .. k0+kc, j0 .. j0+nc] as tiles of 16 k pairs x 16 columns: tile (h, s), row p holds
// for each column c the values at k0 + 32s + 2p and + 1; outside the block, zeros. Whole tiles
// interleave two rows of B (or, for a transposed B, move each column's pairs as 32-bit words).
inline void pack_b(std::uint16_t* dst, const bf16* B, std::int64_t ldb, bool trans, std::int64_t k0, std::int64_t kc,
                   std::int64_t j0, std::int64_t nc) {
  const std::int64_t groups = (nc + 15) / 16, steps = (kc + TK - 1) / TK;
  for (std::int64_t h = 0; h < groups; ++h)
    for (std::int64_t s = 0; s < steps; ++s) {
      std::uint16_t* tile = dst + (h * steps + s) * 16 * TK;
      const std::int64_t row0 = k0 + s * TK, col0 = j0 + h * 16;
      if (h * 16 + 16 <= nc && s * TK + TK <= kc) {
        if (trans) {
#if defined(__AVX512F__)
          pack_transposed_b_tile(tile, B, ldb, row0, col0);
#else
          for (std::int64_t c = 0; c < 16; ++c) {
            const bf16* src = B + (col0 + c) * ldb + row0;  // op(B)'s column: contiguous in k
            for (std::int64_t p = 0; p < TK / 2; ++p) std::memcpy(tile + p * TK + 2 * c, src + 2 * p, 4);
          }
#endif
        } else {
#if defined(__AVX512BW__)
          pack_interleaved_tile(tile, B, ldb, row0, col0);
#else
          for (std::int64_t p = 0; p < TK / 2; ++p) {
            const bf16* even = B + (row0 + 2 * p) * ldb + col0;
            const bf16* odd = even + ldb;
            for (std::int64_t c = 0; c < 16; ++c) {
              tile[p * TK + 2 * c] = even[c].bits;
              tile[p * TK + 2 * c + 1] = odd[c].bits;
            }
          }
#endif
        }
        continue;
      }
      for (std::int64_t c = 0; c < 16; ++c) {
        const std::int64_t col = h * 16 + c;
        for (std::int64_t kk = 0; kk < TK; ++kk) {
          const std::int64_t k = s * TK + kk;
          tile[(kk / 2) * TK + 2 * c + (kk % 2)] = col < nc && k < kc ? at(B, ldb, trans, k0 + k, j0 + col) : 0;
        }
      }
    }
}

#if STRATA_HOST_BF16_AMX
// block[32 x 32] (+)= A rows of tile groups g, g+1 · B columns of groups h, h+1 over `steps`
// k tiles. Absent groups (past the block) are read as padding the packs hold.
inline void micro_kernel_amx(std::int64_t steps, const std::uint16_t* a0, const std::uint16_t* a1,
                             const std::uint16_t* b0, const std::uint16_t* b1, float* block, bool accumulate) {
  constexpr int stride = 32 * sizeof(float);
  if (accumulate) {
    _tile_loadd(0, block, stride);
    _tile_loadd(1, block + 16, stride);
    _tile_loadd(2, block + 16 * 32, stride);
    _tile_loadd(3, block + 16 * 32 + 16, stride);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (std::int64_t s = 0; s < steps; ++s) {
    const std::int64_t at_step = s * 16 * TK;
    _tile_loadd(4, a0 + at_step, TK * 2);
    _tile_loadd(5, a1 + at_step, TK * 2);
    _tile_loadd(6, b0 + at_step, TK * 2);
    _tile_loadd(7, b1 + at_step, TK * 2);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, block, stride);
  _tile_stored(1, block + 16, stride);
  _tile_stored(2, block + 16 * 32, stride);
  _tile_stored(3, block + 16 * 32 + 16, stride);
}
#endif

#if STRATA_HOST_BF16_AVX512
// rows (8 x 32 floats, a row stride of 32) (+)= 8 rows of A tiles (a: the first row's start in
// each tile, a row TK apart) · B columns of tile groups b0, b1, over `steps` k tiles: per k pair,
// two B vectors and one broadcast k pair of each row, 16 independent accumulators.
inline void eight_rows_avx512(std::int64_t steps, const std::uint16_t* a, const std::uint16_t* b0,
                              const std::uint16_t* b1, float* rows, bool accumulate) {
  __m512 acc[8][2];
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) {
    acc[r][0] = accumulate ? _mm512_load_ps(rows + r * 32) : _mm512_setzero_ps();
    acc[r][1] = accumulate ? _mm512_load_ps(rows + r * 32 + 16) : _mm512_setzero_ps();
  }
  for (std::int64_t s = 0; s < steps; ++s) {
    const std::int64_t at_step = s * 16 * TK;
    for (std::int64_t p = 0; p < TK / 2; ++p) {
      const auto left = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b0 + at_step + p * TK));
      const auto right = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b1 + at_step + p * TK));
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        std::int32_t pair;
        std::memcpy(&pair, a + at_step + r * TK + 2 * p, sizeof pair);
        const auto both = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], both, left);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], both, right);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) {
    _mm512_store_ps(rows + r * 32, acc[r][0]);
    _mm512_store_ps(rows + r * 32 + 16, acc[r][1]);
  }
}

// The AMX micro-kernel's contract on AVX-512 BF16: the 32 x 32 block as four strips of 8 rows.
inline void micro_kernel_avx512(std::int64_t steps, const std::uint16_t* a0, const std::uint16_t* a1,
                                const std::uint16_t* b0, const std::uint16_t* b1, float* block, bool accumulate) {
  eight_rows_avx512(steps, a0, b0, b1, block, accumulate);
  eight_rows_avx512(steps, a0 + 8 * TK, b0, b1, block + 8 * 32, accumulate);
  eight_rows_avx512(steps, a1, b0, b1, block + 16 * 32, accumulate);
  eight_rows_avx512(steps, a1 + 8 * TK, b0, b1, block + 24 * 32, accumulate);
}
#endif

#if STRATA_HOST_FP32_AVX512
// fp32 in the same layout, one float per 32-bit word where bf16 has a k pair: a tile of op(A)
// is 16 rows of 16 k, a tile of op(B) 16 k of 16 columns, each 64-byte row TK 16-bit units
// apart, so the driver below and its offsets serve both element types.
inline constexpr std::int64_t TK_FP32 = TK / 2;  // k per tile

// op(A)[i0 .. i0+mc, k0 .. k0+kc] as 16 x 16 tiles of floats: tile (g, s) holds rows i0 + 16g ..,
// k from k0 + 16s; outside the block, zeros.
inline void pack_a_fp32(float* dst, const float* A, std::int64_t lda, bool trans, std::int64_t i0, std::int64_t mc,
                        std::int64_t k0, std::int64_t kc) {
  const std::int64_t groups = (mc + 15) / 16, steps = (kc + TK_FP32 - 1) / TK_FP32;
  for (std::int64_t g = 0; g < groups; ++g)
    for (std::int64_t s = 0; s < steps; ++s) {
      float* tile = dst + (g * steps + s) * 16 * TK_FP32;
      const std::int64_t row0 = i0 + g * 16, col0 = k0 + s * TK_FP32;
      if (g * 16 + 16 <= mc && s * TK_FP32 + TK_FP32 <= kc) {
        if (!trans) {
          for (std::int64_t r = 0; r < 16; ++r)
            std::memcpy(tile + r * TK_FP32, A + (row0 + r) * lda + col0, TK_FP32 * sizeof(float));
        } else {  // A stored k-major: row k of the source is 16 rows' values at that k
          __m512i w[16];
          for (int q = 0; q < 16; ++q) w[q] = _mm512_castps_si512(_mm512_loadu_ps(A + (col0 + q) * lda + row0));
          store_transposed_words(reinterpret_cast<std::uint16_t*>(tile), w);
        }
        continue;
      }
      for (std::int64_t r = 0; r < 16; ++r)
        for (std::int64_t kk = 0; kk < TK_FP32; ++kk) {
          const std::int64_t row = g * 16 + r, k = s * TK_FP32 + kk;
          tile[r * TK_FP32 + kk] =
              row < mc && k < kc ? (trans ? A[(k0 + k) * lda + i0 + row] : A[(i0 + row) * lda + k0 + k]) : 0.0f;
        }
    }
}

// op(B)[k0 .. k0+kc, j0 .. j0+nc] as tiles of 16 k x 16 columns: tile (h, s), row p holds
// op(B)'s row k0 + 16s + p at columns j0 + 16h ..; outside the block, zeros.
inline void pack_b_fp32(float* dst, const float* B, std::int64_t ldb, bool trans, std::int64_t k0, std::int64_t kc,
                        std::int64_t j0, std::int64_t nc) {
  const std::int64_t groups = (nc + 15) / 16, steps = (kc + TK_FP32 - 1) / TK_FP32;
  for (std::int64_t h = 0; h < groups; ++h)
    for (std::int64_t s = 0; s < steps; ++s) {
      float* tile = dst + (h * steps + s) * 16 * TK_FP32;
      const std::int64_t row0 = k0 + s * TK_FP32, col0 = j0 + h * 16;
      if (h * 16 + 16 <= nc && s * TK_FP32 + TK_FP32 <= kc) {
        if (!trans) {
          for (std::int64_t p = 0; p < TK_FP32; ++p)
            std::memcpy(tile + p * 16, B + (row0 + p) * ldb + col0, 16 * sizeof(float));
        } else {  // B stored column-major for op(B): each column's 16 k are contiguous
          __m512i w[16];
          for (int c = 0; c < 16; ++c) w[c] = _mm512_castps_si512(_mm512_loadu_ps(B + (col0 + c) * ldb + row0));
          store_transposed_words(reinterpret_cast<std::uint16_t*>(tile), w);
        }
        continue;
      }
      for (std::int64_t p = 0; p < TK_FP32; ++p)
        for (std::int64_t c = 0; c < 16; ++c) {
          const std::int64_t k = s * TK_FP32 + p, col = h * 16 + c;
          tile[p * 16 + c] =
              k < kc && col < nc ? (trans ? B[(j0 + col) * ldb + k0 + k] : B[(k0 + k) * ldb + j0 + col]) : 0.0f;
        }
    }
}

// rows (8 x 32 floats) (+)= 8 rows of A tiles · B columns of groups b0, b1 over `steps` k tiles,
// one fused multiply-add per k, row and 16 columns: eight_rows_avx512's loop in fp32.
inline void eight_rows_fp32(std::int64_t steps, const float* a, const float* b0, const float* b1, float* rows,
                            bool accumulate) {
  __m512 acc[8][2];
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) {
    acc[r][0] = accumulate ? _mm512_load_ps(rows + r * 32) : _mm512_setzero_ps();
    acc[r][1] = accumulate ? _mm512_load_ps(rows + r * 32 + 16) : _mm512_setzero_ps();
  }
  for (std::int64_t s = 0; s < steps; ++s) {
    const std::int64_t at_step = s * 16 * TK_FP32;
    for (std::int64_t p = 0; p < TK_FP32; ++p) {
      const __m512 left = _mm512_loadu_ps(b0 + at_step + p * 16), right = _mm512_loadu_ps(b1 + at_step + p * 16);
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        float value;  // the packs are 16-bit storage: read it through memcpy, as the bf16 kernel does
        std::memcpy(&value, a + at_step + r * TK_FP32 + p, sizeof value);
        const __m512 x = _mm512_set1_ps(value);
        acc[r][0] = _mm512_fmadd_ps(x, left, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(x, right, acc[r][1]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) {
    _mm512_store_ps(rows + r * 32, acc[r][0]);
    _mm512_store_ps(rows + r * 32 + 16, acc[r][1]);
  }
}

inline void micro_kernel_fp32(std::int64_t steps, const std::uint16_t* a0, const std::uint16_t* a1,
                              const std::uint16_t* b0, const std::uint16_t* b1, float* block, bool accumulate) {
  const auto f = [](const std::uint16_t* p) { return reinterpret_cast<const float*>(p); };
  eight_rows_fp32(steps, f(a0), f(b0), f(b1), block, accumulate);
  eight_rows_fp32(steps, f(a0) + 8 * TK_FP32, f(b0), f(b1), block + 8 * 32, accumulate);
  eight_rows_fp32(steps, f(a1), f(b0), f(b1), block + 16 * 32, accumulate);
  eight_rows_fp32(steps, f(a1) + 8 * TK_FP32, f(b0), f(b1), block + 24 * 32, accumulate);
}
#endif

// One thread's packs and C block (the tile configuration is per thread state too).
struct thread_state {
  std::vector<std::uint16_t>& a_pack;
  std::vector<std::uint16_t>& b_pack;
  float* block;
  unit on;
};

// k per tile and per K block of each element type: a tile row is 64 bytes either way.
template <class E>
inline constexpr std::int64_t tile_k = std::is_same_v<E, bf16> ? TK : TK / 2;
template <class E>
inline constexpr std::int64_t block_k = std::is_same_v<E, bf16> ? KC : KC / 2;
inline constexpr std::int64_t tile_units = 16 * TK;  // one tile, in the packs' 16-bit units

// The packed op(A) block (i0, k0) and op(B) block (k0, j0), each odd group count padded by a
// zero group (the micro-kernel reads groups in pairs).
template <class E>
void pack_a_block(thread_state& s, const E* A, std::int64_t lda, bool trans_a, std::int64_t i0, std::int64_t mc,
                  std::int64_t k0, std::int64_t kc) {
  const std::int64_t steps = (kc + tile_k<E> - 1) / tile_k<E>, groups = (mc + 15) / 16;
  if constexpr (std::is_same_v<E, bf16>) pack_a(s.a_pack.data(), A, lda, trans_a, i0, mc, k0, kc);
#if STRATA_HOST_FP32_AVX512
  else pack_a_fp32(reinterpret_cast<float*>(s.a_pack.data()), A, lda, trans_a, i0, mc, k0, kc);
#endif
  if (groups % 2) std::fill_n(s.a_pack.data() + groups * steps * tile_units, steps * tile_units, std::uint16_t(0));
}
template <class E>
void pack_b_block(thread_state& s, const E* B, std::int64_t ldb, bool trans_b, std::int64_t k0, std::int64_t kc,
                  std::int64_t j0, std::int64_t nc) {
  const std::int64_t steps = (kc + tile_k<E> - 1) / tile_k<E>, groups = (nc + 15) / 16;
  if constexpr (std::is_same_v<E, bf16>) pack_b(s.b_pack.data(), B, ldb, trans_b, k0, kc, j0, nc);
#if STRATA_HOST_FP32_AVX512
  else pack_b_fp32(reinterpret_cast<float*>(s.b_pack.data()), B, ldb, trans_b, k0, kc, j0, nc);
#endif
  if (groups % 2) std::fill_n(s.b_pack.data() + groups * steps * tile_units, steps * tile_units, std::uint16_t(0));
}

// C block (i0, j0) (+)= the packed blocks: the micro-kernel over 32 x 32 pieces, starting from
// C's values unless k0 is the first.
template <class E>
void multiply_packed(thread_state& s, std::int64_t i0, std::int64_t mc, std::int64_t k0, std::int64_t kc,
                     std::int64_t j0, std::int64_t nc, float* c32, std::int64_t N) {
  const std::int64_t steps = (kc + tile_k<E> - 1) / tile_k<E>, group = steps * tile_units;
  const bool first = k0 == 0;
  for (std::int64_t jr = 0; jr < nc; jr += 32)
    for (std::int64_t ir = 0; ir < mc; ir += 32) {
      const std::int64_t rows = std::min<std::int64_t>(32, mc - ir), cols = std::min<std::int64_t>(32, nc - jr);
      if (!first)
        for (std::int64_t r = 0; r < rows; ++r)
          std::memcpy(s.block + r * 32, c32 + (i0 + ir + r) * N + j0 + jr, std::size_t(cols) * sizeof(float));
      const std::uint16_t* a = s.a_pack.data() + (ir / 16) * group;
      const std::uint16_t* b = s.b_pack.data() + (jr / 16) * group;
      if constexpr (std::is_same_v<E, bf16>) {
#if STRATA_HOST_BF16_AMX
        if (s.on == unit::amx) micro_kernel_amx(steps, a, a + group, b, b + group, s.block, !first);
#endif
#if STRATA_HOST_BF16_AVX512
        if (s.on == unit::avx512_bf16) micro_kernel_avx512(steps, a, a + group, b, b + group, s.block, !first);
#endif
      }
#if STRATA_HOST_FP32_AVX512
      else
        micro_kernel_fp32(steps, a, a + group, b, b + group, s.block, !first);
#endif
      for (std::int64_t r = 0; r < rows; ++r)
        std::memcpy(c32 + (i0 + ir + r) * N + j0 + jr, s.block + r * 32, std::size_t(cols) * sizeof(float));
    }
}

// c32[M, N] (leading dimension N) = op(A) · op(B). Call only where the kernel for E is compiled in
// and runs: available() for bf16, fp32_available() for float.
//
// On AMX, packing, not the tile unit, bounds this kernel: one tdpbf16ps does 8192 multiply-adds,
// while every packed element is a load and a store. So a thread packs one operand's block once and
// multiplies it by every block of the other operand in its share: op(B)'s when M has the more
// blocks (the threads split M), op(A)'s otherwise (they split N). A thread owns the same share
// for every (strip, k block): OpenMP gives a static schedule's iterations to the same threads in
// every loop of equal length in one parallel region, so each C element is still summed over k
// blocks in order by one thread. With fewer blocks than threads either way, the threads share
// the (M x N) blocks and pack both per block. The result does not depend on the thread count.
template <class E>
void product(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, const E* A, std::int64_t lda,
             const E* B, std::int64_t ldb, float* c32) {
  static_assert(std::is_same_v<E, bf16> || std::is_same_v<E, float>, "gemm_bf16::product: bf16 or float");
  constexpr std::int64_t KB = block_k<E>;
  if (K == 0) {
    std::fill(c32, c32 + M * N, 0.0f);
    return;
  }
  const std::int64_t blocks_m = (M + MC - 1) / MC, blocks_n = (N + NC - 1) / NC, tasks = blocks_m * blocks_n;
  const int threads = openmp::max_threads();
  const unit on = std::is_same_v<E, bf16> ? in_use() : unit::none;
  enum class share { rows, columns, blocks };
  const share split = blocks_m >= blocks_n && blocks_m >= threads  ? share::rows
                      : blocks_n > blocks_m && blocks_n >= threads ? share::columns
                                                                   : share::blocks;
#pragma omp parallel num_threads(threads) if (tasks > 1 && M * N * K > 262144)
  {
    // Per thread: the tile configuration (AMX), one block of each pack (an odd group count is
    // padded by one zero group; kept between calls, as OpenMP keeps its threads), and one
    // 32 x 32 block of C.
#if STRATA_HOST_BF16_AMX
    const tile_config config;
    if (on == unit::amx) _tile_loadconfig(&config);
#endif
    thread_local std::vector<std::uint16_t> a_pack, b_pack;
    a_pack.resize(std::max(a_pack.size(), std::size_t((MC + 16) * KC)));
    b_pack.resize(std::max(b_pack.size(), std::size_t((NC + 16) * KC)));
    alignas(64) float block[32 * 32];
    thread_state s{a_pack, b_pack, block, on};
    if (split == share::rows) {
      for (std::int64_t j0 = 0; j0 < N; j0 += NC)
        for (std::int64_t k0 = 0; k0 < K; k0 += KB) {
          const std::int64_t nc = std::min(NC, N - j0), kc = std::min(KB, K - k0);
          bool packed = false;  // a thread with no block here packs nothing
#pragma omp for schedule(static) nowait
          for (std::int64_t bm = 0; bm < blocks_m; ++bm) {
            if (!packed) pack_b_block(s, B, ldb, trans_b, k0, kc, j0, nc), packed = true;
            const std::int64_t i0 = bm * MC, mc = std::min(MC, M - i0);
            pack_a_block(s, A, lda, trans_a, i0, mc, k0, kc);
            multiply_packed<E>(s, i0, mc, k0, kc, j0, nc, c32, N);
          }
        }
    } else if (split == share::columns) {
      for (std::int64_t i0 = 0; i0 < M; i0 += MC)
        for (std::int64_t k0 = 0; k0 < K; k0 += KB) {
          const std::int64_t mc = std::min(MC, M - i0), kc = std::min(KB, K - k0);
          bool packed = false;
#pragma omp for schedule(static) nowait
          for (std::int64_t bn = 0; bn < blocks_n; ++bn) {
            if (!packed) pack_a_block(s, A, lda, trans_a, i0, mc, k0, kc), packed = true;
            const std::int64_t j0 = bn * NC, nc = std::min(NC, N - j0);
            pack_b_block(s, B, ldb, trans_b, k0, kc, j0, nc);
            multiply_packed<E>(s, i0, mc, k0, kc, j0, nc, c32, N);
          }
        }
    } else {
#pragma omp for schedule(static)
      for (std::int64_t task = 0; task < tasks; ++task) {
        const std::int64_t i0 = (task % blocks_m) * MC, j0 = (task / blocks_m) * NC;
        const std::int64_t mc = std::min(MC, M - i0), nc = std::min(NC, N - j0);
        for (std::int64_t k0 = 0; k0 < K; k0 += KB) {
          const std::int64_t kc = std::min(KB, K - k0);
          pack_a_block(s, A, lda, trans_a, i0, mc, k0, kc);
          pack_b_block(s, B, ldb, trans_b, k0, kc, j0, nc);
          multiply_packed<E>(s, i0, mc, k0, kc, j0, nc, c32, N);
        }
      }
    }
#if STRATA_HOST_BF16_AMX
    if (on == unit::amx) _tile_release();
#endif
  }
}

#if STRATA_HOST_FP32_AVX512
// Whether this CPU runs the fp32 kernel (the build targets AVX-512; the check guards a binary
// moved to an older CPU).
inline bool fp32_available() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }();
  return has;
}
#endif

}  // namespace strata::kernels::gemm_bf16

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // STRATA_HOST_BF16_GEMM || STRATA_HOST_FP32_AVX512

namespace strata::kernels::gemm_bf16 {
#if !(STRATA_HOST_BF16_GEMM || STRATA_HOST_FP32_AVX512)
// A build for a CPU without either unit: bf16 always goes through fp32 copies.
inline unit in_use() { return unit::none; }
inline bool available() { return false; }
#endif

// The bf16 GEMM's path in this process, for logs and benchmarks.
inline std::string describe() {
#if STRATA_HOST_BF16_GEMM
  if (in_use() == unit::amx) return "AMX tiles (tdpbf16ps)";
  if (in_use() == unit::avx512_bf16) return "AVX-512 BF16 (vdpbf16ps)";
#endif
  return "fp32 copies through the fp32 GEMM";
}
}  // namespace strata::kernels::gemm_bf16
