// strata/kernels/cuda/attention_fragments.cuh - causal attention's register-fragment kernels:
// FlashAttention-2's structure on mma.sync (m16n8k16, bf16/fp16 operands, fp32 accumulators),
// for head sizes 64 and 128. attention.cuh's attention_forward and attention_backward run them
// for those shapes and its tiled WMMA kernels for the rest; both compute the same function with
// the same roundings (P and dS rounded to the storage type as operands, everything else fp32).
//
// Each warp owns 16 rows of a tile and keeps their accumulators (O; dK and dV; dQ) and its
// operand fragments in registers for the whole kernel, so a tile product never goes through
// shared memory, and a product's accumulator becomes the next product's operand in registers
// (S -> P -> P V). Shared memory holds the tiles every warp reads (K, V, Q, dO), row-major where
// the fragment pairs run along a row and transposed (written once per tile) where they run down
// a column, both padded so a warp's 32-bit fragment loads hit 32 different banks.
//
//   forward   grid (query tiles of 64, B*heads), the longest rows first; key tiles of 64
//   dK, dV    grid (key tiles of 64, B*kv_heads), summing the group's query heads and the query
//             tiles (64 for head size 64, 32 for 128) from the diagonal down
//   dQ        grid (query tiles of 64, B*heads), key tiles of 32 up to the diagonal
//
// Every output element is owned by one thread and summed in a fixed order: bit-identical from
// run to run, as the tiled kernels are. The geometry (attention_dims) is shared with them.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "strata/core/dtype.hpp"
#include "strata/kernels/cuda/common.cuh"

namespace strata::kernels {

// Which kernels attention_forward and attention_backward run where both apply (bf16 or fp16,
// head size 64 or 128, 16-byte aligned rows): the register-fragment ones unless told otherwise.
// The GPU tests and benchmarks set `tiled` to compare the two side by side.
enum class attention_kernels { automatic, tiled };
inline std::atomic<attention_kernels>& attention_kernel_choice() {
  static std::atomic<attention_kernels> choice{attention_kernels::automatic};
  return choice;
}

namespace cuda_detail {

// The attention geometry as the kernels use it (int where the launcher checked it fits).
struct attention_dims {
  int T;                 // sequence length
  int heads;             // query heads
  int kv_heads;          // key/value heads
  int group;             // heads / kv_heads: query heads per key/value head
  int hd;                // head size
  std::int64_t row;      // row_width(): elements per token of qkv and dqkv
  std::int64_t q_width;  // heads * hd: elements per token of out and dout; the key heads' offset in a qkv row
  std::int64_t v_off;    // q_width + kv_width: the value heads' offset in a qkv row
  float scale;           // the softmax scale
};

namespace fragments {

constexpr float log2e = 1.4426950408889634f;
constexpr float ln2 = 0.6931471805599453f;

// D (16x8, fp32) += A (16x16, row) . B (16x8, col). Thread (g = lane / 4, c = 2 (lane % 4)) holds
// A as a[0] = A[g][c, c+1], a[1] = A[g+8][c, c+1], a[2] = A[g][c+8, c+9], a[3] = A[g+8][c+8, c+9];
// B as b0 = B[c, c+1][g], b1 = B[c+8, c+9][g]; D as d[0..1] = D[g][c, c+1], d[2..3] = D[g+8][c, c+1].
// (sm_80 and later; the launcher checks the device, and older targets compile a trap.)
template <class T>
__device__ __forceinline__ void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  (void)d, (void)a, (void)b0, (void)b1;
  __trap();
#else
  if constexpr (std::is_same_v<T, bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, fp16>, "attention fragments: bf16 or fp16 operands");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#endif
}

// Two values rounded to T in one 32-bit register, the first in the low half (the lower column).
template <class T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, bf16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
}

__device__ __forceinline__ std::uint32_t load32(const std::uint16_t* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}

// The A fragment of rows r0 .. r0+15, columns k0 .. k0+15 of a row-major shared tile.
__device__ __forceinline__ void load_a(std::uint32_t (&a)[4], const std::uint16_t* tile, int ld, int r0, int k0, int g,
                                       int c) {
  a[0] = load32(tile + (r0 + g) * ld + k0 + c);
  a[1] = load32(tile + (r0 + g + 8) * ld + k0 + c);
  a[2] = load32(tile + (r0 + g) * ld + k0 + c + 8);
  a[3] = load32(tile + (r0 + g + 8) * ld + k0 + c + 8);
}

// Accumulators of two adjacent 8-column blocks (columns 16 t .. 16 t + 15) as an A fragment.
template <class T>
__device__ __forceinline__ void accumulators_as_a(std::uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack2<T>(lo[0], lo[1]);
  a[1] = pack2<T>(lo[2], lo[3]);
  a[2] = pack2<T>(hi[0], hi[1]);
  a[3] = pack2<T>(hi[2], hi[3]);
}

// dst[r][0 .. HD) = src[(row0 + r) * stride + 0 .. HD) for rows r < R (zeros past T), 16 bytes a copy.
template <int R, int HD>
__device__ __forceinline__ void load_rows(std::uint16_t* dst, int ld, const std::uint16_t* src, std::int64_t stride,
                                          int row0, int T_) {
  constexpr int per_row = HD / 8;
  for (int idx = int(threadIdx.x); idx < R * per_row; idx += int(blockDim.x)) {
    const int r = idx / per_row, q = idx % per_row;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < T_) v = *reinterpret_cast<const uint4*>(src + std::int64_t(row0 + r) * stride + q * 8);
    *reinterpret_cast<uint4*>(dst + r * ld + q * 8) = v;
  }
}

