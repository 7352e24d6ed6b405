// strata/kernels/cuda/attention.cuh - causal self-attention on the GPU (multi-head, grouped-query
// and multi-query), tiled so the T x T score matrix never reaches global memory (flash-attention
// style, online softmax). The geometry is kernels/attention_shape.hpp's attention_shape:
//
//   qkv  [B, T, W]   W = row_width() = (heads + 2 kv_heads) hd: per token the query heads, the key
//                    heads, the value heads. Query head h reads key/value head h / group()
//                    (group = heads / kv_heads); K and V are never repeated in memory.
//   out  [B, T, heads hd]   out[b, t, h hd + i] = sum_t2 softmax_t2(scale q_t . k_t2) v[b, t2, h/g, i]
//   lse  [B, heads, T]  (fp32) the per-row logsumexp lse = max + log(sum exp): what the backward
//                    recomputes the probabilities from. scale = s.softmax_scale() (1/sqrt(hd) by
//                    default).
//
// Forward (grid: query tiles x B*heads, one block per (query tile, b, query head)): Q tile in
// shared memory; for each key tile of the head's key/value head up to the diagonal, S = Q K^T,
// then an online softmax per row (running max m and sum l, the accumulated O rescaled by
// exp(m_old - m_new)), then O += P V. out = O / l, lse = m + log l.
//
// Backward (FlashAttention-2's recomputation, made deterministic): D = rowsum(dO * O); then
//   dK/dV kernel (grid: key tiles x B*kv_heads): one block per (key tile, b, key/value head),
//                 looping over the group's query heads and, for each, over the query tiles at or
//                 below the diagonal: P = exp(S scale - lse), dV += P^T dO, dP = dO V^T,
//                 dS = P (dP - D) scale, dK += dS^T Q
//   dQ kernel     (grid: query tiles x B*heads): one block per (query tile, b, query head),
//                 looping over the key tiles of its key/value head: dQ += dS K
// Each gradient element is owned by one block, summed in a fixed order (query heads, then query
// tiles, then the tile's rows) and written once: no atomics, so the result is bit-identical from
// run to run, and dqkv is never read (the two kernels together write every element of it).
// (dS is recomputed in both kernels instead of accumulating dQ with float atomics.)
//
// Register-fragment kernels: for bf16/fp16 with head size 64 or 128 (aligned rows, sm_80 on), the
// launchers run attention_fragments.cuh's kernels instead, the same function with the same
// roundings and FlashAttention-2's register-resident accumulators (on an H200 the tiled kernels
// below reach 2-3% of the GEMM rate; attention_kernel_choice() selects them for comparison).
//
// Tensor cores: for bf16/fp16 with hd a multiple of 16, the five tile products use WMMA
// (16x16x16, fp32 accumulate; P and dS rounded to the storage type as their operand, as
// flash-attention does). Otherwise (fp32, odd head sizes) the same kernels run scalar FMAs.
// Tile sizes and shared memory come from gpu::plan_attention (launch_config.hpp); they depend on
// the head size only, not on the grouping.
//
// attention_backward takes the forward's `out`; when it is null the forward is recomputed into
// scratch first (D = rowsum(dO * out) needs it). The GPT-2 overloads (B, T, C, NH [, out]) remain,
// as wrappers over attention_shape::multi_head(B, T, C, NH); `att` is their lse.
#pragma once
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/attention_shape.hpp"
#include "strata/kernels/cuda/attention_fragments.cuh"
#include "strata/kernels/cuda/common.cuh"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {

template <class T>
struct wmma_elem;
template <>
struct wmma_elem<bf16> {
  using type = __nv_bfloat16;
};
template <>
struct wmma_elem<fp16> {
  using type = __half;
};

// Everything a kernel needs to know about the tiling (a plain copy of the plan's numbers).
struct attention_geometry {
  int br, bc, ld_t, ld_s, ld_p, ld_o;
  gpu::attention_smem_layout layout;
};

enum class mm_kind { nt, nn, tn };

