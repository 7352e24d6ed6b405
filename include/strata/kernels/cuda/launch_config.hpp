// strata/kernels/cuda/launch_config.hpp - the host-side arithmetic of the CUDA backend: grid and
// block sizes, the attention tiling and its shared memory, the GEMM workspace and the mapping of
// a row-major GEMM onto cuBLASLt's column-major one, and the precision rules.
//
// Plain C++20, no CUDA header: it compiles with g++ and is unit-tested on the CPU
// (tests/cuda/test_launch_config.cpp), so every decision the launchers make can be checked on a
// machine without a GPU. The launchers in kernels/cuda/*.cuh call these functions and nothing
// else to pick their configuration.
//
// Determinism: every split of a reduction (column chunks, sum-of-squares chunks) is a function
// of the problem size only, never of the device (SM count) or the grid, so a GPU result is the
// same on any GPU and from run to run.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "strata/core/config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/hd_math.hpp"

namespace strata::gpu {

// ---------------------------------------------------------------------------------------------
// Grid and block arithmetic

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Elements per 16-byte vector access ("pack") of a type: 8 bf16/fp16, 4 float, 2 double.
template <class T>
inline constexpr int pack_width = int(16 / sizeof(T)) > 0 ? int(16 / sizeof(T)) : 1;

// True when p is 16-byte aligned (or null): only then may a kernel use 16-byte vector accesses.
inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }
template <class... P>
inline bool all_aligned16(const P*... p) {
  return (aligned16(static_cast<const void*>(p)) && ...);
}

// The largest power of two up to 256 dividing the address (256 for null): the alignment
// cuBLASLt is told its operands have (it assumes 256 otherwise).
inline std::uint32_t pointer_alignment(const void* p) {
  const auto u = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && u % a != 0) a >>= 1;
  return a;
}

struct launch_dims {
  unsigned grid = 0;   // blocks (grid.x)
  unsigned block = 0;  // threads per block
};

// Largest grid.x strata launches; kernels whose work can exceed it loop grid-stride.
inline constexpr std::int64_t max_grid_x = 2147483647;  // 2^31 - 1

// One thread per pack of `width` elements, `block` threads per block: n elements -> grid.
// An empty range still gets one block (kernels check bounds), so a launch is never 0-sized.
inline launch_dims elementwise_launch(std::int64_t n, int width, int block = 256) {
  STRATA_CHECK(n >= 0 && width >= 1 && block >= 32 && block <= 1024 && block % 32 == 0,
               "gpu::elementwise_launch: bad arguments n = ", n, ", width = ", width, ", block = ", block);
  const std::int64_t threads = ceil_div(n, width);
  const std::int64_t blocks = std::clamp<std::int64_t>(ceil_div(threads, block), 1, max_grid_x);
  return {unsigned(blocks), unsigned(block)};
}

// One warp per row, `warps` rows per block.
inline launch_dims rows_launch(std::int64_t rows, int warps = 8) {
  STRATA_CHECK(rows >= 0 && warps >= 1 && warps <= 32, "gpu::rows_launch: bad arguments rows = ", rows,
               ", warps = ", warps);
  const std::int64_t blocks = std::clamp<std::int64_t>(ceil_div(rows, warps), 1, max_grid_x);
  return {unsigned(blocks), unsigned(32 * warps)};
}

// One block per row (kernels::row_reduce): about four columns per thread, 32 to 256 threads, a
// function of the row length only, so the row sums' order is the same on every GPU.
inline int row_reduce_block(std::int64_t cols) {
  STRATA_CHECK(cols > 0, "gpu::row_reduce_block: need cols > 0, got ", cols);
  return int(32 * std::clamp<std::int64_t>(ceil_div(cols, 32 * 4), 1, 8));
}

// ---------------------------------------------------------------------------------------------
// Deterministic column sums (LayerNorm's dweight/dbias, Linear's dbias): out[c] = sum_r f(r, c)
// over N rows. Rows are cut into `chunks` chunks of `rows_per_chunk` consecutive rows; one block
// sums a 32-column strip of one chunk in a fixed order (8 row lanes, then the lanes in order),
// writing a partial; a second kernel adds the partials of each column in chunk order. Nothing
// here depends on the device: the sums are bit-identical on every GPU.
struct column_plan {
  std::int64_t rows_per_chunk = 1;
  std::int64_t chunks = 0;      // grid.y of the partial kernel
  std::int64_t col_strips = 0;  // grid.x: strips of column_strip columns
  static constexpr int column_strip = 32;
  static constexpr int row_lanes = 8;  // block = column_strip x row_lanes threads
  std::int64_t partial_count() const { return chunks * col_strips * column_strip; }
};

