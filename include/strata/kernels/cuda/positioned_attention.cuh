// strata/kernels/cuda/positioned_attention.cuh - attention of query rows against a block of
// key/value rows at given absolute positions on the GPU: the CUDA overloads of
// kernels/host/positioned_attention.hpp (context parallelism's building block), with the same
// semantics and argument layouts. Multi-head, grouped-query and multi-query; shape.seq is the
// number of query rows m, `keys` the number of key rows n.
//
//   qkv    [B, m, (H + 2·KV)·d]  (T)  the query rows in the fused layout; only the q part is read
//   kv     [B, n, 2·KV·d]        (T)  per token the KV key heads, then the KV value heads
//   q_pos  [m], k_pos [n]   (int64)  absolute positions, DEVICE arrays, the same for every
//                                     sequence of the batch; key j is visible to query i iff
//                                     k_pos[j] <= q_pos[i]
//   out    [B, m, H·d], lse [B, H, m], dq [B, m, H·d], dkv [B, n, 2·KV·d], D [B, H, m]   (fp32)
//
// Every pointer is a device pointer. Types: float, bf16, fp16 (acc_t is fp32 for all three), as
// the CUDA causal attention; attention_merge works in fp32 only. Head size up to 256.
//
// Forward (grid: ceil(m / 8) x B·H, 8 warps): one warp per query row of one (b, query head). The
// block walks the keys of its key/value head in tiles of 32, widened to fp32 in shared memory with
// their positions; per tile each lane scores one key (q · k in fp32, in index order), invisible
// keys score -inf, and the row's online softmax (running max, running sum, the accumulated output
// rescaled by exp(m_old - m_new)) takes the tile; the lanes own the output columns lane + 32c.
// A tile the warp sees nothing of is skipped (exactly: it would add nothing). Rows that see no
// key get out 0 and lse -inf, as on the host.
//
// Backward (deterministic, no atomics), given the final lse and D = rowsum(dout · out):
//   dK/dV kernel (grid: ceil(n / 32) x B·KV): one block per (key tile, b, key/value head). It
//                walks the rows of the group's query heads, head by head and row by row, 8 rows
//                at a time (a warp computes one row's P = exp(S - lse) and dS = P (dP - D) scale
//                against the tile's 32 keys); each thread then adds the 8 rows, in order, into
//                the dK, dV elements it owns in shared memory. The block adds its tile into dkv
//                once at the end.
//   dQ kernel    (grid as the forward): one warp per query row walks the key tiles, recomputing
//                P and dS, and sums dS k over the keys in index order; added into dq at the end.
// Every element of dq and dkv is owned by one thread of one block and summed in a fixed order -
// the host kernel's order (query heads, rows, keys) - so the result does not change from run to
// run, and the += into dq and dkv is a plain read-modify-write. (dS is recomputed in both kernels
// instead of accumulating dQ with float atomics.)
//
// Work counts (the return values): B · H · (visible (query, key) pairs), as on the host, computed
// ON THE HOST from a copy of q_pos and k_pos: the calling thread waits for the work queued before
// the call on the current stream (what wrote the positions), the one synchronisation here, as
// for the other kernels whose host signature returns a value. The call's own kernels are queued
// before the counting and nobody waits for them. Rows the final lse marks empty see no key in any
// block, so the backward's count equals the host's for finite inputs.
//
// attention_kv_pack, attention_merge (one warp per row, in place) and attention_delta (one warp
// per row, lane-strided products and a fixed butterfly) are plain element-wise or row kernels.
// All run on the current stream (gpu::current_stream()). Scalar fp32 FMAs throughout, no tensor
// cores: correctness first; attention.cuh's WMMA tiles are the model for a faster version.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/attention_shape.hpp"
#include "strata/kernels/cuda/common.cuh"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {

inline constexpr int positioned_warps = 8;  // query rows per block (one warp each)
inline constexpr int positioned_threads = 32 * positioned_warps;
inline constexpr int positioned_tile = 32;       // key rows per tile: one per lane
inline constexpr int positioned_max_head = 256;  // a lane owns up to 8 output columns
inline constexpr int positioned_cols = positioned_max_head / 32;