// The same rows transposed: dst[d][r] = src[(row0 + r) * stride + d].
template <int R, int HD>
__device__ __forceinline__ void load_rows_transposed(std::uint16_t* dst, int ld, const std::uint16_t* src,
                                                     std::int64_t stride, int row0, int T_) {
  constexpr int per_row = HD / 8;
  for (int idx = int(threadIdx.x); idx < R * per_row; idx += int(blockDim.x)) {
    const int r = idx / per_row, q = idx % per_row;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < T_) v = *reinterpret_cast<const uint4*>(src + std::int64_t(row0 + r) * stride + q * 8);
    const std::uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dst[(q * 8 + 2 * e) * ld + r] = std::uint16_t(words[e] & 0xffffu);
      dst[(q * 8 + 2 * e + 1) * ld + r] = std::uint16_t(words[e] >> 16);
    }
  }
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Tile sizes and shared memory of each kernel (bytes), for the launcher.
template <int HD>
struct plan {
  static_assert(HD == 64 || HD == 128, "attention fragments: head size 64 or 128");
  static constexpr int threads = 128;  // 4 warps of 16 rows
  // forward: K [64][HD + 8] (first Q's staging), V transposed [HD][64 + 8]
  static constexpr int fwd_rows = 64, fwd_keys = 64;
  static constexpr std::size_t smem_forward = 2u * (fwd_keys * (HD + 8) + HD * (fwd_keys + 8));
  // dK, dV: K, V [64][HD + 8]; Q, dO [BQ][HD + 8]; Q, dO transposed [HD][BQ + 8]; lse, D [BQ]
  static constexpr int kv_keys = 64, kv_queries = HD == 128 ? 32 : 64;
  static constexpr std::size_t smem_backward_kv =
      2u * (2 * kv_keys * (HD + 8) + 2 * kv_queries * (HD + 8) + 2 * HD * (kv_queries + 8)) + 2u * 4u * kv_queries;
  // dQ: K, V [32][HD + 8] (together Q's and dO's staging), K transposed [HD][32 + 8]
  static constexpr int q_rows = 64, q_keys = 32;
  static constexpr std::size_t smem_backward_q = 2u * (2 * q_keys * (HD + 8) + HD * (q_keys + 8));
  static_assert(2 * q_keys >= q_rows, "the dQ kernel stages Q and dO through its K and V tiles");
};

