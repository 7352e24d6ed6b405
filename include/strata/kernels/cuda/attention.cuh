// strata/kernels/cuda/attention.cuh - causal multi-head self-attention on the GPU, tiled so the
// T x T score matrix never reaches global memory (flash-attention style, online softmax).
//
//   qkv  [B, T, 3C]  rows hold q | k | v; head h uses columns h*hs .. (h+1)*hs of each, hs = C/NH
//   out  [B, T, C]   out[b, t, h*hs + i] = sum_t2 softmax_t2(q_t . k_t2 / sqrt(hs)) v[b, t2, h, i]
//   att  [B, NH, T]  (fp32) THE CUDA KERNELS STORE THE PER-ROW LOGSUMEXP HERE, not the
//                    [B, NH, T, T] probabilities of the host kernel: lse = max + log(sum exp).
//                    A caller allocating the host size wastes memory but works; B*NH*T suffice.
//
// Forward (one block per (query tile, batch*head)): Q tile in shared memory; for each key tile
// up to the diagonal, S = Q K^T, then an online softmax per row (running max m and sum l, the
// accumulated O rescaled by exp(m_old - m_new)), then O += P V. out = O / l, lse = m + log l.
//
// Backward (FlashAttention-2's recomputation, made deterministic): D = rowsum(dO * O); then
//   dK/dV kernel: one block per key tile, looping over the query tiles at or below the diagonal:
//                 P = exp(S * scale - lse), dV += P^T dO, dP = dO V^T, dS = P (dP - D) scale,
//                 dK += dS^T Q
//   dQ kernel:    one block per query tile, looping over the key tiles: dQ += dS K
// Each gradient element is owned by one block and summed in tile order: no atomics, so the
// result is bit-identical from run to run. (dS is recomputed in both kernels instead of
// accumulating dQ with float atomics.)
//
// Tensor cores: for bf16/fp16 with hs a multiple of 16, the five tile products use WMMA
// (16x16x16, fp32 accumulate; P and dS rounded to the storage type as their operand, as
// flash-attention does). Otherwise (fp32, odd head sizes) the same kernels run scalar FMAs.
// Tile sizes and shared memory come from gpu::plan_attention (launch_config.hpp).
//
// attention_backward takes the forward's `out` as an optional last argument (the host overload
// takes and ignores it, so a layer makes one call for both): with it D = rowsum(dO * out)
// directly; without it the forward is recomputed into scratch first. How much `att` holds per
// query row on each device is attention_saved_per_row (kernels/cuda/attention_saved.hpp).
#pragma once
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/cuda/attention_saved.hpp"
#include "strata/kernels/cuda/common.cuh"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {

template <class T> struct wmma_elem;
template <> struct wmma_elem<bf16> { using type = __nv_bfloat16; };
template <> struct wmma_elem<fp16> { using type = __half; };

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
__device__ __forceinline__ void load_tile(T* dst, int ld, const T* src, std::int64_t stride, int row0, int rows,
                                          int T_, int hs, bool vec) {
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

// grid (query tiles, B*NH). out [B, T, C], lse [B, NH, T], qkv [B, T, 3C].
template <class T, bool TC>
__global__ void attention_forward_kernel(T* out, float* lse, const T* qkv, int T_, int C, int NH,
                                         attention_geometry g, bool vec) {
  using PT = std::conditional_t<TC, T, float>;  // the P operand
  extern __shared__ __align__(128) unsigned char smem[];
  const int hs = C / NH, br = g.br, bc = g.bc;
  const int bh = int(blockIdx.y), b = bh / NH, h = bh % NH;
  const int q0 = int(blockIdx.x) * br;
  const std::int64_t C3 = 3 * std::int64_t(C);
  const T* base = qkv + std::int64_t(b) * T_ * C3 + std::int64_t(h) * hs;
  T* sQ = reinterpret_cast<T*>(smem + g.layout.q);
  T* sK = reinterpret_cast<T*>(smem + g.layout.k);
  T* sV = reinterpret_cast<T*>(smem + g.layout.v);
  float* sS = reinterpret_cast<float*>(smem + g.layout.s);
  PT* sP = reinterpret_cast<PT*>(smem + g.layout.p);
  float* sO = reinterpret_cast<float*>(smem + g.layout.acc0);
  float* sM = reinterpret_cast<float*>(smem + g.layout.row0);
  float* sL = reinterpret_cast<float*>(smem + g.layout.row1);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32), warps = int(blockDim.x / 32);
  const float scale = 1.0f / sqrtf(float(hs));

  load_tile(sQ, g.ld_t, base, C3, q0, br, T_, hs, vec);
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
    load_tile(sK, g.ld_t, base + C, C3, k0, bc, T_, hs, vec);
    load_tile(sV, g.ld_t, base + 2 * std::int64_t(C), C3, k0, bc, T_, hs, vec);
    __syncthreads();
    block_mm<mm_kind::nt, TC>(sS, g.ld_s, sQ, g.ld_t, sK, g.ld_t, br, bc, hs, false);  // S = Q K^T
    __syncthreads();
    // Online softmax, one warp per row.
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
    __syncthreads();
    block_mm<mm_kind::nn, TC>(sO, g.ld_o, sP, g.ld_p, sV, g.ld_t, br, hs, bc, true);  // O += P V
  }
  __syncthreads();
  for (int idx = int(threadIdx.x); idx < br * hs; idx += int(blockDim.x)) {
    const int r = idx / hs, d = idx % hs, i = q0 + r;
    if (i < T_) out[(std::int64_t(b) * T_ + i) * C + std::int64_t(h) * hs + d] = narrow<T>(sO[r * g.ld_o + d] / sL[r]);
  }
  for (int r = int(threadIdx.x); r < br; r += int(blockDim.x))
    if (q0 + r < T_) lse[std::int64_t(bh) * T_ + q0 + r] = sM[r] + logf(sL[r]);
}

// D[b, h, t] = sum_i dout[b, t, h*hs + i] * out[b, t, h*hs + i]; one warp per (b, h, t).
template <class T>
__global__ void attention_delta_kernel(float* D, const T* dout, const T* out, int B, int T_, int C, int NH) {
  const std::int64_t row = std::int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= std::int64_t(B) * NH * T_) return;
  const int lane = int(threadIdx.x % 32), hs = C / NH;
  const int t = int(row % T_);
  const std::int64_t bh = row / T_;
  const int h = int(bh % NH), b = int(bh / NH);
  const std::int64_t off = (std::int64_t(b) * T_ + t) * C + std::int64_t(h) * hs;
  float s = 0.0f;
  for (int d = lane; d < hs; d += 32) s += widen(dout[off + d]) * widen(out[off + d]);
  s = warp_sum(s);
  if (lane == 0) D[row] = s;  // row = (b*NH + h)*T + t
}