// The geometry as the kernels use it.
struct positioned_dims {
  std::int64_t m = 0, n = 0;  // query rows, key rows (per sequence)
  int heads = 0, kv_heads = 0, group = 0, hd = 0;
  std::int64_t row = 0;       // qkv's row width (H + 2·KV)·d
  std::int64_t q_width = 0;   // H·d: the row width of out, dout and dq
  std::int64_t kv_row = 0;    // 2·KV·d: the row width of kv and dkv
  std::int64_t kv_width = 0;  // KV·d: where the value heads start in a kv row
  float scale = 0;
};

inline positioned_dims positioned_dims_for(const attention_shape& s, std::int64_t keys) {
  positioned_dims a;
  a.m = s.seq;
  a.n = keys;
  a.heads = int(s.heads);
  a.kv_heads = int(s.kv_heads);
  a.group = int(s.group());
  a.hd = int(s.head_dim);
  a.row = s.row_width();
  a.q_width = s.q_width();
  a.kv_row = 2 * s.kv_width();
  a.kv_width = s.kv_width();
  a.scale = float(s.softmax_scale());
  return a;
}

// Shared memory of a block: the tile's 32 key positions (int64), then fp32 regions at these
// offsets (in floats): the key and value tiles [32][ld], each warp's query row and dout row
// [8][d], each warp's P and dS [8][32], and (dK/dV kernel) the dK and dV accumulators [32][d].
// ld = d rounded up to odd, so lanes scoring different keys read different banks. For d = 64:
// forward 19.5 KiB, dQ 21.5 KiB, dK/dV 38.5 KiB; for d = 256: 73.5, 81.5 and 146.5 KiB (sm_90
// offers 227 KiB; a launcher fails with a message where the device offers less than it needs).
enum class positioned_pass { forward, backward_q, backward_kv };

struct positioned_layout {
  int ld = 0;
  int k = 0, v = 0, q = 0, dout = 0, p = 0, ds = 0, dk = 0, dv = 0;
  std::size_t bytes = 0;
};

inline positioned_layout positioned_layout_for(positioned_pass pass, int hd) {
  positioned_layout L;
  L.ld = hd | 1;
  int off = 0;
  auto take = [&off](int floats) {
    const int at = off;
    off += floats;
    return at;
  };
  L.k = take(positioned_tile * L.ld);
  L.v = take(positioned_tile * L.ld);
  L.q = take(positioned_warps * hd);
  if (pass != positioned_pass::forward) L.dout = take(positioned_warps * hd);
  L.p = take(positioned_warps * positioned_tile);
  if (pass == positioned_pass::backward_kv) {
    L.ds = take(positioned_warps * positioned_tile);
    L.dk = take(positioned_tile * hd);
    L.dv = take(positioned_tile * hd);
  }
  L.bytes = positioned_tile * sizeof(std::int64_t) + std::size_t(off) * sizeof(float);
  return L;
}

// x · y in fp32, in index order.
__device__ __forceinline__ float positioned_dot(const float* x, const float* y, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s = fmaf(x[i], y[i], s);
  return s;
}

// One row of d elements widened into shared memory by the lanes of a warp.
template <class T>
__device__ __forceinline__ void positioned_load_row(float* dst, const T* src, int hd, int lane) {
  for (int x = lane; x < hd; x += 32) dst[x] = widen(src[x]);
}

// The key tile k0 .. k0 + 32 of key/value head kvh of one sequence's kv rows, widened: sK, sV
// [32][ld], sPos its positions; rows past n are zeros. Returns the number of real rows.
template <class T>
__device__ __forceinline__ int positioned_load_keys(std::int64_t* sPos, float* sK, float* sV, int ld, const T* kv_seq,
                                                    const std::int64_t* k_pos, std::int64_t k0, int kvh,
                                                    const positioned_dims& a) {
  const int hd = a.hd;
  const int valid = a.n - k0 < positioned_tile ? int(a.n - k0) : positioned_tile;
  for (int idx = int(threadIdx.x); idx < positioned_tile * hd; idx += int(blockDim.x)) {
    const int r = idx / hd, x = idx % hd;
    float kk = 0.0f, vv = 0.0f;
    if (r < valid) {
      const T* src = kv_seq + (k0 + r) * a.kv_row + std::int64_t(kvh) * hd + x;
      kk = widen(src[0]);
      vv = widen(src[a.kv_width]);
    }
    sK[r * ld + x] = kk;
    sV[r * ld + x] = vv;
  }
  for (int r = int(threadIdx.x); r < positioned_tile; r += int(blockDim.x)) sPos[r] = r < valid ? k_pos[k0 + r] : 0;
  return valid;
}