inline column_plan plan_column_sums(std::int64_t N, std::int64_t C) {
  STRATA_CHECK(N >= 0 && C >= 0, "gpu::plan_column_sums: negative size N = ", N, ", C = ", C);
  column_plan p;
  // About 64 chunks (enough blocks to fill a GPU for C >= 768), but at least 32 rows each.
  p.rows_per_chunk = std::max<std::int64_t>(32, ceil_div(N, 64));
  p.chunks = N == 0 ? 0 : ceil_div(N, p.rows_per_chunk);
  p.col_strips = ceil_div(C, column_plan::column_strip);
  STRATA_CHECK(p.chunks <= 65535, "gpu::plan_column_sums: N = ", N, " needs ", p.chunks,
               " row chunks, more than grid.y allows");
  return p;
}

// ---------------------------------------------------------------------------------------------
// Sum of squares (global gradient norm): fixed chunks of reduce_chunk elements, one block each,
// partials in double, then one block adds the partials (each thread a strided sequential sum,
// then a CUB block reduction: a fixed tree). Depends on n only.
inline constexpr std::int64_t reduce_chunk = 8192;
inline constexpr int reduce_block = 256;
inline constexpr int reduce_final_block = 1024;
inline std::int64_t reduce_partials(std::int64_t n) { return ceil_div(n, reduce_chunk); }

// ---------------------------------------------------------------------------------------------
// Softmax cross-entropy: one block per row; rows are read with packs when every row start is
// 16-byte aligned (Vp a multiple of the pack width and an aligned base).
inline constexpr int cross_entropy_block = 512;
template <class T>
inline bool cross_entropy_vectorized(const void* logits, std::int64_t Vp) {
  return aligned16(logits) && Vp % pack_width<T> == 0;
}