// Block-wide tile product into an fp32 shared-memory tile:
//   nt: C[M x N] (+)= A[M x K] . B[N x K]^T     nn: C (+)= A[M x K] . B[K x N]
//   tn: C[M x N] (+)= A[K x M]^T . B[K x N]
// All operands row-major in shared memory with the given leading dimensions.
// TC: WMMA 16x16x16 (M, N, K multiples of 16), one warp per 16x16 output fragment.
template <mm_kind Kind, bool TC, class EA, class EB>
__device__ __forceinline__ void block_mm(float* C, int ldc, const EA* A, int lda, const EB* B, int ldb, int M, int N,
                                         int K, bool accumulate) {
  if constexpr (TC) {
    namespace wmma = nvcuda::wmma;
    static_assert(std::is_same_v<EA, EB>, "block_mm: tensor-core operands share a type");
    using W = typename wmma_elem<EA>::type;
    using a_layout = std::conditional_t<Kind == mm_kind::tn, wmma::col_major, wmma::row_major>;
    using b_layout = std::conditional_t<Kind == mm_kind::nt, wmma::col_major, wmma::row_major>;
    const W* a_base = reinterpret_cast<const W*>(A);
    const W* b_base = reinterpret_cast<const W*>(B);
    const int warp = int(threadIdx.x / 32), warps = int(blockDim.x / 32);
    const int tiles_n = N / 16, tiles = (M / 16) * tiles_n;
    for (int t = warp; t < tiles; t += warps) {
      const int mi = (t / tiles_n) * 16, ni = (t % tiles_n) * 16;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      if (accumulate) wmma::load_matrix_sync(acc, C + mi * ldc + ni, unsigned(ldc), wmma::mem_row_major);
      else wmma::fill_fragment(acc, 0.0f);
      for (int k = 0; k < K; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, W, a_layout> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, W, b_layout> fb;
        if constexpr (Kind == mm_kind::tn) wmma::load_matrix_sync(fa, a_base + k * lda + mi, unsigned(lda));
        else wmma::load_matrix_sync(fa, a_base + mi * lda + k, unsigned(lda));
        if constexpr (Kind == mm_kind::nt) wmma::load_matrix_sync(fb, b_base + ni * ldb + k, unsigned(ldb));
        else wmma::load_matrix_sync(fb, b_base + k * ldb + ni, unsigned(ldb));
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(C + mi * ldc + ni, acc, unsigned(ldc), wmma::mem_row_major);
    }
  } else {
    for (int idx = int(threadIdx.x); idx < M * N; idx += int(blockDim.x)) {
      const int r = idx / N, c = idx % N;
      float s = accumulate ? C[r * ldc + c] : 0.0f;
      for (int k = 0; k < K; ++k) {
        float a, b;
        if constexpr (Kind == mm_kind::nt) {
          a = widen(A[r * lda + k]);
          b = widen(B[c * ldb + k]);
        } else if constexpr (Kind == mm_kind::nn) {
          a = widen(A[r * lda + k]);
          b = widen(B[k * ldb + c]);
        } else {
          a = widen(A[k * lda + r]);
          b = widen(B[k * ldb + c]);
        }
        s = fmaf(a, b, s);
      }
      C[r * ldc + c] = s;
    }
  }
}

// dst[r, 0..hs) = src[(row0 + r) * stride + 0..hs) for rows < T_, zeros beyond. `vec`: 16-byte
// copies (src, stride, hs and ld all allow it; decided by the launcher).
template <class T>
__device__ __forceinline__ void load_tile(T* dst, int ld, const T* src, std::int64_t stride, int row0, int rows, int T_,
                                          int hs, bool vec) {
  if (vec) {
    constexpr int E = 16 / int(sizeof(T));
    const int per_row = hs / E;
    for (int idx = int(threadIdx.x); idx < rows * per_row; idx += int(blockDim.x)) {
      const int r = idx / per_row, q = idx % per_row;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (row0 + r < T_) v = *reinterpret_cast<const uint4*>(src + std::int64_t(row0 + r) * stride + q * E);
      *reinterpret_cast<uint4*>(dst + r * ld + q * E) = v;
    }
  } else {
    for (int idx = int(threadIdx.x); idx < rows * hs; idx += int(blockDim.x)) {
      const int r = idx / hs, d = idx % hs;
      dst[r * ld + d] = row0 + r < T_ ? src[std::int64_t(row0 + r) * stride + d] : narrow<T>(0.0f);
    }
  }
}

// The online softmax's step for one key tile (k0 on), one warp per query row (q0 on): S masked and
// scaled, the running max sM and sum sL updated, P into sP (the PV product's operand) and the
// output accumulated so far (sO) rescaled by exp(m_old - m_new).
template <class T, bool TC, class PT>
__device__ __forceinline__ void online_softmax_rows(float* sS, PT* sP, float* sO, float* sM, float* sL,
                                                    attention_geometry g, int q0, int k0, int T_, int hs, float scale,
                                                    int warp, int lane, int warps) {
  const int br = g.br, bc = g.bc;
  for (int r = warp; r < br; r += warps) {
    const int i = q0 + r;
    const float m_old = sM[r];
    float mx = -INFINITY;
    for (int c = lane; c < bc; c += 32) {
      const int j = k0 + c;
      const float s = (j <= i && i < T_) ? sS[r * g.ld_s + c] * scale : -INFINITY;
      sS[r * g.ld_s + c] = s;
      mx = fmaxf(mx, s);
    }
    mx = warp_max(mx);
    const float m_new = fmaxf(m_old, mx);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a fully masked row so far
    float sum = 0.0f;
    for (int c = lane; c < bc; c += 32) {
      const float p = expf(sS[r * g.ld_s + c] - m_use);
      if constexpr (TC) sP[r * g.ld_p + c] = narrow<T>(p);
      else sP[r * g.ld_p + c] = p;
      sum += p;
    }
    sum = warp_sum(sum);
    const float alpha = expf(m_old - m_use);
    for (int d = lane; d < hs; d += 32) sO[r * g.ld_o + d] *= alpha;
    __syncwarp();
    if (lane == 0) {
      sM[r] = m_new;
      sL[r] = sL[r] * alpha + sum;
    }
  }
}

// out = O / l and lse = m + log l for the query tile's rows (q0 on) of query head h.
template <class T>
__device__ __forceinline__ void store_forward_tile(T* out, float* lse, const float* sO, const float* sM,
                                                   const float* sL, attention_dims a, attention_geometry g, int T_,
                                                   int b, int h, int bh, int q0) {
  const int hs = a.hd, br = g.br;
  for (int idx = int(threadIdx.x); idx < br * hs; idx += int(blockDim.x)) {
    const int r = idx / hs, d = idx % hs, i = q0 + r;
    if (i < T_)
      out[(std::int64_t(b) * T_ + i) * a.q_width + std::int64_t(h) * hs + d] = narrow<T>(sO[r * g.ld_o + d] / sL[r]);
  }
  for (int r = int(threadIdx.x); r < br; r += int(blockDim.x))
    if (q0 + r < T_) lse[std::int64_t(bh) * T_ + q0 + r] = sM[r] + logf(sL[r]);
}

// grid (query tiles, B*heads). out [B, T, heads*hd], lse [B, heads, T], qkv [B, T, row].
template <class T, bool TC>
__global__ void attention_forward_kernel(T* out, float* lse, const T* qkv, attention_dims a, attention_geometry g,
                                         bool vec) {
  using PT = std::conditional_t<TC, T, float>;  // the P operand
  extern __shared__ __align__(128) unsigned char smem[];
  const int T_ = a.T, hs = a.hd, br = g.br, bc = g.bc;
  const int bh = int(blockIdx.y), b = bh / a.heads, h = bh % a.heads, kvh = h / a.group;
  const int q0 = int(blockIdx.x) * br;
  const T* batch = qkv + std::int64_t(b) * T_ * a.row;
  const T* qbase = batch + std::int64_t(h) * hs;
  const T* kbase = batch + a.q_width + std::int64_t(kvh) * hs;
  const T* vbase = batch + a.v_off + std::int64_t(kvh) * hs;
  T* sQ = reinterpret_cast<T*>(smem + g.layout.q);
  T* sK = reinterpret_cast<T*>(smem + g.layout.k);
  T* sV = reinterpret_cast<T*>(smem + g.layout.v);
  float* sS = reinterpret_cast<float*>(smem + g.layout.s);
  PT* sP = reinterpret_cast<PT*>(smem + g.layout.p);
  float* sO = reinterpret_cast<float*>(smem + g.layout.acc0);
  float* sM = reinterpret_cast<float*>(smem + g.layout.row0);
  float* sL = reinterpret_cast<float*>(smem + g.layout.row1);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32), warps = int(blockDim.x / 32);
  const float scale = a.scale;

  load_tile(sQ, g.ld_t, qbase, a.row, q0, br, T_, hs, vec);
  for (int idx = int(threadIdx.x); idx < br * g.ld_o; idx += int(blockDim.x)) sO[idx] = 0.0f;
  for (int r = int(threadIdx.x); r < br; r += int(blockDim.x)) {
    sM[r] = -INFINITY;
    sL[r] = 0.0f;
  }
  const int q_last = min(q0 + br, T_) - 1;  // the last valid query row of this tile
  const int kv_tiles = q_last / bc + 1;     // key tiles 0 .. kv_tiles-1 reach the diagonal

  for (int kt = 0; kt < kv_tiles; ++kt) {
    const int k0 = kt * bc;
    __syncthreads();  // the previous tile's K, V, P are consumed
    load_tile(sK, g.ld_t, kbase, a.row, k0, bc, T_, hs, vec);
    load_tile(sV, g.ld_t, vbase, a.row, k0, bc, T_, hs, vec);
    __syncthreads();
    block_mm<mm_kind::nt, TC>(sS, g.ld_s, sQ, g.ld_t, sK, g.ld_t, br, bc, hs, false);  // S = Q K^T
    __syncthreads();
    online_softmax_rows<T, TC>(sS, sP, sO, sM, sL, g, q0, k0, T_, hs, scale, warp, lane, warps);
    __syncthreads();
    block_mm<mm_kind::nn, TC>(sO, g.ld_o, sP, g.ld_p, sV, g.ld_t, br, hs, bc, true);  // O += P V
  }
  __syncthreads();
  store_forward_tile(out, lse, sO, sM, sL, a, g, T_, b, h, bh, q0);
}