// grid (ceil(m / 8), B·H), positioned_threads threads: out and lse written whole.
template <class T>
__global__ void __launch_bounds__(positioned_threads)
    positioned_forward_kernel(float* out, float* lse, const T* qkv, const std::int64_t* q_pos, const T* kv,
                              const std::int64_t* k_pos, positioned_dims a, positioned_layout L) {
  extern __shared__ __align__(128) unsigned char smem[];
  std::int64_t* sPos = reinterpret_cast<std::int64_t*>(smem);
  float* base = reinterpret_cast<float*>(sPos + positioned_tile);
  float* sK = base + L.k;
  float* sV = base + L.v;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, hd = a.hd, ld = L.ld;
  float* sQ = base + L.q + warp * hd;
  float* sP = base + L.p + warp * positioned_tile;
  const int bh = int(blockIdx.y), h = bh % a.heads, kvh = h / a.group;
  const std::int64_t b = bh / a.heads;
  const std::int64_t i = std::int64_t(blockIdx.x) * positioned_warps + warp;  // this warp's query row
  const bool active = i < a.m;
  const std::int64_t qp = active ? q_pos[i] : 0;
  if (active) positioned_load_row(sQ, qkv + (b * a.m + i) * a.row + std::int64_t(h) * hd, hd, lane);
  __syncwarp();

  float o[positioned_cols];
#pragma unroll
  for (int c = 0; c < positioned_cols; ++c) o[c] = 0.0f;
  float m_run = -INFINITY, l_run = 0.0f;
  const T* kv_seq = kv + b * a.n * a.kv_row;
  for (std::int64_t k0 = 0; k0 < a.n; k0 += positioned_tile) {
    __syncthreads();  // the previous tile is consumed
    const int valid = positioned_load_keys(sPos, sK, sV, ld, kv_seq, k_pos, k0, kvh, a);
    __syncthreads();
    if (!active) continue;
    const bool vis = lane < valid && sPos[lane] <= qp;
    if (!__any_sync(0xffffffffu, vis)) continue;  // nothing visible: the tile changes nothing
    const float s = vis ? positioned_dot(sQ, sK + lane * ld, hd) * a.scale : -INFINITY;
    const float m_new = fmaxf(m_run, warp_max(s));
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no finite score yet
    const float p = expf(s - m_use);
    sP[lane] = p;
    const float alpha = expf(m_run - m_use);
    l_run = l_run * alpha + warp_sum(p);
    m_run = m_new;
    __syncwarp();
#pragma unroll
    for (int c = 0; c < positioned_cols; ++c) o[c] *= alpha;
    for (int j = 0; j < valid; ++j) {
      const float pj = sP[j];
      if (pj == 0.0f) continue;  // invisible (or underflowed): adds nothing
#pragma unroll
      for (int c = 0; c < positioned_cols; ++c) {
        const int x = lane + 32 * c;
        if (x < hd) o[c] = fmaf(pj, sV[j * ld + x], o[c]);
      }
    }
  }
  if (!active) return;
  const bool empty = m_run == -INFINITY;
  float* dst = out + (b * a.m + i) * a.q_width + std::int64_t(h) * hd;
#pragma unroll
  for (int c = 0; c < positioned_cols; ++c) {
    const int x = lane + 32 * c;
    if (x < hd) dst[x] = empty ? 0.0f : o[c] / l_run;
  }
  if (lane == 0) lse[std::int64_t(bh) * a.m + i] = empty ? -INFINITY : m_run + logf(l_run);
}