// The A fragments of a warp's 16 rows (from r0) over the whole head size, k-slice by k-slice.
template <int KS>
__device__ __forceinline__ void load_a_fragments(std::uint32_t (&f)[KS][4], const std::uint16_t* tile, int ld, int r0,
                                                 int g, int c) {
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) load_a(f[kk], tile, ld, r0, kk * 16, g, c);
}

// acc (16 x 8 DT) += A . B, A the accumulators p (16 x 8 NB) rounded to T as operands and B held
// transposed in shared memory (bt [8 DT][ld]): each kernel's second product (P V, P^T dO,
// dS^T Q, dS K), its first product's result never leaving registers.
template <class T, int DT, int NB>
__device__ __forceinline__ void mma_accumulators(float (&acc)[DT][4], const float (&p)[NB][4], const std::uint16_t* bt,
                                                 int ld, int g, int c) {
#pragma unroll
  for (int t = 0; t < NB / 2; ++t) {
    std::uint32_t pa[4];
    accumulators_as_a<T>(pa, p[2 * t], p[2 * t + 1]);
#pragma unroll
    for (int d = 0; d < DT; ++d) {
      const std::uint16_t* col = bt + (d * 8 + g) * ld + t * 16 + c;
      mma<T>(acc[d], pa, load32(col), load32(col + 8));
    }
  }
}

// acc (16 x 8 NB) = A . B^T with both operands row-major in shared memory: the warp's 16 rows of
// sa (from r0) against the NB * 8 rows of sb, over the head size (KS slices of 16).
template <class T, int KS, int NB>
__device__ __forceinline__ void mma_shared_rows(float (&acc)[NB][4], const std::uint16_t* sa, const std::uint16_t* sb,
                                                int ld, int r0, int g, int c) {
#pragma unroll
  for (int n = 0; n < NB; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    std::uint32_t fa[4];
    load_a(fa, sa, ld, r0, kk * 16, g, c);
#pragma unroll
    for (int n = 0; n < NB; ++n) {
      const std::uint16_t* brow = sb + (n * 8 + g) * ld + kk * 16 + c;
      mma<T>(acc[n], fa, load32(brow), load32(brow + 8));
    }
  }
}

// --- Forward ---

// S = Q K^T of one key tile: the warp's Q fragments against the NB * 8 keys of sK.
template <class T, int KS, int NB>
__device__ __forceinline__ void forward_scores(float (&s)[NB][4], const std::uint32_t (&qf)[KS][4],
                                               const std::uint16_t* sK, int ld, int g, int c) {
#pragma unroll
  for (int j = 0; j < NB; ++j) {
    s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      const std::uint16_t* krow = sK + (j * 8 + g) * ld + kk * 16 + c;
      mma<T>(s[j], qf[kk], load32(krow), load32(krow + 8));
    }
  }
}

// The scores of one key tile (k0 on) of rows i0 and i1 masked and scaled to log2 units; mx: the
// largest of each row among this thread's columns.
template <int NB>
__device__ __forceinline__ void mask_scores(float (&s)[NB][4], float (&mx)[2], int i0, int i1, int k0, int T_,
                                            float sl2, int c) {
#pragma unroll
  for (int j = 0; j < NB; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = e < 2 ? i0 : i1, key = k0 + j * 8 + c + (e & 1);
      const float v = key <= row && key < T_ ? s[j][e] * sl2 : -INFINITY;
      s[j][e] = v;
      mx[e / 2] = fmaxf(mx[e / 2], v);
    }
}

// The masked scores replaced by P = 2^(s - use), each row's sum added to l.
template <int NB>
__device__ __forceinline__ void exponentiate_scores(float (&s)[NB][4], float (&l)[2], const float (&use)[2]) {
#pragma unroll
  for (int j = 0; j < NB; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = exp2f(s[j][e] - use[e / 2]);
      s[j][e] = p;
      l[e / 2] += p;
    }
}