// grid (key tiles, B*NH): dK, dV of one key tile; accumulates (+=) into dqkv.
template <class T, bool TC>
__global__ void attention_backward_kv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D,
                                             int T_, int C, int NH, attention_geometry g, bool vec_qkv, bool vec_dout) {
  using PT = std::conditional_t<TC, T, float>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int hs = C / NH, br = g.br, bc = g.bc;
  const int bh = int(blockIdx.y), b = bh / NH, h = bh % NH;
  const int k0 = int(blockIdx.x) * bc;
  const std::int64_t C3 = 3 * std::int64_t(C);
  const T* base = qkv + std::int64_t(b) * T_ * C3 + std::int64_t(h) * hs;
  const T* dbase = dout + std::int64_t(b) * T_ * C + std::int64_t(h) * hs;
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
  const float scale = 1.0f / sqrtf(float(hs));

  load_tile(sK, g.ld_t, base + C, C3, k0, bc, T_, hs, vec_qkv);
  load_tile(sV, g.ld_t, base + 2 * std::int64_t(C), C3, k0, bc, T_, hs, vec_qkv);
  for (int idx = int(threadIdx.x); idx < bc * g.ld_o; idx += int(blockDim.x)) {
    sdK[idx] = 0.0f;
    sdV[idx] = 0.0f;
  }
  const int q_tiles = (T_ + br - 1) / br;
  for (int qt = k0 / br; qt < q_tiles; ++qt) {
    const int q0 = qt * br;
    __syncthreads();  // the previous tile's Q, dO, P, dS are consumed
    load_tile(sQ, g.ld_t, base, C3, q0, br, T_, hs, vec_qkv);
    load_tile(sdO, g.ld_t, dbase, C, q0, br, T_, hs, vec_dout);
    for (int r = int(threadIdx.x); r < br; r += int(blockDim.x)) {
      const bool ok = q0 + r < T_;
      sLse[r] = ok ? lse[std::int64_t(bh) * T_ + q0 + r] : 0.0f;
      sD[r] = ok ? D[std::int64_t(bh) * T_ + q0 + r] : 0.0f;
    }
    __syncthreads();
    block_mm<mm_kind::nt, TC>(sS, g.ld_s, sQ, g.ld_t, sK, g.ld_t, br, bc, hs, false);  // S = Q K^T
    __syncthreads();
    for (int idx = int(threadIdx.x); idx < br * bc; idx += int(blockDim.x)) {
      const int r = idx / bc, c = idx % bc, i = q0 + r, j = k0 + c;
      const float p = (j <= i && i < T_) ? expf(sS[r * g.ld_s + c] * scale - sLse[r]) : 0.0f;
      sS[r * g.ld_s + c] = p;
      if constexpr (TC) sP[r * g.ld_p + c] = narrow<T>(p);
      else sP[r * g.ld_p + c] = p;
    }
    __syncthreads();
    block_mm<mm_kind::tn, TC>(sdV, g.ld_o, sP, g.ld_p, sdO, g.ld_t, bc, hs, br, true);    // dV += P^T dO
    block_mm<mm_kind::nt, TC>(sdP, g.ld_s, sdO, g.ld_t, sV, g.ld_t, br, bc, hs, false);  // dP = dO V^T
    __syncthreads();
    for (int idx = int(threadIdx.x); idx < br * bc; idx += int(blockDim.x)) {
      const int r = idx / bc, c = idx % bc;
      const float ds = sS[r * g.ld_s + c] * (sdP[r * g.ld_s + c] - sD[r]) * scale;
      if constexpr (TC) sdS[r * g.ld_p + c] = narrow<T>(ds);
      else sdS[r * g.ld_p + c] = ds;
    }
    __syncthreads();
    block_mm<mm_kind::tn, TC>(sdK, g.ld_o, sdS, g.ld_p, sQ, g.ld_t, bc, hs, br, true);  // dK += dS^T Q
  }
  __syncthreads();
  for (int idx = int(threadIdx.x); idx < bc * hs; idx += int(blockDim.x)) {
    const int r = idx / hs, d = idx % hs, j = k0 + r;
    if (j >= T_) continue;
    T* row = dqkv + (std::int64_t(b) * T_ + j) * C3 + std::int64_t(h) * hs + d;
    row[C] = narrow<T>(widen(row[C]) + sdK[r * g.ld_o + d]);
    row[2 * std::int64_t(C)] = narrow<T>(widen(row[2 * std::int64_t(C)]) + sdV[r * g.ld_o + d]);
  }
}