// grid (ceil(m / 8), B·H): dq += sum over visible keys of dS k, one warp per query row.
template <class T>
__global__ void __launch_bounds__(positioned_threads)
    positioned_backward_q_kernel(float* dq, const T* dout, const float* lse, const float* D, const T* qkv,
                                 const std::int64_t* q_pos, const T* kv, const std::int64_t* k_pos, positioned_dims a,
                                 positioned_layout L) {
  extern __shared__ __align__(128) unsigned char smem[];
  std::int64_t* sPos = reinterpret_cast<std::int64_t*>(smem);
  float* base = reinterpret_cast<float*>(sPos + positioned_tile);
  float* sK = base + L.k;
  float* sV = base + L.v;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, hd = a.hd, ld = L.ld;
  float* sQ = base + L.q + warp * hd;
  float* sDO = base + L.dout + warp * hd;
  float* sDS = base + L.p + warp * positioned_tile;
  const int bh = int(blockIdx.y), h = bh % a.heads, kvh = h / a.group;
  const std::int64_t b = bh / a.heads;
  const std::int64_t i = std::int64_t(blockIdx.x) * positioned_warps + warp;
  const float row_lse = i < a.m ? lse[std::int64_t(bh) * a.m + i] : -INFINITY;
  const bool active = row_lse != -INFINITY;  // a row that sees nothing anywhere contributes nothing
  const float row_d = active ? D[std::int64_t(bh) * a.m + i] : 0.0f;
  const std::int64_t qp = active ? q_pos[i] : 0;
  if (active) {
    positioned_load_row(sQ, qkv + (b * a.m + i) * a.row + std::int64_t(h) * hd, hd, lane);
    positioned_load_row(sDO, dout + (b * a.m + i) * a.q_width + std::int64_t(h) * hd, hd, lane);
  }
  __syncwarp();

  float g[positioned_cols];
#pragma unroll
  for (int c = 0; c < positioned_cols; ++c) g[c] = 0.0f;
  const T* kv_seq = kv + b * a.n * a.kv_row;
  for (std::int64_t k0 = 0; k0 < a.n; k0 += positioned_tile) {
    __syncthreads();
    const int valid = positioned_load_keys(sPos, sK, sV, ld, kv_seq, k_pos, k0, kvh, a);
    __syncthreads();
    if (!active) continue;
    const bool vis = lane < valid && sPos[lane] <= qp;
    if (!__any_sync(0xffffffffu, vis)) continue;
    float ds = 0.0f;
    if (vis) {
      const float p = expf(positioned_dot(sQ, sK + lane * ld, hd) * a.scale - row_lse);
      ds = p * (positioned_dot(sDO, sV + lane * ld, hd) - row_d) * a.scale;
    }
    sDS[lane] = ds;
    __syncwarp();
    for (int j = 0; j < valid; ++j) {
      const float dsj = sDS[j];
      if (dsj == 0.0f) continue;
#pragma unroll
      for (int c = 0; c < positioned_cols; ++c) {
        const int x = lane + 32 * c;
        if (x < hd) g[c] = fmaf(dsj, sK[j * ld + x], g[c]);
      }
    }
    __syncwarp();  // sDS is rewritten by the next tile
  }
  if (!active) return;
  float* dst = dq + (b * a.m + i) * a.q_width + std::int64_t(h) * hd;
#pragma unroll
  for (int c = 0; c < positioned_cols; ++c) {
    const int x = lane + 32 * c;
    if (x < hd) dst[x] += g[c];
  }
}