// The output accumulated so far, each row scaled by its alpha (the running max grew).
template <int DT>
__device__ __forceinline__ void rescale_accumulators(float (&o)[DT][4], const float (&alpha)[2]) {
#pragma unroll
  for (int d = 0; d < DT; ++d) {
    o[d][0] *= alpha[0];
    o[d][1] *= alpha[0];
    o[d][2] *= alpha[1];
    o[d][3] *= alpha[1];
  }
}

// out = O / l and lse = m ln 2 + log l for this thread's rows i0 and i1 of query head h.
template <class T, int HD>
__device__ __forceinline__ void store_forward_rows(T* out, float* lse, const float (&o)[HD / 8][4], const float (&m)[2],
                                                   const float (&l)[2], attention_dims a, int T_, int b, int h, int bh,
                                                   int i0, int i1, int lane, int c) {
  const float sum[2] = {quad_sum(l[0]), quad_sum(l[1])};
  auto* outw = reinterpret_cast<std::uint32_t*>(out);
#pragma unroll
  for (int d = 0; d < HD / 8; ++d) {
    const std::int64_t col = std::int64_t(h) * HD + d * 8 + c;
    if (i0 < T_)
      outw[((std::int64_t(b) * T_ + i0) * a.q_width + col) / 2] = pack2<T>(o[d][0] / sum[0], o[d][1] / sum[0]);
    if (i1 < T_)
      outw[((std::int64_t(b) * T_ + i1) * a.q_width + col) / 2] = pack2<T>(o[d][2] / sum[1], o[d][3] / sum[1]);
  }
  if (lane % 4 == 0) {
    if (i0 < T_) lse[std::int64_t(bh) * T_ + i0] = m[0] * ln2 + logf(sum[0]);
    if (i1 < T_) lse[std::int64_t(bh) * T_ + i1] = m[1] * ln2 + logf(sum[1]);
  }
}

// --- dK, dV ---

// A query tile (q0 on) of one query head into shared memory: Q and dO row-major and transposed,
// its lse in log2 units and D (zeros past T). rows: the head's first row of lse and D.
template <int BQ, int HD>
__device__ __forceinline__ void stage_query_tile(std::uint16_t* sQ, std::uint16_t* sdO, std::uint16_t* sQt,
                                                 std::uint16_t* sdOt, float* sLse, float* sD,
                                                 const std::uint16_t* qbase, const std::uint16_t* dbase,
                                                 const float* lse, const float* D, std::int64_t rows, int q0,
                                                 attention_dims a) {
  constexpr int LDR = HD + 8, LDT = BQ + 8;
  const int T_ = a.T;
  load_rows<BQ, HD>(sQ, LDR, qbase, a.row, q0, T_);
  load_rows_transposed<BQ, HD>(sQt, LDT, qbase, a.row, q0, T_);
  load_rows<BQ, HD>(sdO, LDR, dbase, a.q_width, q0, T_);
  load_rows_transposed<BQ, HD>(sdOt, LDT, dbase, a.q_width, q0, T_);
  for (int r = int(threadIdx.x); r < BQ; r += int(blockDim.x)) {
    const bool ok = q0 + r < T_;
    sLse[r] = ok ? lse[rows + q0 + r] * log2e : 0.0f;
    sD[r] = ok ? D[rows + q0 + r] : 0.0f;
  }
}

// S^T (keys j0 and j1 by the tile's queries, q0 on) replaced by P^T, 0 where a key is not seen.
template <int QT>
__device__ __forceinline__ void probabilities_transposed(float (&st)[QT][4], const float* sLse, int q0, int j0, int j1,
                                                         int T_, float sl2, int c) {
#pragma unroll
  for (int n = 0; n < QT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = n * 8 + c + (e & 1), query = q0 + col, key = e < 2 ? j0 : j1;
      st[n][e] = key <= query && query < T_ ? exp2f(st[n][e] * sl2 - sLse[col]) : 0.0f;
    }
}