// D[b, h, t] = sum_i dout[b, t, h*hd + i] * out[b, t, h*hd + i]; one warp per (b, h, t).
template <class T>
__global__ void attention_delta_kernel(float* D, const T* dout, const T* out, std::int64_t B, attention_dims a) {
  const std::int64_t row = std::int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= B * a.heads * a.T) return;
  const int lane = int(threadIdx.x % 32), hs = a.hd;
  const std::int64_t t = row % a.T, bh = row / a.T;
  const std::int64_t h = bh % a.heads, b = bh / a.heads;
  const std::int64_t off = (b * a.T + t) * a.q_width + h * hs;
  float s = 0.0f;
  for (int d = lane; d < hs; d += 32) s += widen(dout[off + d]) * widen(out[off + d]);
  s = warp_sum(s);
  if (lane == 0) D[row] = s;  // row = (b*heads + h)*T + t
}

// The dK/dV kernel's P = exp(S scale - lse) of a (query tile q0, key tile k0) pair, 0 where a row
// does not see the key: kept in sS (fp32, for dS) and in sP (the dV product's operand).
template <class T, bool TC, class PT>
__device__ __forceinline__ void tile_probabilities(float* sS, PT* sP, const float* sLse, attention_geometry g, int q0,
                                                   int k0, int T_, float scale) {
  const int br = g.br, bc = g.bc;
  for (int idx = int(threadIdx.x); idx < br * bc; idx += int(blockDim.x)) {
    const int r = idx / bc, c = idx % bc, i = q0 + r, j = k0 + c;
    const float p = (j <= i && i < T_) ? expf(sS[r * g.ld_s + c] * scale - sLse[r]) : 0.0f;
    sS[r * g.ld_s + c] = p;
    if constexpr (TC) sP[r * g.ld_p + c] = narrow<T>(p);
    else sP[r * g.ld_p + c] = p;
  }
}