// grid (ceil(n / 32), B·KV): dk += sum dS q, dv += sum P dout over the group's query rows, for
// one key tile of one key/value head.
template <class T>
__global__ void __launch_bounds__(positioned_threads)
    positioned_backward_kv_kernel(float* dkv, const T* dout, const float* lse, const float* D, const T* qkv,
                                  const std::int64_t* q_pos, const T* kv, const std::int64_t* k_pos, positioned_dims a,
                                  positioned_layout L) {
  extern __shared__ __align__(128) unsigned char smem[];
  std::int64_t* sPos = reinterpret_cast<std::int64_t*>(smem);
  float* base = reinterpret_cast<float*>(sPos + positioned_tile);
  float* sK = base + L.k;
  float* sV = base + L.v;
  float* sQ = base + L.q;      // [8][d]: warp w's query row at w·d
  float* sDO = base + L.dout;  // [8][d]
  float* sP = base + L.p;      // [8][32]
  float* sDS = base + L.ds;    // [8][32]
  float* sdK = base + L.dk;    // [32][d]
  float* sdV = base + L.dv;    // [32][d]
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, hd = a.hd, ld = L.ld;
  const int bk = int(blockIdx.y), kvh = bk % a.kv_heads;
  const std::int64_t b = bk / a.kv_heads;
  const std::int64_t k0 = std::int64_t(blockIdx.x) * positioned_tile;

  const int valid = positioned_load_keys(sPos, sK, sV, ld, kv + b * a.n * a.kv_row, k_pos, k0, kvh, a);
  for (int e = int(threadIdx.x); e < positioned_tile * hd; e += int(blockDim.x)) {
    sdK[e] = 0.0f;
    sdV[e] = 0.0f;
  }
  // Rows r = 0 .. G·m - 1: query head kvh·G + r / m, row r % m (the host kernel's order).
  const std::int64_t rows = std::int64_t(a.group) * a.m;
  for (std::int64_t r0 = 0; r0 < rows; r0 += positioned_warps) {
    __syncthreads();  // the previous rows are consumed (and, first, the tile is loaded)
    const std::int64_t r = r0 + warp;
    float p = 0.0f, ds = 0.0f;
    bool vis = false;
    if (r < rows) {
      const int h = kvh * a.group + int(r / a.m);
      const std::int64_t i = r % a.m, at = (b * a.heads + h) * a.m + i;
      const float row_lse = lse[at];
      if (row_lse != -INFINITY) {
        positioned_load_row(sQ + warp * hd, qkv + (b * a.m + i) * a.row + std::int64_t(h) * hd, hd, lane);
        positioned_load_row(sDO + warp * hd, dout + (b * a.m + i) * a.q_width + std::int64_t(h) * hd, hd, lane);
        __syncwarp();
        vis = lane < valid && sPos[lane] <= q_pos[i];
        if (vis) {
          p = expf(positioned_dot(sQ + warp * hd, sK + lane * ld, hd) * a.scale - row_lse);
          ds = p * (positioned_dot(sDO + warp * hd, sV + lane * ld, hd) - D[at]) * a.scale;
        }
      }
    }
    sP[warp * positioned_tile + lane] = p;
    sDS[warp * positioned_tile + lane] = ds;
    if (!__syncthreads_or(vis)) continue;  // none of the 8 rows sees the tile
    // Each thread owns elements e = (key j, column x) of dK and dV and adds the 8 rows in order;
    // a zero P or dS (an invisible key, a skipped row) adds nothing and is not added.
    for (int e = int(threadIdx.x); e < valid * hd; e += int(blockDim.x)) {
      const int j = e / hd, x = e % hd;
      float dk = sdK[e], dv = sdV[e];
#pragma unroll
      for (int w = 0; w < positioned_warps; ++w) {
        const float pw = sP[w * positioned_tile + j], dsw = sDS[w * positioned_tile + j];
        if (dsw != 0.0f) dk = fmaf(dsw, sQ[w * hd + x], dk);
        if (pw != 0.0f) dv = fmaf(pw, sDO[w * hd + x], dv);
      }
      sdK[e] = dk;
      sdV[e] = dv;
    }
  }
  __syncthreads();
  for (int e = int(threadIdx.x); e < valid * hd; e += int(blockDim.x)) {
    const int j = e / hd, x = e % hd;
    float* dst = dkv + (b * a.n + k0 + j) * a.kv_row + std::int64_t(kvh) * hd + x;
    dst[0] += sdK[e];
    dst[a.kv_width] += sdV[e];
  }
}