// dP^T replaced by dS^T = P^T (dP^T - D) scale.
template <int QT>
__device__ __forceinline__ void score_gradients_transposed(float (&dpt)[QT][4], const float (&st)[QT][4],
                                                           const float* sD, float scale, int c) {
#pragma unroll
  for (int n = 0; n < QT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = n * 8 + c + (e & 1);
      dpt[n][e] = st[n][e] * (dpt[n][e] - sD[col]) * scale;
    }
}

// dK and dV of this thread's keys j0 and j1 of key/value head kvh into dqkv.
template <class T, int HD>
__device__ __forceinline__ void store_key_gradients(T* dqkv, const float (&dk)[HD / 8][4], const float (&dv)[HD / 8][4],
                                                    attention_dims a, int T_, int b, int kvh, int j0, int j1, int c) {
  auto* dw = reinterpret_cast<std::uint32_t*>(dqkv);
  const std::int64_t base = std::int64_t(b) * T_ * a.row + std::int64_t(kvh) * HD + c;
#pragma unroll
  for (int d = 0; d < HD / 8; ++d) {
    if (j0 < T_) {
      dw[(base + std::int64_t(j0) * a.row + a.q_width + d * 8) / 2] = pack2<T>(dk[d][0], dk[d][1]);
      dw[(base + std::int64_t(j0) * a.row + a.v_off + d * 8) / 2] = pack2<T>(dv[d][0], dv[d][1]);
    }
    if (j1 < T_) {
      dw[(base + std::int64_t(j1) * a.row + a.q_width + d * 8) / 2] = pack2<T>(dk[d][2], dk[d][3]);
      dw[(base + std::int64_t(j1) * a.row + a.v_off + d * 8) / 2] = pack2<T>(dv[d][2], dv[d][3]);
    }
  }
}

// --- dQ ---

// S = Q K^T and dP = dO V^T of one key tile, the two products interleaved over the head size.
template <class T, int KS, int KT>
__device__ __forceinline__ void scores_and_output_gradients(float (&s)[KT][4], float (&dp)[KT][4],
                                                            const std::uint32_t (&qf)[KS][4],
                                                            const std::uint32_t (&of)[KS][4], const std::uint16_t* sK,
                                                            const std::uint16_t* sV, int ld, int g, int c) {
#pragma unroll
  for (int n = 0; n < KT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
#pragma unroll
    for (int n = 0; n < KT; ++n) {
      const std::uint16_t* krow = sK + (n * 8 + g) * ld + kk * 16 + c;
      mma<T>(s[n], qf[kk], load32(krow), load32(krow + 8));  // S = Q K^T
      const std::uint16_t* vrow = sV + (n * 8 + g) * ld + kk * 16 + c;
      mma<T>(dp[n], of[kk], load32(vrow), load32(vrow + 8));  // dP = dO V^T
    }
}

// The per-row values the dQ kernel's rows i0 and i1 recompute P and dS from (0 past T).
struct query_row_stats {
  float lse0, lse1;  // log2 units
  float D0, D1;
};

// S replaced by dS = P (dP - D) scale, 0 where a row does not see the key (k0 on).
template <int KT>
__device__ __forceinline__ void score_gradients(float (&s)[KT][4], const float (&dp)[KT][4], query_row_stats r, int i0,
                                                int i1, int k0, int T_, float sl2, float scale, int c) {
#pragma unroll
  for (int n = 0; n < KT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = e < 2 ? i0 : i1, key = k0 + n * 8 + c + (e & 1);
      float ds = 0.0f;
      if (key <= row && row < T_) {
        const float p = exp2f(s[n][e] * sl2 - (e < 2 ? r.lse0 : r.lse1));
        ds = p * (dp[n][e] - (e < 2 ? r.D0 : r.D1)) * scale;
      }
      s[n][e] = ds;
    }
}

// dQ of this thread's rows i0 and i1 of query head h into dqkv.
template <class T, int HD>
__device__ __forceinline__ void store_query_gradients(T* dqkv, const float (&dq)[HD / 8][4], attention_dims a, int T_,
                                                      int b, int h, int i0, int i1, int c) {
  auto* dw = reinterpret_cast<std::uint32_t*>(dqkv);
  const std::int64_t base = std::int64_t(b) * T_ * a.row + std::int64_t(h) * HD + c;
#pragma unroll
  for (int d = 0; d < HD / 8; ++d) {
    if (i0 < T_) dw[(base + std::int64_t(i0) * a.row + d * 8) / 2] = pack2<T>(dq[d][0], dq[d][1]);
    if (i1 < T_) dw[(base + std::int64_t(i1) * a.row + d * 8) / 2] = pack2<T>(dq[d][2], dq[d][3]);
  }
}

}  // namespace fragments