// dS = P (dP - D) scale into sdS, the dK product's operand.
template <class T, bool TC, class PT>
__device__ __forceinline__ void tile_score_gradients(PT* sdS, const float* sS, const float* sdP, const float* sD,
                                                     attention_geometry g, float scale) {
  const int br = g.br, bc = g.bc;
  for (int idx = int(threadIdx.x); idx < br * bc; idx += int(blockDim.x)) {
    const int r = idx / bc, c = idx % bc;
    const float ds = sS[r * g.ld_s + c] * (sdP[r * g.ld_s + c] - sD[r]) * scale;
    if constexpr (TC) sdS[r * g.ld_p + c] = narrow<T>(ds);
    else sdS[r * g.ld_p + c] = ds;
  }
}

// dK and dV of the key tile (k0 on) of key/value head kvh into dqkv, rounded once.
template <class T>
__device__ __forceinline__ void store_key_tile(T* dqkv, const float* sdK, const float* sdV, attention_dims a,
                                               attention_geometry g, int T_, int b, int kvh, int k0) {
  const int hs = a.hd, bc = g.bc;
  T* dbatch = dqkv + std::int64_t(b) * T_ * a.row;
  for (int idx = int(threadIdx.x); idx < bc * hs; idx += int(blockDim.x)) {
    const int r = idx / hs, d = idx % hs, j = k0 + r;
    if (j >= T_) continue;
    T* row = dbatch + std::int64_t(j) * a.row + std::int64_t(kvh) * hs + d;
    T* dk = row + a.q_width;
    T* dv = row + a.v_off;
    *dk = narrow<T>(sdK[r * g.ld_o + d]);
    *dv = narrow<T>(sdV[r * g.ld_o + d]);
  }
}

// grid (key tiles, B*kv_heads): dK, dV of one key tile of one key/value head, summed over the
// group's query heads; written into dqkv.
template <class T, bool TC>
__global__ void attention_backward_kv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D,
                                             attention_dims a, attention_geometry g, bool vec_qkv, bool vec_dout) {
  using PT = std::conditional_t<TC, T, float>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int T_ = a.T, hs = a.hd, br = g.br, bc = g.bc;
  const int bk = int(blockIdx.y), b = bk / a.kv_heads, kvh = bk % a.kv_heads;
  const int k0 = int(blockIdx.x) * bc;
  const T* batch = qkv + std::int64_t(b) * T_ * a.row;
  const T* kbase = batch + a.q_width + std::int64_t(kvh) * hs;
  const T* vbase = batch + a.v_off + std::int64_t(kvh) * hs;
  T* sQ = reinterpret_cast<T*>(smem + g.layout.q);
  T* sdO = reinterpret_cast<T*>(smem + g.layout.dout);
  T* sK = reinterpret_cast<T*>(smem + g.layout.k);
  T* sV = reinterpret_cast<T*>(smem + g.layout.v);
  float* sS = reinterpret_cast<float*>(smem + g.layout.s);
  float* sdP = reinterpret_cast<float*>(smem + g.layout.dp);
  PT* sP = reinterpret_cast<PT*>(smem + g.layout.p);
  PT* sdS = reinterpret_cast<PT*>(smem + g.layout.ds);
  float* sdK = reinterpret_cast<float*>(smem + g.layout.acc0);
  float* sdV = reinterpret_cast<float*>(smem + g.layout.acc1);
  float* sLse = reinterpret_cast<float*>(smem + g.layout.row0);
  float* sD = reinterpret_cast<float*>(smem + g.layout.row1);
  const float scale = a.scale;

  load_tile(sK, g.ld_t, kbase, a.row, k0, bc, T_, hs, vec_qkv);
  load_tile(sV, g.ld_t, vbase, a.row, k0, bc, T_, hs, vec_qkv);
  for (int idx = int(threadIdx.x); idx < bc * g.ld_o; idx += int(blockDim.x)) {
    sdK[idx] = 0.0f;
    sdV[idx] = 0.0f;
  }
  const int q_tiles = (T_ + br - 1) / br;
  for (int gi = 0; gi < a.group; ++gi) {
    const int h = kvh * a.group + gi;  // the query head
    const T* qbase = batch + std::int64_t(h) * hs;
    const T* dbase = dout + std::int64_t(b) * T_ * a.q_width + std::int64_t(h) * hs;
    const std::int64_t rows = (std::int64_t(b) * a.heads + h) * T_;  // this head's rows of lse and D
    for (int qt = k0 / br; qt < q_tiles; ++qt) {
      const int q0 = qt * br;
      __syncthreads();  // the previous tile's Q, dO, P, dS are consumed
      load_tile(sQ, g.ld_t, qbase, a.row, q0, br, T_, hs, vec_qkv);
      load_tile(sdO, g.ld_t, dbase, a.q_width, q0, br, T_, hs, vec_dout);
      for (int r = int(threadIdx.x); r < br; r += int(blockDim.x)) {
        const bool ok = q0 + r < T_;
        sLse[r] = ok ? lse[rows + q0 + r] : 0.0f;
        sD[r] = ok ? D[rows + q0 + r] : 0.0f;
      }
      __syncthreads();
      block_mm<mm_kind::nt, TC>(sS, g.ld_s, sQ, g.ld_t, sK, g.ld_t, br, bc, hs, false);  // S = Q K^T
      __syncthreads();
      tile_probabilities<T, TC>(sS, sP, sLse, g, q0, k0, T_, scale);
      __syncthreads();
      block_mm<mm_kind::tn, TC>(sdV, g.ld_o, sP, g.ld_p, sdO, g.ld_t, bc, hs, br, true);   // dV += P^T dO
      block_mm<mm_kind::nt, TC>(sdP, g.ld_s, sdO, g.ld_t, sV, g.ld_t, br, bc, hs, false);  // dP = dO V^T
      __syncthreads();
      tile_score_gradients<T, TC>(sdS, sS, sdP, sD, g, scale);
      __syncthreads();
      block_mm<mm_kind::tn, TC>(sdK, g.ld_o, sdS, g.ld_p, sQ, g.ld_t, bc, hs, br, true);  // dK += dS^T Q
    }
  }
  __syncthreads();
  store_key_tile(dqkv, sdK, sdV, a, g, T_, b, kvh, k0);
}