// grid (query tiles, B*NH): dQ of one query tile; accumulates (+=) into dqkv.
template <class T, bool TC>
__global__ void attention_backward_q_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D,
                                            int T_, int C, int NH, attention_geometry g, bool vec_qkv, bool vec_dout) {
  using PT = std::conditional_t<TC, T, float>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int hs = C / NH, br = g.br, bc = g.bc;
  const int bh = int(blockIdx.y), b = bh / NH, h = bh % NH;
  const int q0 = int(blockIdx.x) * br;
  const std::int64_t C3 = 3 * std::int64_t(C);
  const T* base = qkv + std::int64_t(b) * T_ * C3 + std::int64_t(h) * hs;
  const T* dbase = dout + std::int64_t(b) * T_ * C + std::int64_t(h) * hs;
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
  const float scale = 1.0f / sqrtf(float(hs));

  load_tile(sQ, g.ld_t, base, C3, q0, br, T_, hs, vec_qkv);
  load_tile(sdO, g.ld_t, dbase, C, q0, br, T_, hs, vec_dout);
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
    load_tile(sK, g.ld_t, base + C, C3, k0, bc, T_, hs, vec_qkv);
    load_tile(sV, g.ld_t, base + 2 * std::int64_t(C), C3, k0, bc, T_, hs, vec_qkv);
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
    T* q = dqkv + (std::int64_t(b) * T_ + i) * C3 + std::int64_t(h) * hs + d;
    *q = narrow<T>(widen(*q) + sdQ[r * g.ld_o + d]);
  }
}

inline void check_attention_shape(const char* who, std::int64_t B, std::int64_t T_, std::int64_t C, std::int64_t NH) {
  STRATA_CHECK(B >= 0 && T_ >= 0 && C > 0 && NH > 0, who, ": need B, T >= 0 and C, NH > 0, got B = ", B, ", T = ", T_,
               ", C = ", C, ", NH = ", NH);
  STRATA_CHECK(C % NH == 0, who, ": heads = ", NH, " does not divide channels C = ", C);
  STRATA_CHECK(B * NH <= 65535, who, ": B * NH = ", B * NH, " exceeds the grid's 65535 (batch * heads)");
  STRATA_CHECK(3 * C * T_ < (std::int64_t(1) << 31), who, ": T * 3C must stay below 2^31");
}

template <class T>
attention_geometry attention_geometry_for(const gpu::attention_plan& p, gpu::attention_pass pass) {
  const std::size_t pb = p.tensor_cores ? sizeof(T) : sizeof(float);
  return {p.br, p.bc, p.ld_t, p.ld_s, p.ld_p, p.ld_o,
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

template <class T>
bool tile_loads_vectorized(const gpu::attention_plan& p, const T* base, std::int64_t row_stride) {
  return p.tensor_cores && gpu::aligned16(base) && (row_stride * std::int64_t(sizeof(T))) % 16 == 0 &&
         (std::int64_t(p.head_dim) * std::int64_t(sizeof(T))) % 16 == 0 && (p.ld_t * int(sizeof(T))) % 16 == 0;
}

}  // namespace cuda_detail

// out [B, T, C]; att: the logsumexp [B, NH, T] (fp32), see the header comment.
template <class T>
void attention_forward(cuda, T* out, acc_t<T>* att, const T* qkv, std::int64_t B, std::int64_t T_, std::int64_t C,
                       std::int64_t NH) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  cuda_detail::check_attention_shape("attention_forward", B, T_, C, NH);
  if (B == 0 || T_ == 0) return;
  gpu::context& ctx = gpu::this_context();
  const gpu::attention_plan plan = gpu::plan_attention(C / NH, sizeof(T), gpu::tensor_core_storage_v<T>, ctx.smem_optin());
  const cuda_detail::attention_geometry g = cuda_detail::attention_geometry_for<T>(plan, gpu::attention_pass::forward);
  const dim3 grid(unsigned(gpu::ceil_div(T_, plan.br)), unsigned(B * NH));
  const bool vec = cuda_detail::tile_loads_vectorized(plan, qkv, 3 * C);
  cuda_detail::with_tensor_cores<T>(plan, [&](auto tc) {
    constexpr bool TC = decltype(tc)::value;
    auto* kernel = &cuda_detail::attention_forward_kernel<T, TC>;
    gpu::allow_dynamic_smem(kernel, plan.smem_forward);
    kernel<<<grid, plan.threads, plan.smem_forward, ctx.stream()>>>(out, att, qkv, int(T_), int(C), int(NH), g, vec);
  });
  STRATA_CUDA_CHECK_LAUNCH("attention_forward");
}