// out [B, T, heads*hd], lse [B, heads, T] (natural log), qkv [B, T, row]: attention.cuh's forward.
template <class T, int HD>
__global__ void __launch_bounds__(128) attention_forward_fragments(T* out, float* lse, const T* qkv, attention_dims a) {
  using namespace fragments;
  using P = fragments::plan<HD>;
  constexpr int BR = P::fwd_rows, BC = P::fwd_keys, LDK = HD + 8, LDV = BC + 8, DT = HD / 8, KS = HD / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  std::uint16_t* sK = reinterpret_cast<std::uint16_t*>(smem);  // [BC][LDK]
  std::uint16_t* sVt = sK + BC * LDK;                          // [HD][LDV]
  const int T_ = a.T;
  const int bh = int(blockIdx.y), b = bh / a.heads, h = bh % a.heads, kvh = h / a.group;
  const int q0 = int(gridDim.x - 1 - blockIdx.x) * BR;  // the longest rows first
  const auto* batch = reinterpret_cast<const std::uint16_t*>(qkv) + std::int64_t(b) * T_ * a.row;
  const auto* qbase = batch + std::int64_t(h) * HD;
  const auto* kbase = batch + a.q_width + std::int64_t(kvh) * HD;
  const auto* vbase = batch + a.v_off + std::int64_t(kvh) * HD;
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32), g = lane / 4, c = (lane % 4) * 2;
  const int r0 = warp * 16;
  const int i0 = q0 + r0 + g, i1 = i0 + 8;  // this thread's two query rows

  load_rows<BR, HD>(sK, LDK, qbase, a.row, q0, T_);  // Q, staged through K's tile (BR == BC)
  __syncthreads();
  std::uint32_t qf[KS][4];
  load_a_fragments(qf, sK, LDK, r0, g, c);

  float o[DT][4];
#pragma unroll
  for (int d = 0; d < DT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // running max (log2 units) and partial sums
  const float sl2 = a.scale * log2e;
  const int q_last = min(q0 + BR, T_) - 1;
  const int kv_tiles = q_last / BC + 1;
  for (int kt = 0; kt < kv_tiles; ++kt) {
    const int k0 = kt * BC;
    __syncthreads();  // Q's staging, or the previous K and V, consumed
    load_rows<BC, HD>(sK, LDK, kbase, a.row, k0, T_);
    load_rows_transposed<BC, HD>(sVt, LDV, vbase, a.row, k0, T_);
    __syncthreads();
    float s[BC / 8][4];
    forward_scores<T>(s, qf, sK, LDK, g, c);
    float mx[2] = {-INFINITY, -INFINITY};
    mask_scores(s, mx, i0, i1, k0, T_, sl2, c);
    // Online softmax: a larger running max rescales the sums and the output accumulated so far.
    float use[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], quad_max(mx[r]));
      use[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row masked so far
      alpha[r] = exp2f(m[r] - use[r]);
      m[r] = m_new;
      l[r] *= alpha[r];
    }
    exponentiate_scores(s, l, use);
    rescale_accumulators(o, alpha);
    mma_accumulators<T>(o, s, sVt, LDV, g, c);  // O += P V, P from the score accumulators
  }
  store_forward_rows<T, HD>(out, lse, o, m, l, a, T_, b, h, bh, i0, i1, lane, c);
}