// grid (query tiles, B*heads): dQ of one query tile of one query head; written into dqkv.
template <class T, bool TC>
__global__ void attention_backward_q_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D,
                                            attention_dims a, attention_geometry g, bool vec_qkv, bool vec_dout) {
  using PT = std::conditional_t<TC, T, float>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int T_ = a.T, hs = a.hd, br = g.br, bc = g.bc;
  const int bh = int(blockIdx.y), b = bh / a.heads, h = bh % a.heads, kvh = h / a.group;
  const int q0 = int(blockIdx.x) * br;
  const T* batch = qkv + std::int64_t(b) * T_ * a.row;
  const T* qbase = batch + std::int64_t(h) * hs;
  const T* kbase = batch + a.q_width + std::int64_t(kvh) * hs;
  const T* vbase = batch + a.v_off + std::int64_t(kvh) * hs;
  const T* dbase = dout + std::int64_t(b) * T_ * a.q_width + std::int64_t(h) * hs;
  T* sQ = reinterpret_cast<T*>(smem + g.layout.q);
  T* sdO = reinterpret_cast<T*>(smem + g.layout.dout);
  T* sK = reinterpret_cast<T*>(smem + g.layout.k);
  T* sV = reinterpret_cast<T*>(smem + g.layout.v);
  float* sS = reinterpret_cast<float*>(smem + g.layout.s);
  float* sdP = reinterpret_cast<float*>(smem + g.layout.dp);
  PT* sdS = reinterpret_cast<PT*>(smem + g.layout.ds);
  float* sdQ = reinterpret_cast<float*>(smem + g.layout.acc0);
  float* sLse = reinterpret_cast<float*>(smem + g.layout.row0);
  float* sD = reinterpret_cast<float*>(smem + g.layout.row1);
  const float scale = a.scale;

  load_tile(sQ, g.ld_t, qbase, a.row, q0, br, T_, hs, vec_qkv);
  load_tile(sdO, g.ld_t, dbase, a.q_width, q0, br, T_, hs, vec_dout);
  for (int r = int(threadIdx.x); r < br; r += int(blockDim.x)) {
    const bool ok = q0 + r < T_;
    sLse[r] = ok ? lse[std::int64_t(bh) * T_ + q0 + r] : 0.0f;
    sD[r] = ok ? D[std::int64_t(bh) * T_ + q0 + r] : 0.0f;
  }
  for (int idx = int(threadIdx.x); idx < br * g.ld_o; idx += int(blockDim.x)) sdQ[idx] = 0.0f;
  const int q_last = min(q0 + br, T_) - 1;
  const int kv_tiles = q_last / bc + 1;
  for (int kt = 0; kt < kv_tiles; ++kt) {
    const int k0 = kt * bc;
    __syncthreads();  // the previous tile's K and dS are consumed
    load_tile(sK, g.ld_t, kbase, a.row, k0, bc, T_, hs, vec_qkv);
    load_tile(sV, g.ld_t, vbase, a.row, k0, bc, T_, hs, vec_qkv);
    __syncthreads();
    block_mm<mm_kind::nt, TC>(sS, g.ld_s, sQ, g.ld_t, sK, g.ld_t, br, bc, hs, false);    // S = Q K^T
    block_mm<mm_kind::nt, TC>(sdP, g.ld_s, sdO, g.ld_t, sV, g.ld_t, br, bc, hs, false);  // dP = dO V^T
    __syncthreads();
    for (int idx = int(threadIdx.x); idx < br * bc; idx += int(blockDim.x)) {
      const int r = idx / bc, c = idx % bc, i = q0 + r, j = k0 + c;
      float ds = 0.0f;
      if (j <= i && i < T_) {
        const float p = expf(sS[r * g.ld_s + c] * scale - sLse[r]);
        ds = p * (sdP[r * g.ld_s + c] - sD[r]) * scale;
      }
      if constexpr (TC) sdS[r * g.ld_p + c] = narrow<T>(ds);
      else sdS[r * g.ld_p + c] = ds;
    }
    __syncthreads();
    block_mm<mm_kind::nn, TC>(sdQ, g.ld_o, sdS, g.ld_p, sK, g.ld_t, br, hs, bc, true);  // dQ += dS K
  }
  __syncthreads();
  for (int idx = int(threadIdx.x); idx < br * hs; idx += int(blockDim.x)) {
    const int r = idx / hs, d = idx % hs, i = q0 + r;
    if (i >= T_) continue;
    T* q = dqkv + (std::int64_t(b) * T_ + i) * a.row + std::int64_t(h) * hs + d;
    *q = narrow<T>(sdQ[r * g.ld_o + d]);
  }
}