// kv [B·m, 2·KV·d] = the key/value part of qkv [B·m, row]; grid-stride.
template <class T>
__global__ void attention_kv_pack_kernel(T* kv, const T* qkv, std::int64_t total, std::int64_t kv_row, std::int64_t row,
                                         std::int64_t q_width) {
  for (std::int64_t idx = thread_index(); idx < total; idx += grid_stride()) {
    const std::int64_t r = idx / kv_row, j = idx % kv_row;
    kv[idx] = qkv[r * row + q_width + j];
  }
}

// One warp per row (b, h, i) = row index (b·H + h)·m + i: out and lse updated in place.
template <class A>
__global__ void attention_merge_kernel(A* out, A* lse, const A* part_out, const A* part_lse, std::int64_t rows,
                                       std::int64_t m, int heads, int hd) {
  const std::int64_t row = std::int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const A l2 = part_lse[row];
  if (l2 == -INFINITY) return;  // the block gave this row nothing
  const int lane = int(threadIdx.x % 32);
  const A l1 = lse[row];
  const std::int64_t i = row % m, bh = row / m, h = bh % heads, b = bh / heads;
  const std::int64_t off = (b * m + i) * std::int64_t(heads) * hd + h * hd;
  const A mx = fmaxf(l1, l2);
  const A w1 = expf(l1 - mx), w2 = expf(l2 - mx);  // w1 = 0 for the first block
  const A sum = w1 + w2;
  for (int x = lane; x < hd; x += 32) out[off + x] = (out[off + x] * w1 + part_out[off + x] * w2) / sum;
  __syncwarp();  // every lane has read lse[row]
  if (lane == 0) lse[row] = mx + logf(sum);
}

// D[(b·H + h)·m + i] = sum_x dout · out over the row's head; one warp per row.
template <class T>
__global__ void positioned_delta_kernel(float* D, const T* dout, const T* out, std::int64_t rows, std::int64_t m,
                                        int heads, int hd, std::int64_t q_width) {
  const std::int64_t row = std::int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = int(threadIdx.x % 32);
  const std::int64_t i = row % m, bh = row / m, h = bh % heads, b = bh / heads;
  const std::int64_t off = (b * m + i) * q_width + h * hd;
  float s = 0.0f;
  for (int x = lane; x < hd; x += 32) s = fmaf(widen(dout[off + x]), widen(out[off + x]), s);
  s = warp_sum(s);
  if (lane == 0) D[row] = s;
}

// The shape (every launcher); `tiled`: also the limits of the attention kernels proper.
inline void positioned_check(const char* who, const attention_shape& s, std::int64_t keys, bool tiled) {
  STRATA_CHECK(s.valid() && keys >= 0, who,
               ": need batch, seq, keys >= 0, heads, kv_heads, head_dim > 0 and kv_heads dividing heads, got batch = ",
               s.batch, ", seq = ", s.seq, ", keys = ", keys, ", heads = ", s.heads, ", kv_heads = ", s.kv_heads,
               ", head_dim = ", s.head_dim);
  STRATA_CHECK(std::isfinite(s.scale), who, ": the softmax scale must be finite (0: 1/sqrt(head_dim)), got ", s.scale);
  if (!tiled) return;
  STRATA_CHECK(s.head_dim <= positioned_max_head, who, " (CUDA): head size ", s.head_dim,
               " is outside the supported 1 .. ", positioned_max_head);
  STRATA_CHECK(s.batch * s.heads <= 65535, who, " (CUDA): batch * heads = ", s.batch * s.heads,
               " exceeds the grid's 65535");
}

// Enables the kernel's shared memory, or fails naming what the device offers.
template <class Kernel>
void positioned_allow_smem(const char* who, Kernel* kernel, const positioned_layout& L, gpu::context& ctx) {
  STRATA_CHECK(L.bytes <= ctx.smem_optin(), who, " (CUDA): head size needs ", L.bytes,
               " bytes of shared memory per block; the device offers ", ctx.smem_optin());
  gpu::allow_dynamic_smem(kernel, L.bytes);
}