// dK and dV of one key tile of one key/value head, summed over the group's query heads; written
// into dqkv. lse: the forward's (natural log); D = rowsum(dO * O).
template <class T, int HD>
__global__ void __launch_bounds__(128)
    attention_backward_kv_fragments(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D,
                                    attention_dims a) {
  using namespace fragments;
  using P = fragments::plan<HD>;
  constexpr int BK = P::kv_keys, BQ = P::kv_queries, LDR = HD + 8, LDT = BQ + 8, DT = HD / 8, KS = HD / 16, QT = BQ / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  std::uint16_t* sK = reinterpret_cast<std::uint16_t*>(smem);  // [BK][LDR]
  std::uint16_t* sV = sK + BK * LDR;                           // [BK][LDR]
  std::uint16_t* sQ = sV + BK * LDR;                           // [BQ][LDR]
  std::uint16_t* sdO = sQ + BQ * LDR;                          // [BQ][LDR]
  std::uint16_t* sQt = sdO + BQ * LDR;                         // [HD][LDT]
  std::uint16_t* sdOt = sQt + HD * LDT;                        // [HD][LDT]
  float* sLse = reinterpret_cast<float*>(sdOt + HD * LDT);     // [BQ], log2 units
  float* sD = sLse + BQ;                                       // [BQ]
  const int T_ = a.T;
  const int bk = int(blockIdx.y), b = bk / a.kv_heads, kvh = bk % a.kv_heads;
  const int k0 = int(blockIdx.x) * BK;  // the first key tiles have the most queries: they start first
  const auto* batch = reinterpret_cast<const std::uint16_t*>(qkv) + std::int64_t(b) * T_ * a.row;
  const auto* douts = reinterpret_cast<const std::uint16_t*>(dout) + std::int64_t(b) * T_ * a.q_width;
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32), g = lane / 4, c = (lane % 4) * 2;
  const int kr = warp * 16;
  const int j0 = k0 + kr + g, j1 = j0 + 8;  // this thread's two keys

  load_rows<BK, HD>(sK, LDR, batch + a.q_width + std::int64_t(kvh) * HD, a.row, k0, T_);
  load_rows<BK, HD>(sV, LDR, batch + a.v_off + std::int64_t(kvh) * HD, a.row, k0, T_);
  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int d = 0; d < DT; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[d][e] = dv[d][e] = 0.0f;
  const float sl2 = a.scale * log2e;
  for (int gi = 0; gi < a.group; ++gi) {
    const int h = kvh * a.group + gi;  // the query head
    const auto* qbase = batch + std::int64_t(h) * HD;
    const auto* dbase = douts + std::int64_t(h) * HD;
    const std::int64_t rows = (std::int64_t(b) * a.heads + h) * T_;  // this head's rows of lse and D
    for (int q0 = (k0 / BQ) * BQ; q0 < T_; q0 += BQ) {
      __syncthreads();  // the previous query tile consumed
      stage_query_tile<BQ, HD>(sQ, sdO, sQt, sdOt, sLse, sD, qbase, dbase, lse, D, rows, q0, a);
      __syncthreads();
      float st[QT][4];  // S^T = K Q^T: this warp's 16 keys by the tile's queries
      mma_shared_rows<T, KS>(st, sK, sQ, LDR, kr, g, c);
      probabilities_transposed(st, sLse, q0, j0, j1, T_, sl2, c);
      mma_accumulators<T>(dv, st, sdOt, LDT, g, c);  // dV += P^T dO
      float dpt[QT][4];                              // dP^T = V dO^T
      mma_shared_rows<T, KS>(dpt, sV, sdO, LDR, kr, g, c);
      score_gradients_transposed(dpt, st, sD, a.scale, c);
      mma_accumulators<T>(dk, dpt, sQt, LDT, g, c);  // dK += dS^T Q
    }
  }
  store_key_gradients<T, HD>(dqkv, dk, dv, a, T_, b, kvh, j0, j1, c);
}