// The GPT-2 overloads' check (B, T, C, NH), before they convert to an attention_shape.
inline void check_attention_shape(const char* who, std::int64_t B, std::int64_t T_, std::int64_t C, std::int64_t NH) {
  STRATA_CHECK(B >= 0 && T_ >= 0 && C > 0 && NH > 0, who, ": need B, T >= 0 and C, NH > 0, got B = ", B, ", T = ", T_,
               ", C = ", C, ", NH = ", NH);
  STRATA_CHECK(C % NH == 0, who, ": heads = ", NH, " does not divide channels C = ", C);
}

// What the CUDA kernels need of an attention_shape: valid, and grid and index sizes that fit.
inline void check_attention_shape(const char* who, const attention_shape& s) {
  STRATA_CHECK(s.batch >= 0 && s.seq >= 0 && s.heads > 0 && s.kv_heads > 0 && s.head_dim > 0, who,
               ": need batch, seq >= 0 and heads, kv_heads, head_dim > 0, got batch = ", s.batch, ", seq = ", s.seq,
               ", heads = ", s.heads, ", kv_heads = ", s.kv_heads, ", head_dim = ", s.head_dim);
  STRATA_CHECK(s.heads % s.kv_heads == 0, who, ": kv_heads = ", s.kv_heads, " does not divide heads = ", s.heads);
  STRATA_CHECK(std::isfinite(s.scale), who, ": the softmax scale must be finite, got ", s.scale);
  STRATA_CHECK(s.batch * s.heads <= 65535, who, ": batch * heads = ", s.batch * s.heads,
               " exceeds the grid's 65535 (batch * heads)");
  STRATA_CHECK(s.seq * s.row_width() < (std::int64_t(1) << 31), who, ": seq * row_width = ", s.seq * s.row_width(),
               " must stay below 2^31");
}

inline attention_dims attention_dims_for(const attention_shape& s) {
  attention_dims a{};
  a.T = int(s.seq);
  a.heads = int(s.heads);
  a.kv_heads = int(s.kv_heads);
  a.group = int(s.group());
  a.hd = int(s.head_dim);
  a.row = s.row_width();
  a.q_width = s.q_width();
  a.v_off = s.q_width() + s.kv_width();
  a.scale = float(s.softmax_scale());
  return a;
}

template <class T>
attention_geometry attention_geometry_for(const gpu::attention_plan& p, gpu::attention_pass pass) {
  const std::size_t pb = p.tensor_cores ? sizeof(T) : sizeof(float);
  return {p.br,
          p.bc,
          p.ld_t,
          p.ld_s,
          p.ld_p,
          p.ld_o,
          gpu::attention_layout(pass, p.br, p.bc, p.ld_t, p.ld_s, p.ld_p, p.ld_o, sizeof(T), pb)};
}

// Calls f(std::bool_constant<TC>) with the plan's choice (tensor cores exist for bf16/fp16 only).
template <class T, class F>
void with_tensor_cores(const gpu::attention_plan& p, F&& f) {
  if constexpr (gpu::tensor_core_storage_v<T>) {
    if (p.tensor_cores) {
      f(std::true_type{});
      return;
    }
  }
  f(std::false_type{});
}