// The visible (query, key) pairs, counted on the host. The constructor copies the positions
// (waiting for the work queued before it on the stream, which wrote them); count() sorts the
// keys' and adds, per query, how many are <= its position.
class positioned_pairs {
 public:
  positioned_pairs(const std::int64_t* q_pos, std::int64_t m, const std::int64_t* k_pos, std::int64_t n,
                   cudaStream_t stream)
      : q_(std::size_t(m)), k_(std::size_t(n)) {
    if (m == 0 || n == 0) return;
    STRATA_CUDA_CHECK(
        cudaMemcpyAsync(q_.data(), q_pos, q_.size() * sizeof(std::int64_t), cudaMemcpyDeviceToHost, stream));
    STRATA_CUDA_CHECK(
        cudaMemcpyAsync(k_.data(), k_pos, k_.size() * sizeof(std::int64_t), cudaMemcpyDeviceToHost, stream));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  std::int64_t count() {
    std::sort(k_.begin(), k_.end());
    std::int64_t pairs = 0;
    for (const std::int64_t q : q_) pairs += std::upper_bound(k_.begin(), k_.end(), q) - k_.begin();
    return pairs;
  }

 private:
  std::vector<std::int64_t> q_, k_;
};

}  // namespace cuda_detail

// The key/value part of a fused qkv [B, m, (H + 2·KV)·d] packed as kv [B, m, 2·KV·d].
template <class T>
void attention_kv_pack(cuda, T* kv, const T* qkv, const attention_shape& s) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  cuda_detail::positioned_check("attention_kv_pack", s, 0, false);
  const std::int64_t total = s.batch * s.seq * 2 * s.kv_width();
  if (total == 0) return;
  const auto d = gpu::elementwise_launch(total, 1);
  cuda_detail::attention_kv_pack_kernel<T><<<d.grid, d.block, 0, gpu::this_context().stream()>>>(
      kv, qkv, total, 2 * s.kv_width(), s.row_width(), s.q_width());
  STRATA_CUDA_CHECK_LAUNCH("attention_kv_pack");
}

// Partial outputs of one block of keys for m = s.seq query rows (out and lse written whole);
// returns the score entries computed, B·H·(visible pairs), counted on the host (header comment).
// q_pos [m] and k_pos [keys]: device arrays of int64.
template <class T>
std::int64_t positioned_attention_forward(cuda, acc_t<T>* out, acc_t<T>* lse, const T* qkv, const std::int64_t* q_pos,
                                          const T* kv, const std::int64_t* k_pos, std::int64_t keys,
                                          const attention_shape& s) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  constexpr const char* who = "positioned_attention_forward";
  cuda_detail::positioned_check(who, s, keys, true);
  if (s.batch == 0 || s.seq == 0) return 0;
  gpu::context& ctx = gpu::this_context();
  const cudaStream_t stream = ctx.stream();
  cuda_detail::positioned_pairs pairs(q_pos, s.seq, k_pos, keys, stream);
  const auto a = cuda_detail::positioned_dims_for(s, keys);
  const auto L = cuda_detail::positioned_layout_for(cuda_detail::positioned_pass::forward, a.hd);
  auto* kernel = &cuda_detail::positioned_forward_kernel<T>;
  cuda_detail::positioned_allow_smem(who, kernel, L, ctx);
  const dim3 grid(unsigned(gpu::ceil_div(s.seq, cuda_detail::positioned_warps)), unsigned(s.batch * s.heads));
  kernel<<<grid, cuda_detail::positioned_threads, L.bytes, stream>>>(out, lse, qkv, q_pos, kv, k_pos, a, L);
  STRATA_CUDA_CHECK_LAUNCH(who);
  return pairs.count() * s.batch * s.heads;
}