// dQ of one query tile of one query head; written into dqkv.
template <class T, int HD>
__global__ void __launch_bounds__(128)
    attention_backward_q_fragments(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D,
                                   attention_dims a) {
  using namespace fragments;
  using P = fragments::plan<HD>;
  constexpr int BR = P::q_rows, BK = P::q_keys, LDR = HD + 8, LDT = BK + 8, DT = HD / 8, KS = HD / 16, KT = BK / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  std::uint16_t* sK = reinterpret_cast<std::uint16_t*>(smem);  // [BK][LDR]; with sV, Q's and dO's staging
  std::uint16_t* sV = sK + BK * LDR;                           // [BK][LDR]
  std::uint16_t* sKt = sV + BK * LDR;                          // [HD][LDT]
  const int T_ = a.T;
  const int bh = int(blockIdx.y), b = bh / a.heads, h = bh % a.heads, kvh = h / a.group;
  const int q0 = int(gridDim.x - 1 - blockIdx.x) * BR;  // the longest rows first
  const auto* batch = reinterpret_cast<const std::uint16_t*>(qkv) + std::int64_t(b) * T_ * a.row;
  const auto* kbase = batch + a.q_width + std::int64_t(kvh) * HD;
  const auto* vbase = batch + a.v_off + std::int64_t(kvh) * HD;
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32), g = lane / 4, c = (lane % 4) * 2;
  const int r0 = warp * 16;
  const int i0 = q0 + r0 + g, i1 = i0 + 8;

  std::uint32_t qf[KS][4], of[KS][4];
  load_rows<BR, HD>(sK, LDR, batch + std::int64_t(h) * HD, a.row, q0, T_);
  __syncthreads();
  load_a_fragments(qf, sK, LDR, r0, g, c);
  __syncthreads();
  load_rows<BR, HD>(
      sK, LDR, reinterpret_cast<const std::uint16_t*>(dout) + std::int64_t(b) * T_ * a.q_width + std::int64_t(h) * HD,
      a.q_width, q0, T_);
  __syncthreads();
  load_a_fragments(of, sK, LDR, r0, g, c);
  const std::int64_t rows = std::int64_t(bh) * T_;
  const float lse0 = i0 < T_ ? lse[rows + i0] * log2e : 0.0f, lse1 = i1 < T_ ? lse[rows + i1] * log2e : 0.0f;
  const float D0 = i0 < T_ ? D[rows + i0] : 0.0f, D1 = i1 < T_ ? D[rows + i1] : 0.0f;
  const float sl2 = a.scale * log2e;
  float dq[DT][4];
#pragma unroll
  for (int d = 0; d < DT; ++d) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
  const int q_last = min(q0 + BR, T_) - 1;
  const int kv_tiles = q_last / BK + 1;
  for (int kt = 0; kt < kv_tiles; ++kt) {
    const int k0 = kt * BK;
    __syncthreads();  // the staging, or the previous K, V, K^T, consumed
    load_rows<BK, HD>(sK, LDR, kbase, a.row, k0, T_);
    load_rows<BK, HD>(sV, LDR, vbase, a.row, k0, T_);
    load_rows_transposed<BK, HD>(sKt, LDT, kbase, a.row, k0, T_);
    __syncthreads();
    float s[KT][4], dp[KT][4];
    scores_and_output_gradients<T>(s, dp, qf, of, sK, sV, LDR, g, c);
    score_gradients(s, dp, {lse0, lse1, D0, D1}, i0, i1, k0, T_, sl2, a.scale, c);
    mma_accumulators<T>(dq, s, sKt, LDT, g, c);  // dQ += dS K
  }
  store_query_gradients<T, HD>(dqkv, dq, a, T_, b, h, i0, i1, c);
}

}  // namespace cuda_detail

}  // namespace strata::kernels