// 16-byte tile loads: the base aligned, every row start aligned (row stride), every head's
// columns aligned (head size; the q/k/v offsets are multiples of it) and the tile rows too.
template <class T>
bool tile_loads_vectorized(const gpu::attention_plan& p, const T* base, std::int64_t row_stride) {
  return p.tensor_cores && gpu::aligned16(base) && (row_stride * std::int64_t(sizeof(T))) % 16 == 0 &&
         (std::int64_t(p.head_dim) * std::int64_t(sizeof(T))) % 16 == 0 && (p.ld_t * int(sizeof(T))) % 16 == 0;
}

// The register-fragment kernels (attention_fragments.cuh) apply: bf16 or fp16, head size 64 or
// 128, 16-byte aligned buffers and rows, a device with mma.sync's bf16 shapes (sm_80 on) and the
// shared memory they ask for, and nobody asked for the tiled kernels.
template <class T>
bool fragments_apply(const gpu::context& ctx, const attention_shape& s, std::initializer_list<const void*> buffers) {
  if constexpr (!gpu::tensor_core_storage_v<T>) {
    return false;
  } else {
    if (attention_kernel_choice().load() == attention_kernels::tiled) return false;
    if (s.head_dim != 64 && s.head_dim != 128) return false;
    if (ctx.properties().major < 8 || ctx.smem_optin() < fragments::plan<128>::smem_backward_kv) return false;
    for (const void* p : buffers)
      if (!gpu::aligned16(p)) return false;
    return (s.row_width() * std::int64_t(sizeof(T))) % 16 == 0 && (s.q_width() * std::int64_t(sizeof(T))) % 16 == 0;
  }
}

// Calls f(std::integral_constant<int, HD>) for head size 64 or 128.
template <class F>
void with_fragment_head_size(std::int64_t head_dim, F&& f) {
  if (head_dim == 64) f(std::integral_constant<int, 64>{});
  else f(std::integral_constant<int, 128>{});
}

}  // namespace cuda_detail

// out [B, T, heads*hd]; lse [B, heads, T] (fp32): the per-row logsumexp, see the header comment.
template <class T>
void attention_forward(cuda, T* out, acc_t<T>* lse, const T* qkv, const attention_shape& s) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  cuda_detail::check_attention_shape("attention_forward", s);
  if (s.batch == 0 || s.seq == 0) return;
  gpu::context& ctx = gpu::this_context();
  const cuda_detail::attention_dims a = cuda_detail::attention_dims_for(s);
  if constexpr (gpu::tensor_core_storage_v<T>) {
    if (cuda_detail::fragments_apply<T>(ctx, s, {out, qkv})) {
      cuda_detail::with_fragment_head_size(s.head_dim, [&](auto hd) {
        constexpr int HD = decltype(hd)::value;
        using P = cuda_detail::fragments::plan<HD>;
        auto* kernel = &cuda_detail::attention_forward_fragments<T, HD>;
        gpu::allow_dynamic_smem(kernel, P::smem_forward);
        kernel<<<dim3(unsigned(gpu::ceil_div(s.seq, P::fwd_rows)), unsigned(s.batch * s.heads)), P::threads,
                 P::smem_forward, ctx.stream()>>>(out, lse, qkv, a);
      });
      STRATA_CUDA_CHECK_LAUNCH("attention_forward");
      return;
    }
  }
  const gpu::attention_plan plan =
      gpu::plan_attention(s.head_dim, sizeof(T), gpu::tensor_core_storage_v<T>, ctx.smem_optin());
  const cuda_detail::attention_geometry g = cuda_detail::attention_geometry_for<T>(plan, gpu::attention_pass::forward);
  const dim3 grid(unsigned(gpu::ceil_div(s.seq, plan.br)), unsigned(s.batch * s.heads));
  const bool vec = cuda_detail::tile_loads_vectorized(plan, qkv, s.row_width());
  cuda_detail::with_tensor_cores<T>(plan, [&](auto tc) {
    constexpr bool TC = decltype(tc)::value;
    auto* kernel = &cuda_detail::attention_forward_kernel<T, TC>;
    gpu::allow_dynamic_smem(kernel, plan.smem_forward);
    kernel<<<grid, plan.threads, plan.smem_forward, ctx.stream()>>>(out, lse, qkv, a, g, vec);
  });
  STRATA_CUDA_CHECK_LAUNCH("attention_forward");
}