// Accumulates (+=) into dqkv [B, T, 3C]. att: the forward's logsumexp [B, NH, T]. out: the
// forward's output [B, T, C] when the caller still has it (saves recomputing it); optional.
template <class T>
void attention_backward(cuda, T* dqkv, const T* dout, const T* qkv, const acc_t<T>* att, std::int64_t B,
                        std::int64_t T_, std::int64_t C, std::int64_t NH,
                        const std::type_identity_t<T>* out = nullptr) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  cuda_detail::check_attention_shape("attention_backward", B, T_, C, NH);
  if (B == 0 || T_ == 0) return;
  gpu::context& ctx = gpu::this_context();
  const cudaStream_t stream = ctx.stream();
  const gpu::attention_plan plan = gpu::plan_attention(C / NH, sizeof(T), gpu::tensor_core_storage_v<T>, ctx.smem_optin());

  // D = rowsum(dO * O), with O recomputed when the caller did not pass it.
  gpu::scratch<T> recomputed(out ? 0 : std::size_t(B * T_ * C));
  gpu::scratch<float> recomputed_lse(out ? 0 : std::size_t(B * NH * T_));
  if (!out) {
    attention_forward(cuda{}, recomputed.get(), recomputed_lse.get(), qkv, B, T_, C, NH);
    out = recomputed.get();
  }
  gpu::scratch<float> D(std::size_t(B * NH * T_));
  {
    const auto d = gpu::rows_launch(B * NH * T_);
    cuda_detail::attention_delta_kernel<T><<<d.grid, d.block, 0, stream>>>(D.get(), dout, out, int(B), int(T_), int(C),
                                                                           int(NH));
    STRATA_CUDA_CHECK_LAUNCH("attention_backward (delta)");
  }
  const bool vec_qkv = cuda_detail::tile_loads_vectorized(plan, qkv, 3 * C);
  const bool vec_dout = cuda_detail::tile_loads_vectorized(plan, dout, C);
  const auto gkv = cuda_detail::attention_geometry_for<T>(plan, gpu::attention_pass::backward_kv);
  const auto gq = cuda_detail::attention_geometry_for<T>(plan, gpu::attention_pass::backward_q);
  cuda_detail::with_tensor_cores<T>(plan, [&](auto tc) {
    constexpr bool TC = decltype(tc)::value;
    auto* kv = &cuda_detail::attention_backward_kv_kernel<T, TC>;
    gpu::allow_dynamic_smem(kv, plan.smem_backward_kv);
    kv<<<dim3(unsigned(gpu::ceil_div(T_, plan.bc)), unsigned(B * NH)), plan.threads, plan.smem_backward_kv, stream>>>(
        dqkv, dout, qkv, att, D.get(), int(T_), int(C), int(NH), gkv, vec_qkv, vec_dout);
    STRATA_CUDA_CHECK_LAUNCH("attention_backward (dk, dv)");
    auto* q = &cuda_detail::attention_backward_q_kernel<T, TC>;
    gpu::allow_dynamic_smem(q, plan.smem_backward_q);
    q<<<dim3(unsigned(gpu::ceil_div(T_, plan.br)), unsigned(B * NH)), plan.threads, plan.smem_backward_q, stream>>>(
        dqkv, dout, qkv, att, D.get(), int(T_), int(C), int(NH), gq, vec_qkv, vec_dout);
    STRATA_CUDA_CHECK_LAUNCH("attention_backward (dq)");
  });
}

}  // namespace strata::kernels