// Folds one block's partial result (part_out, part_lse) into the running one (out, lse) by
// logsumexp, in place; running rows start at out 0, lse -inf. s.seq rows. fp32 only (the
// accumulation type of every CUDA storage type).
template <class A>
void attention_merge(cuda, A* out, A* lse, const A* part_out, const A* part_lse, const attention_shape& s) {
  static_assert(std::is_same_v<A, float>,
                "attention_merge (CUDA) works in fp32, the accumulation type of float, "
                "bf16 and fp16");
  cuda_detail::positioned_check("attention_merge", s, 0, false);
  const std::int64_t rows = s.batch * s.heads * s.seq;
  if (rows == 0) return;
  const auto d = gpu::rows_launch(rows);
  cuda_detail::attention_merge_kernel<A><<<d.grid, d.block, 0, gpu::this_context().stream()>>>(
      out, lse, part_out, part_lse, rows, s.seq, int(s.heads), int(s.head_dim));
  STRATA_CUDA_CHECK_LAUNCH("attention_merge");
}

// D [B, H, m] (fp32) = rowsum(dout · out) per (b, query head, row), out the final output.
template <class T>
void attention_delta(cuda, acc_t<T>* D, const T* dout, const T* out, const attention_shape& s) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  cuda_detail::positioned_check("attention_delta", s, 0, false);
  const std::int64_t rows = s.batch * s.heads * s.seq;
  if (rows == 0) return;
  const auto d = gpu::rows_launch(rows);
  cuda_detail::positioned_delta_kernel<T><<<d.grid, d.block, 0, gpu::this_context().stream()>>>(
      D, dout, out, rows, s.seq, int(s.heads), int(s.head_dim), s.q_width());
  STRATA_CUDA_CHECK_LAUNCH("attention_delta");
}

// Accumulates (+=) one block's gradients into dq [B, m, H·d] and dkv [B, keys, 2·KV·d] (fp32);
// lse and D are the rows' final ones. Returns the score entries computed (host-counted, see the
// header comment). Deterministic: the same bits from run to run.
template <class T>
std::int64_t positioned_attention_backward(cuda, acc_t<T>* dq, acc_t<T>* dkv, const T* dout, const acc_t<T>* lse,
                                           const acc_t<T>* D, const T* qkv, const std::int64_t* q_pos, const T* kv,
                                           const std::int64_t* k_pos, std::int64_t keys, const attention_shape& s) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  constexpr const char* who = "positioned_attention_backward";
  cuda_detail::positioned_check(who, s, keys, true);
  if (s.batch == 0 || s.seq == 0 || keys == 0) return 0;
  gpu::context& ctx = gpu::this_context();
  const cudaStream_t stream = ctx.stream();
  cuda_detail::positioned_pairs pairs(q_pos, s.seq, k_pos, keys, stream);
  const auto a = cuda_detail::positioned_dims_for(s, keys);
  const auto Lkv = cuda_detail::positioned_layout_for(cuda_detail::positioned_pass::backward_kv, a.hd);
  const auto Lq = cuda_detail::positioned_layout_for(cuda_detail::positioned_pass::backward_q, a.hd);
  auto* kv_kernel = &cuda_detail::positioned_backward_kv_kernel<T>;
  auto* q_kernel = &cuda_detail::positioned_backward_q_kernel<T>;
  cuda_detail::positioned_allow_smem(who, kv_kernel, Lkv, ctx);
  cuda_detail::positioned_allow_smem(who, q_kernel, Lq, ctx);
  const dim3 kv_grid(unsigned(gpu::ceil_div(keys, cuda_detail::positioned_tile)), unsigned(s.batch * s.kv_heads));
  kv_kernel<<<kv_grid, cuda_detail::positioned_threads, Lkv.bytes, stream>>>(dkv, dout, lse, D, qkv, q_pos, kv, k_pos,
                                                                             a, Lkv);
  STRATA_CUDA_CHECK_LAUNCH("positioned_attention_backward (dk, dv)");
  const dim3 q_grid(unsigned(gpu::ceil_div(s.seq, cuda_detail::positioned_warps)), unsigned(s.batch * s.heads));
  q_kernel<<<q_grid, cuda_detail::positioned_threads, Lq.bytes, stream>>>(dq, dout, lse, D, qkv, q_pos, kv, k_pos, a,
                                                                          Lq);
  STRATA_CUDA_CHECK_LAUNCH("positioned_attention_backward (dq)");
  return pairs.count() * s.batch * s.heads;
}

}  // namespace strata::kernels