// Writes dqkv [B, T, row_width] (not read), as the host kernel does. lse: the forward's logsumexp
// [B, heads, T]. out: the forward's output [B, T, heads*hd]; null: recomputed into scratch (costs
// a forward).
template <class T>
void attention_backward(cuda, T* dqkv, const T* dout, const T* qkv, const acc_t<T>* lse,
                        const std::type_identity_t<T>* out, const attention_shape& s) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  cuda_detail::check_attention_shape("attention_backward", s);
  if (s.batch == 0 || s.seq == 0) return;
  gpu::context& ctx = gpu::this_context();
  const cudaStream_t stream = ctx.stream();
  const gpu::attention_plan plan =
      gpu::plan_attention(s.head_dim, sizeof(T), gpu::tensor_core_storage_v<T>, ctx.smem_optin());
  const cuda_detail::attention_dims a = cuda_detail::attention_dims_for(s);
  const std::int64_t rows = s.batch * s.heads * s.seq;  // query rows: lse, D

  // D = rowsum(dO * O), with O recomputed when the caller did not pass it.
  gpu::scratch<T> recomputed(out ? 0 : std::size_t(s.batch * s.seq * s.q_width()));
  gpu::scratch<float> recomputed_lse(out ? 0 : std::size_t(rows));
  if (!out) {
    attention_forward(cuda{}, recomputed.get(), recomputed_lse.get(), qkv, s);
    out = recomputed.get();
  }
  gpu::scratch<float> D{static_cast<std::size_t>(rows)};
  {
    const auto d = gpu::rows_launch(rows);
    cuda_detail::attention_delta_kernel<T><<<d.grid, d.block, 0, stream>>>(D.get(), dout, out, s.batch, a);
    STRATA_CUDA_CHECK_LAUNCH("attention_backward (delta)");
  }
  if constexpr (gpu::tensor_core_storage_v<T>) {
    if (cuda_detail::fragments_apply<T>(ctx, s, {dqkv, dout, qkv})) {
      cuda_detail::with_fragment_head_size(s.head_dim, [&](auto hd) {
        constexpr int HD = decltype(hd)::value;
        using P = cuda_detail::fragments::plan<HD>;
        auto* kv = &cuda_detail::attention_backward_kv_fragments<T, HD>;
        gpu::allow_dynamic_smem(kv, P::smem_backward_kv);
        kv<<<dim3(unsigned(gpu::ceil_div(s.seq, P::kv_keys)), unsigned(s.batch * s.kv_heads)), P::threads,
             P::smem_backward_kv, stream>>>(dqkv, dout, qkv, lse, D.get(), a);
        STRATA_CUDA_CHECK_LAUNCH("attention_backward (dk, dv)");
        auto* q = &cuda_detail::attention_backward_q_fragments<T, HD>;
        gpu::allow_dynamic_smem(q, P::smem_backward_q);
        q<<<dim3(unsigned(gpu::ceil_div(s.seq, P::q_rows)), unsigned(s.batch * s.heads)), P::threads,
            P::smem_backward_q, stream>>>(dqkv, dout, qkv, lse, D.get(), a);
        STRATA_CUDA_CHECK_LAUNCH("attention_backward (dq)");
      });
      return;
    }
  }
  const bool vec_qkv = cuda_detail::tile_loads_vectorized(plan, qkv, s.row_width());
  const bool vec_dout = cuda_detail::tile_loads_vectorized(plan, dout, s.q_width());
  const auto gkv = cuda_detail::attention_geometry_for<T>(plan, gpu::attention_pass::backward_kv);
  const auto gq = cuda_detail::attention_geometry_for<T>(plan, gpu::attention_pass::backward_q);
  cuda_detail::with_tensor_cores<T>(plan, [&](auto tc) {
    constexpr bool TC = decltype(tc)::value;
    auto* kv = &cuda_detail::attention_backward_kv_kernel<T, TC>;
    gpu::allow_dynamic_smem(kv, plan.smem_backward_kv);
    kv<<<dim3(unsigned(gpu::ceil_div(s.seq, plan.bc)), unsigned(s.batch * s.kv_heads)), plan.threads,
         plan.smem_backward_kv, stream>>>(dqkv, dout, qkv, lse, D.get(), a, gkv, vec_qkv, vec_dout);
    STRATA_CUDA_CHECK_LAUNCH("attention_backward (dk, dv)");
    auto* q = &cuda_detail::attention_backward_q_kernel<T, TC>;
    gpu::allow_dynamic_smem(q, plan.smem_backward_q);
    q<<<dim3(unsigned(gpu::ceil_div(s.seq, plan.br)), unsigned(s.batch * s.heads)), plan.threads, plan.smem_backward_q,
        stream>>>(dqkv, dout, qkv, lse, D.get(), a, gq, vec_qkv, vec_dout);
    STRATA_CUDA_CHECK_LAUNCH("attention_backward (dq)");
  });
}

// GPT-2's multi-head attention over C channels in NH heads: out [B, T, C]; att: the logsumexp
// [B, NH, T] (fp32). The same as attention_shape::multi_head(B, T, C, NH).
template <class T>
void attention_forward(cuda, T* out, acc_t<T>* att, const T* qkv, std::int64_t B, std::int64_t T_, std::int64_t C,
                       std::int64_t NH) {
  cuda_detail::check_attention_shape("attention_forward", B, T_, C, NH);
  attention_forward(cuda{}, out, att, qkv, attention_shape::multi_head(B, T_, C, NH));
}

// Writes dqkv [B, T, 3C]. att: the forward's logsumexp [B, NH, T]. out: the
// forward's output [B, T, C] when the caller still has it (saves recomputing it); optional.
template <class T>
void attention_backward(cuda, T* dqkv, const T* dout, const T* qkv, const acc_t<T>* att, std::int64_t B,
                        std::int64_t T_, std::int64_t C, std::int64_t NH,
                        const std::type_identity_t<T>* out = nullptr) {
  cuda_detail::check_attention_shape("attention_backward", B, T_, C, NH);
  attention_backward(cuda{}, dqkv, dout, qkv, att, out, attention_shape::multi_head(B, T_, C, NH));
}

}  // namespace strata::kernels