// LayerNorm: one warp per row; packs when each row start is aligned (C a multiple of the pack).
template <class T>
inline bool rows_vectorized(std::int64_t C, std::initializer_list<const void*> ptrs) {
  if (C % pack_width<T> != 0) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Precision rules. Storage type -> what the GPU computes in.
//  - bf16 / fp16: tensor cores, fp32 accumulation and fp32 scale (alpha, beta), one rounding
//    into the 16-bit output (cuBLASLt CUBLAS_COMPUTE_32F with 16-bit A/B/C).
//  - fp32: true fp32 (CUBLAS_COMPUTE_32F, no TF32) so fp32 results match the CPU to ~1e-6;
//    TF32 only when a caller opts in (gpu::context::allow_tf32).
//  - fp64: CUBLAS_COMPUTE_64F (GEMM only; the other CUDA kernels take float, bf16, fp16).
enum class scalar_kind { f32, f64, bf16, f16 };
enum class compute_kind { f32, f32_fast_tf32, f64 };

template <class T>
constexpr scalar_kind scalar_kind_of() {
  if constexpr (std::is_same_v<T, float>) return scalar_kind::f32;
  else if constexpr (std::is_same_v<T, double>) return scalar_kind::f64;
  else if constexpr (std::is_same_v<T, bf16>) return scalar_kind::bf16;
  else {
    static_assert(std::is_same_v<T, fp16>, "strata::gpu: no CUDA storage type for T");
    return scalar_kind::f16;
  }
}

struct gemm_types {
  scalar_kind storage;   // A, B, C, D and the bias
  compute_kind compute;  // accumulation
  scalar_kind scale;     // alpha, beta
  bool tensor_cores;
};

template <class T>
constexpr gemm_types gemm_types_for(bool allow_tf32 = false) {
  constexpr scalar_kind s = scalar_kind_of<T>();
  if constexpr (s == scalar_kind::f64) return {s, compute_kind::f64, scalar_kind::f64, false};
  else if constexpr (s == scalar_kind::f32)
    return {s, allow_tf32 ? compute_kind::f32_fast_tf32 : compute_kind::f32, scalar_kind::f32, allow_tf32};
  else return {s, compute_kind::f32, scalar_kind::f32, true};
}

// The types the element-wise and row kernels use: storage T, arithmetic in acc_t<T> (float for
// bf16/fp16/fp32), one rounding (round to nearest even, strata/core/dtype.hpp, identical on
// the CPU and the GPU) on the way out.
template <class T>
inline constexpr bool cuda_storage_v = std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;
template <class T>
inline constexpr bool tensor_core_storage_v = std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

// cuBLASLt epilogue for a linear layer's forward GEMM. The bias (and GELU) fuse for every
// type but fp64 (whose bias is pre-filled and added with beta = 1, as on the host).
enum class epilogue_kind { none, bias, gelu_aux_bias };
inline epilogue_kind linear_epilogue(scalar_kind s, bool has_bias, bool gelu) {
  STRATA_CHECK(!gelu || has_bias, "gpu::linear_epilogue: the GELU epilogue is only offered with a bias");
  if (s == scalar_kind::f64) {
    STRATA_CHECK(!gelu, "gpu::linear_epilogue: no GELU epilogue for fp64");
    return epilogue_kind::none;
  }
  if (gelu) return epilogue_kind::gelu_aux_bias;
  return has_bias ? epilogue_kind::bias : epilogue_kind::none;
}

// cuBLAS recommends a 32 MiB workspace on Hopper (sm_90) and later, 4 MiB before.
inline std::size_t gemm_workspace_bytes(int cc_major) {
  return cc_major >= 9 ? std::size_t(32) << 20 : std::size_t(4) << 20;
}

// Row-major C[M,N] = op(A)[M,K] op(B)[K,N] (strata's convention) as the column-major GEMM
// cuBLASLt performs: C^T[N,M] = op(B)^T op(A)^T, i.e. cuBLASLt's "A" is strata's B and its "B"
// is strata's A. A row-major r x c matrix with leading dimension ld is a column-major c x r one.
struct colmajor_gemm {
  bool trans_a, trans_b;  // cuBLASLt's op(A), op(B)
  std::int64_t m, n, k;   // D is m x n (column-major), op(A) m x k, op(B) k x n
  // Stored (column-major) shapes and leading dimensions of cuBLASLt's A (= strata's B), B
  // (= strata's A) and C/D.
  std::int64_t a_rows, a_cols, lda;
  std::int64_t b_rows, b_cols, ldb;
  std::int64_t c_rows, c_cols, ldc;
};

inline colmajor_gemm to_colmajor(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                                 std::int64_t lda, std::int64_t ldb, std::int64_t ldc) {
  colmajor_gemm g{};
  g.trans_a = trans_b;
  g.trans_b = trans_a;
  g.m = N;
  g.n = M;
  g.k = K;
  // strata's B is stored row-major as (trans_b ? N x K : K x N): column-major that is the reverse.
  g.a_rows = trans_b ? K : N;
  g.a_cols = trans_b ? N : K;
  g.lda = ldb;
  // strata's A is stored row-major as (trans_a ? K x M : M x K).
  g.b_rows = trans_a ? M : K;
  g.b_cols = trans_a ? K : M;
  g.ldb = lda;
  g.c_rows = N;
  g.c_cols = M;
  g.ldc = ldc;
  return g;
}

// ---------------------------------------------------------------------------------------------
// Causal attention tiling (kernels/cuda/attention.cuh). A block owns br query rows (forward,
// backward dQ) or bc key rows (backward dK/dV) of one (batch, head) and loops over the tiles of
// the other side, keeping every tile in shared memory; the T x T score matrix never reaches
// global memory. Tensor cores (WMMA 16x16x16, fp32 accumulate) serve bf16/fp16 when the head
// size is a multiple of 16; otherwise, and for fp32, a scalar path with the same structure.
//
// Shared memory, with e = sizeof(T), a = sizeof(float), p = e (tensor cores) or a (scalar):
//   forward   Q, K, V tiles            (br + 2 bc) * ld_t * e
//             S (scores, fp32)          br * ld_s * a
//             P (probabilities)         br * ld_p * p
//             O (output accumulator)    br * ld_o * a,      m, l: 2 br * a
//   bwd dK/dV Q, dO, K, V tiles         (2 br + 2 bc) * ld_t * e
//             S/P and dP (fp32)         2 br * ld_s * a
//             P and dS (operand type)   2 br * ld_p * p
//             dK, dV accumulators       2 bc * ld_o * a,    lse, D: 2 br * a
//   bwd dQ    Q, dO, K, V tiles         (2 br + 2 bc) * ld_t * e
//             S/P and dP (fp32)         2 br * ld_s * a
//             dS (operand type)         br * ld_p * p
//             dQ accumulator            br * ld_o * a,      lse, D: 2 br * a
// Each region starts on a 128-byte boundary (WMMA needs 32-byte aligned fragment pointers).
struct attention_plan {
  int head_dim = 0;
  bool tensor_cores = false;
  int br = 0, bc = 0;  // query rows and key rows per tile
  int threads = 0;
  int ld_t = 0;  // row stride (elements) of the Q/K/V/dO tiles
  int ld_s = 0;  // of the fp32 score tiles
  int ld_p = 0;  // of the P/dS operand tiles
  int ld_o = 0;  // of the fp32 output/gradient accumulators
  std::size_t smem_forward = 0, smem_backward_kv = 0, smem_backward_q = 0;
  std::size_t smem_max() const { return std::max({smem_forward, smem_backward_kv, smem_backward_q}); }
};

inline constexpr std::size_t smem_align = 128;
constexpr std::size_t align_up(std::size_t x, std::size_t a = smem_align) { return (x + a - 1) / a * a; }

// Byte offsets of the shared-memory regions, in the order listed above; the kernels use the
// same function, so the plan's sizes and the kernels' layout cannot drift apart.
struct attention_smem_layout {
  // forward: q, k, v, s, p, o, m, l          backward_kv: q, do, k, v, s, dp, p, ds, dk, dv, lse, d
  // backward_q: q, do, k, v, s, dp, ds, dq, lse, d   (unused offsets are 0)
  std::size_t q = 0, dout = 0, k = 0, v = 0, s = 0, dp = 0, p = 0, ds = 0, acc0 = 0, acc1 = 0, row0 = 0, row1 = 0,
              total = 0;
};

enum class attention_pass { forward, backward_kv, backward_q };

inline attention_smem_layout attention_layout(attention_pass pass, int br, int bc, int ld_t, int ld_s, int ld_p,
                                              int ld_o, std::size_t e, std::size_t p_bytes) {
  const std::size_t a = sizeof(float);
  attention_smem_layout L;
  std::size_t off = 0;
  auto take = [&off](std::size_t bytes) {
    const std::size_t at = off;
    off = align_up(off + bytes);
    return at;
  };
  const std::size_t tq = std::size_t(br) * std::size_t(ld_t) * e, tk = std::size_t(bc) * std::size_t(ld_t) * e;
  const std::size_t s_bytes = std::size_t(br) * std::size_t(ld_s) * a;
  const std::size_t p_tile = std::size_t(br) * std::size_t(ld_p) * p_bytes;
  switch (pass) {
    case attention_pass::forward:
      L.q = take(tq);
      L.k = take(tk);
      L.v = take(tk);
      L.s = take(s_bytes);
      L.p = take(p_tile);
      L.acc0 = take(std::size_t(br) * std::size_t(ld_o) * a);
      L.row0 = take(std::size_t(br) * a);
      L.row1 = take(std::size_t(br) * a);
      break;
    case attention_pass::backward_kv:
      L.q = take(tq);
      L.dout = take(tq);
      L.k = take(tk);
      L.v = take(tk);
      L.s = take(s_bytes);
      L.dp = take(s_bytes);
      L.p = take(p_tile);
      L.ds = take(p_tile);
      L.acc0 = take(std::size_t(bc) * std::size_t(ld_o) * a);
      L.acc1 = take(std::size_t(bc) * std::size_t(ld_o) * a);
      L.row0 = take(std::size_t(br) * a);
      L.row1 = take(std::size_t(br) * a);
      break;
    case attention_pass::backward_q:
      L.q = take(tq);
      L.dout = take(tq);
      L.k = take(tk);
      L.v = take(tk);
      L.s = take(s_bytes);
      L.dp = take(s_bytes);
      L.ds = take(p_tile);
      L.acc0 = take(std::size_t(br) * std::size_t(ld_o) * a);
      L.row0 = take(std::size_t(br) * a);
      L.row1 = take(std::size_t(br) * a);
      break;
  }
  L.total = off;
  return L;
}

// elem_bytes: sizeof(T); tensor_core_type: T is bf16/fp16; smem_limit: the device's opt-in
// shared memory per block (227 KiB on sm_90). Prefers 64 x 64 tiles, then 32 x 32, then 16 x 16.
inline attention_plan plan_attention(std::int64_t head_dim, std::size_t elem_bytes, bool tensor_core_type,
                                     std::size_t smem_limit) {
  STRATA_CHECK(head_dim > 0 && head_dim <= 256, "attention (CUDA): head size C / NH = ", head_dim,
               " is outside the supported 1 .. 256");
  attention_plan p;
  p.head_dim = int(head_dim);
  p.tensor_cores = tensor_core_type && head_dim % 16 == 0;
  const int hs = p.head_dim;
  // Tensor cores: ld must be a multiple of 8 elements (16-bit) or 4 (fp32); +8 / +4 padding
  // also staggers rows across shared-memory banks. Scalar path: an odd stride avoids conflicts.
  p.threads = p.tensor_cores ? 256 : 128;
  for (int tile : {64, 32, 16}) {
    p.br = p.bc = tile;
    if (p.tensor_cores) {
      p.ld_t = hs + 8;
      p.ld_s = tile + 4;
      p.ld_p = tile + 8;
      p.ld_o = hs + 4;
    } else {
      p.ld_t = hs + 1;
      p.ld_s = tile + 1;
      p.ld_p = tile + 1;
      p.ld_o = hs + 1;
    }
    const std::size_t pb = p.tensor_cores ? elem_bytes : sizeof(float);
    p.smem_forward =
        attention_layout(attention_pass::forward, p.br, p.bc, p.ld_t, p.ld_s, p.ld_p, p.ld_o, elem_bytes, pb).total;
    p.smem_backward_kv =
        attention_layout(attention_pass::backward_kv, p.br, p.bc, p.ld_t, p.ld_s, p.ld_p, p.ld_o, elem_bytes, pb).total;
    p.smem_backward_q =
        attention_layout(attention_pass::backward_q, p.br, p.bc, p.ld_t, p.ld_s, p.ld_p, p.ld_o, elem_bytes, pb).total;
    // The scalar path keeps tiles small: its cost is arithmetic, not tile reuse.
    if (!p.tensor_cores && tile > 32) continue;
    if (p.smem_max() <= smem_limit) return p;
  }
  fail("attention (CUDA): head size ", hs, " needs ", p.smem_max(), " bytes of shared memory per block even with ",
       p.br, "-row tiles; the device offers ", smem_limit);
}

// AdamW's per-step scalars in the master type M, derived exactly as kernels/host/adamw.hpp
// derives them (double, then one rounding to M).
template <class M>
struct adamw_scalars {
  M decay, step_size, bc2_sqrt, one_minus_b1, b2, one_minus_b2, eps, scale, one_minus_w;
  bool lerp_from_start;
};

// bias_correction1 = 1 - beta1^t, bias_correction2 = 1 - beta2^t.
template <class M>
STRATA_HD inline adamw_scalars<M> make_adamw_scalars(double lr, double beta1, double beta2, double eps,
                                                     double weight_decay, double bias_correction1,
                                                     double bias_correction2, double grad_scale) {
  adamw_scalars<M> s;
  s.decay = M(1.0 - lr * weight_decay);
  s.step_size = M(lr / bias_correction1);
  s.bc2_sqrt = M(hd::sqrt(bias_correction2));
  s.one_minus_b1 = M(1.0 - beta1);
  s.b2 = M(beta2);
  s.one_minus_b2 = M(1.0 - beta2);
  s.eps = M(eps);
  s.scale = M(grad_scale);
  s.lerp_from_start = s.one_minus_b1 < M(0.5);
  s.one_minus_w = M(1) - s.one_minus_b1;
  return s;
}

}  // namespace strata::gpu
