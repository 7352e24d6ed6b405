// strata/kernels/host/attention.hpp - causal self-attention between the QKV projection and the
// output projection: multi-head, grouped-query and multi-query (kernels/attention_shape.hpp).
//
//   qkv  [B, T, (H + 2·KV)·d]  per token the H query heads, then the KV key heads, then the KV
//        value heads; query head h reads key/value head h / (H / KV), never a repeated copy
//   out  [B, T, H·d]           out[b, t, h] = sum_{t2 <= t} P[t, t2] v[b, t2, h / group]
//   lse  [B, H, T] (acc_t)     max + log(sum exp) of the row's scaled scores, all backward keeps
//
// score[t, t2] = q[t] . k[t2] · scale (scale = attention_shape::softmax_scale()), t2 <= t only,
// and P = exp(score - lse) = softmax(score). Cache-blocked, as flash attention: query rows and
// keys go in blocks of 64, each pair of blocks a few small GEMMs on acc_t copies of the head (K
// and V widened once per head a thread meets, K also transposed, so every product runs along
// unit-stride rows that stay in L1/L2), the causal mask applied only in blocks that reach the
// diagonal, exp by exp_fast in vectorised loops. The forward runs one (b, h, query block) per
// task with an online softmax (running max and sum; the partial output is rescaled when the max
// grows). Backward recomputes P from lse (no T x T state, one 64 x 64 block per thread) and runs
// one (b, key/value head) per task: dP = dO Vᵀ, dS = P (dP - D) · scale with D = rowsum(dO · O),
// dQ = dS K, dK = dSᵀ Q, dV = Pᵀ dO. The task owns the head's dK and dV, summed in acc_t over
// every query head of its group and every query block before one rounding, and the dQ rows of
// its group's query heads: together every element of dqkv, written (never read).
//
// The block GEMMs are register-tiled loops here, not BLAS calls: each element is one chain of
// multiply-adds in a fixed order whatever tile it falls in, so a query row's result depends on
// its own query, position and keys alone (cached_attention.hpp runs the same block code and
// matches the full forward bit for bit), and with every task owning disjoint outputs nothing
// depends on the thread count. In a block on the diagonal, a key later than a row's position
// still enters that row's products, with P = dS = 0: exact zeros while the key's values are
// finite (a non-finite future value would reach earlier rows there as NaN).
//
// Multi-head overloads in GPT-2's terms (B, T, C, NH) are shorthands for
// attention_shape::multi_head (kernels/cuda/attention.cuh has the same ones).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/attention_shape.hpp"
#include "strata/kernels/host/openmp.hpp"
#include "strata/kernels/host/vector_math.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

namespace strata::kernels {

namespace attention_detail {
constexpr int lanes = 8;

// x . y over n elements in acc_t, as 8 interleaved partial sums combined in a fixed tree: the
// compiler vectorises it, and the order is still fixed, whatever the thread count.
template <class A, class X, class Y>
inline A dot(const X* x, const Y* y, std::int64_t n) {
  A part[lanes] = {};
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (int j = 0; j < lanes; ++j) part[j] += convert<A>(x[i + j]) * convert<A>(y[i + j]);
  for (; i < n; ++i) part[0] += convert<A>(x[i]) * convert<A>(y[i]);
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

inline void check_shape(const char* who, const attention_shape& s) {
  STRATA_CHECK(
      s.valid(), who,
      ": need batch, seq >= 0, heads, kv_heads, head_dim > 0 and kv_heads dividing heads, got batch = ", s.batch,
      ", seq = ", s.seq, ", heads = ", s.heads, ", kv_heads = ", s.kv_heads, ", head_dim = ", s.head_dim);
  STRATA_CHECK(std::isfinite(s.scale), who, ": the softmax scale must be finite (0: 1/sqrt(head_dim)), got ", s.scale);
}

// The GPT-2 overloads' shape: C channels in NH heads.
inline attention_shape multi_head_shape(const char* who, std::int64_t B, std::int64_t T, std::int64_t C,
                                        std::int64_t NH) {
  STRATA_CHECK(B >= 0 && T >= 0 && C > 0 && NH > 0, who, ": need B, T >= 0 and C, NH > 0, got B = ", B, ", T = ", T,
               ", C = ", C, ", NH = ", NH);
  STRATA_CHECK(C % NH == 0, who, ": heads = ", NH, " does not divide channels C = ", C);
  return attention_shape::multi_head(B, T, C, NH);
}

// --- Block GEMMs --------------------------------------------------------------------------
// Query rows and keys per block; a micro-tile is tile_rows rows by up to max_vecs vectors of
// 64 bytes (4 x 64 floats: 16 AVX-512 accumulators). Every scratch matrix has its rows padded
// to whole vectors (and to whole tiles), so no tile has a ragged edge.
constexpr std::int64_t block = 64;
constexpr int tile_rows = 4, max_vecs = 4;

template <class A>
struct simd;
template <>
struct simd<float> {
  typedef float type __attribute__((vector_size(64)));
};
template <>
struct simd<double> {
  typedef double type __attribute__((vector_size(64)));
};
template <class A>
using vec = typename simd<A>::type;
template <class A>
constexpr std::int64_t width = std::int64_t(64 / sizeof(A));  // lanes of a vec

inline std::int64_t round_up(std::int64_t n, std::int64_t m) { return (n + m - 1) / m * m; }

// Loads and stores by reference: a vec passed or returned by value would change the ABI in a
// build without AVX-512 (-Wpsabi).
template <class A>
inline void load(vec<A>& v, const A* p) {
  std::memcpy(&v, p, sizeof v);
}
template <class A>
inline void store(A* p, const vec<A>& v) {
  std::memcpy(p, &v, sizeof v);
}

// c[r, :NV vecs] = (Accumulate ? c : 0) + sum_{k < K} a[r·a_r + k·a_k] · b[k·ldb + :], then
// times alpha unless accumulating. Each element is one multiply-add chain in k order.
template <int NV, bool Accumulate, class A>
inline void tile(A* c, std::int64_t ldc, const A* a, std::int64_t a_r, std::int64_t a_k, const A* b, std::int64_t ldb,
                 std::int64_t K, A alpha) {
  constexpr std::int64_t L = width<A>;
  vec<A> acc[tile_rows][NV];
  for (int r = 0; r < tile_rows; ++r)
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = vec<A>{};
      if (Accumulate) load(acc[r][v], c + r * ldc + v * L);
    }
  for (std::int64_t k = 0; k < K; ++k) {
    vec<A> bv[NV];
    for (int v = 0; v < NV; ++v) load(bv[v], b + k * ldb + v * L);
    for (int r = 0; r < tile_rows; ++r) {
      const A ar = a[r * a_r + k * a_k];
      for (int v = 0; v < NV; ++v) acc[r][v] += ar * bv[v];
    }
  }
  for (int r = 0; r < tile_rows; ++r)
    for (int v = 0; v < NV; ++v) {
      if (!Accumulate) acc[r][v] *= alpha;
      store(c + r * ldc + v * L, acc[r][v]);
    }
}

// One row tile (tile_rows rows of c) over n columns (a multiple of width<A>), in column chunks.
template <bool Accumulate, class A>
inline void row_tile(A* c, std::int64_t ldc, const A* a, std::int64_t a_r, std::int64_t a_k, const A* b,
                     std::int64_t ldb, std::int64_t n, std::int64_t K, A alpha) {
  constexpr std::int64_t L = width<A>;
  for (std::int64_t j = 0; j < n; j += max_vecs * L) {
    const std::int64_t nv = std::min<std::int64_t>(max_vecs, (n - j) / L);
    switch (nv) {
      case 4: tile<4, Accumulate>(c + j, ldc, a, a_r, a_k, b + j, ldb, K, alpha); break;
      case 3: tile<3, Accumulate>(c + j, ldc, a, a_r, a_k, b + j, ldb, K, alpha); break;
      case 2: tile<2, Accumulate>(c + j, ldc, a, a_r, a_k, b + j, ldb, K, alpha); break;
      default: tile<1, Accumulate>(c + j, ldc, a, a_r, a_k, b + j, ldb, K, alpha); break;
    }
  }
}

// Horizontal sum and max of a vec by shuffles that keep it in registers, in the fixed tree of
// halves: lane i meets lane i + W for W = L/2 .. 1. u = v's lanes W .. 2W-1 moved to 0 .. W-1.
// Each compiler's own builtin: clang has only __builtin_shufflevector, and nvcc's front end only
// GCC's __builtin_shuffle.
template <std::int64_t W, class A, std::size_t... I>
inline void upper_half(vec<A>& u, const vec<A>& v, std::index_sequence<I...>) {
#if defined(__clang__)
  u = __builtin_shufflevector(v, v, static_cast<int>(I % W + W)...);
#else
  // Lane indices as wide as A (__builtin_shuffle's rule); a constant mask becomes one shuffle.
  using index = std::conditional_t<sizeof(A) == 4, std::int32_t, std::int64_t>;
  typedef index mask __attribute__((vector_size(64)));
  const mask m = {static_cast<index>(I % W + W)...};
  u = __builtin_shuffle(v, m);
#endif
}

template <class A>
inline A horizontal_sum(const vec<A>& x) {
  constexpr auto lanes = std::make_index_sequence<std::size_t(width<A>)>{};
  vec<A> v = x, u;
  if constexpr (width<A> >= 16) upper_half<8, A>(u, v, lanes), v += u;
  upper_half<4, A>(u, v, lanes), v += u;
  upper_half<2, A>(u, v, lanes), v += u;
  upper_half<1, A>(u, v, lanes), v += u;
  return v[0];
}

template <class A>
inline A horizontal_max(const vec<A>& x) {
  constexpr auto lanes = std::make_index_sequence<std::size_t(width<A>)>{};
  vec<A> v = x, u;
  if constexpr (width<A> >= 16) upper_half<8, A>(u, v, lanes), v = u > v ? u : v;
  upper_half<4, A>(u, v, lanes), v = u > v ? u : v;
  upper_half<2, A>(u, v, lanes), v = u > v ? u : v;
  upper_half<1, A>(u, v, lanes), v = u > v ? u : v;
  return v[0];
}

// Keys of block kb that the query at position t sees: t2 in kb .. min(t, kb + nk - 1).
inline std::int64_t seen(std::int64_t t, std::int64_t kb, std::int64_t nk) {
  return std::clamp<std::int64_t>(t - kb + 1, 0, nk);
}

// Asks for one head's row (d values) ahead of its use. A head's rows are a qkv row apart, a
// stride the hardware prefetchers do not follow; loops over rows ask for the row `ahead` on.
constexpr std::int64_t ahead = 16;
template <bool Write = false, class T>
inline void prefetch_row(const T* row, std::int64_t d) {
  for (std::int64_t i = 0; i < d; i += std::int64_t(64 / sizeof(T))) __builtin_prefetch(row + i, Write ? 1 : 0);
}

// --- Per-head scratch ---------------------------------------------------------------------
// 64-byte aligned acc_t storage, one slice per thread.
template <class A>
struct scratch_space {
  std::vector<A> storage;
  std::size_t per_thread;
  scratch_space(int threads, std::size_t n) : per_thread(std::size_t(round_up(std::int64_t(n), width<A>))) {
    storage.resize(std::size_t(threads) * per_thread + std::size_t(width<A>));
  }
  A* slice(int thread) {
    auto addr = reinterpret_cast<std::uintptr_t>(storage.data());
    A* base = storage.data() + (64 - addr % 64) % 64 / sizeof(A);
    return base + std::size_t(thread) * per_thread;
  }
};

// Keys 0 .. len-1 of one head (row stride ld) in acc_t: kt [d rows, lp] transposed, and when
// asked v [lp rows, dp] and k [lp rows, dp] row-major; the padding columns are zero.
template <class A, class T>
void load_head(A* kt, A* k, A* v, const T* k_src, const T* v_src, std::int64_t ld, std::int64_t len, std::int64_t d,
               std::int64_t dp, std::int64_t lp) {
  for (std::int64_t t0 = 0; t0 < len; t0 += 16) {  // 16 source rows at a time, which stay in L1
    const std::int64_t n = std::min<std::int64_t>(16, len - t0);
    for (std::int64_t t = t0 + ahead; t < std::min(len, t0 + ahead + 16); ++t) prefetch_row(k_src + t * ld, d);
    for (std::int64_t i = 0; i < d; ++i)
      for (std::int64_t t = 0; t < n; ++t) kt[i * lp + t0 + t] = convert<A>(k_src[(t0 + t) * ld + i]);
  }
  for (std::int64_t i = 0; i < d; ++i)
    for (std::int64_t t = len; t < lp; ++t) kt[i * lp + t] = A(0);
  if (k)
    for (std::int64_t t = 0; t < len; ++t) {
      for (std::int64_t i = 0; i < d; ++i) k[t * dp + i] = convert<A>(k_src[t * ld + i]);
      for (std::int64_t i = d; i < dp; ++i) k[t * dp + i] = A(0);
    }
  if (v)
    for (std::int64_t t = 0; t < len; ++t) {
      if (t + ahead < len) prefetch_row(v_src + (t + ahead) * ld, d);
      for (std::int64_t i = 0; i < d; ++i) v[t * dp + i] = convert<A>(v_src[t * ld + i]);
      for (std::int64_t i = d; i < dp; ++i) v[t * dp + i] = A(0);
    }
}

// Rows of a [rows, dp] block in acc_t from src (row stride ld), rows n .. round_up(n, tile_rows)
// and the padding columns zero.
template <class A, class T>
void load_rows(A* dst, const T* src, std::int64_t ld, std::int64_t n, std::int64_t d, std::int64_t dp) {
  for (std::int64_t r = 0; r < n; ++r) {
    if (r + ahead < n) prefetch_row(src + (r + ahead) * ld, d);
    for (std::int64_t i = 0; i < d; ++i) dst[r * dp + i] = convert<A>(src[r * ld + i]);
    for (std::int64_t i = d; i < dp; ++i) dst[r * dp + i] = A(0);
  }
  for (std::int64_t r = n; r < round_up(n, tile_rows); ++r)
    for (std::int64_t i = 0; i < dp; ++i) dst[r * dp + i] = A(0);
}

// --- Forward ------------------------------------------------------------------------------
// Scratch of forward_rows: the query block q, scores then probabilities s, output accumulator o,
// running max mx and sum l, and the block's row maxima bm.
template <class A>
struct forward_block_scratch {
  static std::size_t size(std::int64_t dp) { return std::size_t(3 * block * dp + block * block + 3 * block); }
  A *q, *s, *o, *mx, *l, *bm;
  forward_block_scratch(A* p, std::int64_t dp)
      : q(p), s(q + block * dp), o(s + block * block), mx(o + block * dp), l(mx + block), bm(l + block) {}
};

// Query rows at positions t0 .. t0+m-1 (m <= block, in f.q as load_rows left them) against keys
// 0 .. len-1 of kt and v (load_head; len >= t0 + m): leaves each row's unnormalised output in
// f.o, its max in f.mx and its sum of exponentials in f.l. Key blocks start at multiples of
// block whatever t0 is, and each row's numbers depend on its own query and position only.
template <class A>
void forward_rows(forward_block_scratch<A>& f, std::int64_t t0, std::int64_t m, const A* kt, const A* v,
                  std::int64_t len, std::int64_t d, std::int64_t dp, std::int64_t lp, A scale) {
  constexpr std::int64_t L = width<A>;
  const std::int64_t mp = round_up(m, tile_rows);
  for (std::int64_t r = 0; r < mp; ++r) f.mx[r] = -INFINITY, f.l[r] = 0;
  for (std::int64_t i = 0; i < mp * dp; ++i) f.o[i] = 0;
  for (std::int64_t kb = 0; kb < t0 + m; kb += block) {
    const std::int64_t nk = std::min(block, len - kb);
    // S = Q K_blkᵀ · scale, over the keys some row of each tile sees.
    for (std::int64_t i = 0; i < mp; i += tile_rows) {
      const std::int64_t e = seen(t0 + i + tile_rows - 1, kb, nk);
      if (e > 0) row_tile<false>(f.s + i * block, block, f.q + i * dp, dp, 1, kt + kb, lp, round_up(e, L), d, scale);
    }
    // Online softmax: the keys a row does not see score -inf; the partial output and sum are
    // rescaled by exp(old max - new max) (exactly 1 when the max stays). The per-row scalars
    // (new max, rescale factor, sum) go through loops over the rows, which vectorise.
    for (std::int64_t r = 0; r < mp; ++r) {
      const std::int64_t e = seen(t0 + r, kb, nk);
      A* s = f.s + r * block;
      if (e == 0) {  // a row of a tile that reaches this block, before it: P = 0
        for (std::int64_t j = 0; j < block; ++j) s[j] = 0;
        f.bm[r] = -INFINITY;
        continue;
      }
      if (e < block)
        for (std::int64_t j = 0; j < block; ++j) s[j] = j < e ? s[j] : -INFINITY;
      vec<A> part, x;
      load(part, s);
      for (std::int64_t j = L; j < block; j += L) load(x, s + j), part = x > part ? x : part;
      f.bm[r] = horizontal_max<A>(part);
    }
    for (std::int64_t r = 0; r < mp; ++r) {
      const A mx = f.bm[r] > f.mx[r] ? f.bm[r] : f.mx[r];
      f.bm[r] = exp_fast(f.mx[r] - mx);  // now the rescale factor
      f.mx[r] = mx;
    }
    for (std::int64_t r = 0; r < mp; ++r) {
      A* s = f.s + r * block;
      const A mx = f.mx[r];
      const std::int64_t e = round_up(seen(t0 + r, kb, nk), L);         // whole vectors; P = 0 beyond
      for (std::int64_t j = 0; j < e; ++j) s[j] = exp_fast(s[j] - mx);  // 0 for -inf
      for (std::int64_t j = e; j < block; ++j) s[j] = 0;
      vec<A> sum{}, x;
      for (std::int64_t j = 0; j < e; j += L) load(x, s + j), sum += x;
      f.l[r] = f.l[r] * f.bm[r] + horizontal_sum<A>(sum);
      if (f.bm[r] != A(1))
        for (std::int64_t i = 0; i < dp; ++i) f.o[r * dp + i] *= f.bm[r];
    }
    // O += P V_blk, over the keys the tile's last row sees (the others' P is 0 there).
    for (std::int64_t i = 0; i < mp; i += tile_rows) {
      const std::int64_t e = seen(t0 + i + tile_rows - 1, kb, nk);
      if (e > 0) row_tile<true>(f.o + i * dp, dp, f.s + i * block, block, 1, v + kb * dp, dp, dp, e, A(1));
    }
  }
}

// The forward with the output in O (T, or acc_t when backward recomputes it unrounded); lse may
// be null (only backward's recomputation, which has the caller's lse already).
template <class T, class O>
void forward(O* out, acc_t<T>* lse, const T* qkv, const attention_shape& s) {
  using A = acc_t<T>;
  const std::int64_t B = s.batch, T_ = s.seq, H = s.heads, d = s.head_dim, G = s.group();
  const std::int64_t W = s.row_width(), k_off = s.q_width(), v_off = s.q_width() + s.kv_width();
  const std::int64_t dp = round_up(d, width<A>), lp = round_up(T_, block), blocks = (T_ + block - 1) / block;
  const A scale = A(s.softmax_scale());
  // Per thread: the current key/value head's kt and v (converted once per head a thread meets)
  // and one query block's scratch.
  const int threads = openmp::max_threads();
  scratch_space<A> scratch(threads, std::size_t(2 * lp * dp) + forward_block_scratch<A>::size(dp));
  const std::int64_t tasks = B * H * blocks;

#pragma omp parallel num_threads(threads) if (tasks > 1 && B * H * T_ * T_ * d > 65536)
  {
    A* kt = scratch.slice(openmp::thread_id());
    A* v = kt + lp * dp;
    forward_block_scratch<A> f(v + lp * dp, dp);
    std::int64_t cached = -1;  // b * KV + key/value head held in kt, v
#pragma omp for schedule(static)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t qb = task % blocks, h = (task / blocks) % H, b = task / (blocks * H);
      const std::int64_t kvh = h / G, t0 = qb * block, m = std::min(block, T_ - t0);
      const T* base = qkv + b * T_ * W;
      if (cached != b * s.kv_heads + kvh) {
        cached = b * s.kv_heads + kvh;
        load_head(kt, static_cast<A*>(nullptr), v, base + k_off + kvh * d, base + v_off + kvh * d, W, T_, d, dp, lp);
      }
      load_rows(f.q, base + t0 * W + h * d, W, m, d, dp);
      forward_rows(f, t0, m, kt, v, T_, d, dp, lp, scale);
      for (std::int64_t r = 0; r < m; ++r) {
        const A inv_sum = A(1) / f.l[r];
        O* o = out + (b * T_ + t0 + r) * H * d + h * d;
        for (std::int64_t i = 0; i < d; ++i) o[i] = convert<O>(f.o[r * dp + i] * inv_sum);
        if (lse) lse[(b * H + h) * T_ + t0 + r] = f.mx[r] + std::log(f.l[r]);
      }
    }
  }
}

// --- Backward -----------------------------------------------------------------------------
// A backward task's scratch, carved from one thread's slice: the key/value head's kt and vt
// [d, lp] (transposed), k [lp, dp], its dK and dV sums [lp, dp]; for a query block its q, dout
// and dq sums [block, dp], P and dS [block, block], D and lse [block].
template <class A>
struct backward_block_scratch {
  A *kt, *vt, *k, *dk, *dv, *q, *dy, *dq, *p, *ds, *D, *lse;
  static std::size_t size(std::int64_t lp, std::int64_t dp) {
    return std::size_t(5 * lp * dp + 3 * block * dp + 2 * block * block + 2 * block);
  }
  static backward_block_scratch carve(A* s, std::int64_t lp, std::int64_t dp) {
    backward_block_scratch w;
    w.kt = s, w.vt = w.kt + lp * dp, w.k = w.vt + lp * dp, w.dk = w.k + lp * dp, w.dv = w.dk + lp * dp;
    w.q = w.dv + lp * dp, w.dy = w.q + block * dp, w.dq = w.dy + block * dp;
    w.p = w.dq + block * dp, w.ds = w.p + block * block, w.D = w.ds + block * block, w.lse = w.D + block;
    return w;
  }
};

// What backward's pieces share of the shape: W the row width of qkv, k_off and v_off its key and
// value heads' offsets in a row, dp and lp the head size and sequence padded for the block GEMMs.
template <class A>
struct backward_geometry {
  std::int64_t T_, H, d, W, k_off, v_off, dp, lp;
  A scale;
};

// One pair of blocks, query rows t0 .. t0 + m - 1 against keys kb .. kb + block - 1: P and dS
// recomputed from the block's q, dout, D and lse in w, dQ added to w.dq, dK and dV to the head's.
template <class A>
void backward_key_block(const backward_block_scratch<A>& w, const backward_geometry<A>& g, std::int64_t t0,
                        std::int64_t m, std::int64_t kb) {
  constexpr std::int64_t L = width<A>;
  const std::int64_t d = g.d, dp = g.dp, lp = g.lp, mp = round_up(m, tile_rows);
  const A scale = g.scale;
  A *kt = w.kt, *vt = w.vt, *k = w.k, *dk = w.dk, *dv = w.dv, *q = w.q, *dy = w.dy, *dq = w.dq, *p = w.p, *ds = w.ds,
    *D = w.D, *lse_r = w.lse;
  const std::int64_t nk = std::min(block, g.T_ - kb);
  // S = Q K_blkᵀ · scale then P = exp(S - lse); dP = dO V_blkᵀ.
  for (std::int64_t i = 0; i < mp; i += tile_rows) {
    const std::int64_t e = round_up(seen(t0 + i + tile_rows - 1, kb, nk), L);
    if (e == 0) continue;
    row_tile<false>(p + i * block, block, q + i * dp, dp, 1, kt + kb, lp, e, d, scale);
    row_tile<false>(ds + i * block, block, dy + i * dp, dp, 1, vt + kb, lp, e, d, A(1));
  }
  // dS = P (dP - D) · scale; both 0 where the row does not see the key.
  for (std::int64_t r = 0; r < mp; ++r) {
    const std::int64_t e = seen(t0 + r, kb, nk);
    A* pr = p + r * block;
    A* dsr = ds + r * block;
    const A Lr = lse_r[r], Dr = D[r];
    for (std::int64_t j = 0; j < block; ++j) {
      const A pj = j < e ? exp_fast(pr[j] - Lr) : A(0);
      pr[j] = pj;
      dsr[j] = j < e ? pj * (dsr[j] - Dr) * scale : A(0);
    }
  }
  // dQ += dS K_blk over the keys each tile sees.
  for (std::int64_t i = 0; i < mp; i += tile_rows) {
    const std::int64_t e = seen(t0 + i + tile_rows - 1, kb, nk);
    if (e > 0) row_tile<true>(dq + i * dp, dp, ds + i * block, block, 1, k + kb * dp, dp, dp, e, A(1));
  }
  // dK_blk += dSᵀ Q and dV_blk += Pᵀ dO, over the query rows that see the tile's keys.
  for (std::int64_t j = 0; j < nk; j += tile_rows) {
    const std::int64_t r0 = std::clamp<std::int64_t>(kb + j - t0, 0, mp);
    if (r0 == mp) break;
    row_tile<true>(dk + (kb + j) * dp, dp, ds + r0 * block + j, 1, block, q + r0 * dp, dp, dp, mp - r0, A(1));
    row_tile<true>(dv + (kb + j) * dp, dp, p + r0 * block + j, 1, block, dy + r0 * dp, dp, dp, mp - r0, A(1));
  }
}

// Query block t0 of query head h of sequence b (base, dbase: the sequence's rows of qkv and dqkv)
// against every key block it sees; writes the block's dQ rows.
template <class T, class O, class A>
void backward_query_block(const backward_block_scratch<A>& w, const backward_geometry<A>& g, const T* base, T* dbase,
                          const T* dout, const A* lse, const O* out, std::int64_t b, std::int64_t h, std::int64_t t0) {
  const std::int64_t T_ = g.T_, H = g.H, d = g.d, W = g.W, dp = g.dp;
  A *q = w.q, *dy = w.dy, *dq = w.dq, *D = w.D, *lse_r = w.lse;
  const std::int64_t m = std::min(block, T_ - t0), mp = round_up(m, tile_rows);
  load_rows(q, base + t0 * W + h * d, W, m, d, dp);
  load_rows(dy, dout + (b * T_ + t0) * H * d + h * d, H * d, m, d, dp);
  for (std::int64_t r = 0; r < mp; ++r) {
    const bool row = r < m;  // the tile's padding rows: P = 0 (lse = inf), dout = 0
    D[r] = row ? dot<A>(dy + r * dp, out + (b * T_ + t0 + r) * H * d + h * d, d) : A(0);
    lse_r[r] = row ? lse[(b * H + h) * T_ + t0 + r] : A(INFINITY);
  }
  for (std::int64_t i = 0; i < mp * dp; ++i) dq[i] = 0;

  for (std::int64_t kb = 0; kb < t0 + m; kb += block) backward_key_block(w, g, t0, m, kb);
  for (std::int64_t r = 0; r < m; ++r) {
    if (r + ahead < m) prefetch_row<true>(dbase + (t0 + r + ahead) * W + h * d, d);
    T* dq_out = dbase + (t0 + r) * W + h * d;
    for (std::int64_t i = 0; i < d; ++i) dq_out[i] = convert<T>(dq[r * dp + i]);
  }
}

// The head's dK and dV sums, rounded once, into its rows of dqkv.
template <class T, class A>
void store_head_gradients(T* dbase, const A* dk, const A* dv, const backward_geometry<A>& g, std::int64_t kvh) {
  const std::int64_t T_ = g.T_, d = g.d, W = g.W, dp = g.dp, k_off = g.k_off, v_off = g.v_off;
  for (std::int64_t t2 = 0; t2 < T_; ++t2) {
    if (t2 + ahead < T_) {
      prefetch_row<true>(dbase + (t2 + ahead) * W + k_off + kvh * d, d);
      prefetch_row<true>(dbase + (t2 + ahead) * W + v_off + kvh * d, d);
    }
    T* dk_out = dbase + t2 * W + k_off + kvh * d;
    T* dv_out = dbase + t2 * W + v_off + kvh * d;
    for (std::int64_t i = 0; i < d; ++i) {
      dk_out[i] = convert<T>(dk[t2 * dp + i]);
      dv_out[i] = convert<T>(dv[t2 * dp + i]);
    }
  }
}

// Writes every element of dqkv. For query row t of head h, with P[t2] = exp(score - lse[t]):
//   dP[t2] = dout[t] . v[t2],  D = dout[t] . out[t]  (= sum_t2 P[t2] dP[t2])
//   dS[t2] = P[t2] (dP[t2] - D) · scale
//   dq[t] = sum_t2 dS[t2] k[t2],  dk[t2] = sum over (t, h) of dS[t2] q[t],  dv[t2] = sum of P[t2] dout[t]
template <class T, class O>
void backward(T* dqkv, const T* dout, const T* qkv, const acc_t<T>* lse, const O* out, const attention_shape& s) {
  using A = acc_t<T>;
  constexpr std::int64_t L = width<A>;
  const std::int64_t B = s.batch, T_ = s.seq, H = s.heads, KV = s.kv_heads, d = s.head_dim, G = s.group();
  const std::int64_t W = s.row_width(), k_off = s.q_width(), v_off = s.q_width() + s.kv_width();
  const std::int64_t dp = round_up(d, L), lp = round_up(T_, block);
  const A scale = A(s.softmax_scale());
  const backward_geometry<A> geometry{T_, H, d, W, k_off, v_off, dp, lp, scale};
  const int threads = openmp::max_threads();
  scratch_space<A> scratch(threads, backward_block_scratch<A>::size(lp, dp));
  const std::int64_t tasks = B * KV;

#pragma omp parallel num_threads(threads) if (tasks > 1 && B * H * T_ * T_ * d > 65536)
  {
    const auto w = backward_block_scratch<A>::carve(scratch.slice(openmp::thread_id()), lp, dp);
#pragma omp for schedule(static)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t b = task / KV, kvh = task % KV;
      const T* base = qkv + b * T_ * W;
      T* dbase = dqkv + b * T_ * W;
      load_head(w.kt, w.k, static_cast<A*>(nullptr), base + k_off + kvh * d, base, W, T_, d, dp, lp);
      load_head(w.vt, static_cast<A*>(nullptr), static_cast<A*>(nullptr), base + v_off + kvh * d, base, W, T_, d, dp,
                lp);
      for (std::int64_t i = 0; i < 2 * lp * dp; ++i) w.dk[i] = 0;  // dk and dv

      // Query heads of the group in order, query blocks in order, key blocks in order: every dK,
      // dV and dQ element is summed in an order fixed by the shape.
      for (std::int64_t h = kvh * G; h < (kvh + 1) * G; ++h)
        for (std::int64_t t0 = 0; t0 < T_; t0 += block)
          backward_query_block(w, geometry, base, dbase, dout, lse, out, b, h, t0);
      store_head_gradients(dbase, w.dk, w.dv, geometry, kvh);
    }
  }
}
}  // namespace attention_detail

// out [B, T, heads·head_dim]; lse [B, heads, T], kept for attention_backward.
template <class T>
void attention_forward(host, T* out, acc_t<T>* lse, const T* qkv, const attention_shape& s) {
  attention_detail::check_shape("attention_forward", s);
  attention_detail::forward(out, lse, qkv, s);
}

// Writes dqkv [B, T, row_width], the q, k and v gradients (not read: the input's gradient, as
// docs/architecture.md's "A training step" states for every backward kernel). lse and out are the
// forward's (out gives D = rowsum(dout · out), so nothing of the forward is redone).
template <class T>
void attention_backward(host, T* dqkv, const T* dout, const T* qkv, const acc_t<T>* lse, const T* out,
                        const attention_shape& s) {
  attention_detail::check_shape("attention_backward", s);
  STRATA_CHECK(out != nullptr, "attention_backward: the forward's output is required");
  attention_detail::backward(dqkv, dout, qkv, lse, out, s);
}

// GPT-2's multi-head attention over C channels in NH heads: qkv [B, T, 3C], out [B, T, C],
// att [B, NH, T] (the logsumexp).
template <class T>
void attention_forward(host, T* out, acc_t<T>* att, const T* qkv, std::int64_t B, std::int64_t T_, std::int64_t C,
                       std::int64_t NH) {
  attention_forward(host{}, out, att, qkv, attention_detail::multi_head_shape("attention_forward", B, T_, C, NH));
}

// As above; writes dqkv [B, T, 3C]. out: the forward's output. Without it the
// forward is redone into scratch in acc_t (unrounded, so a bf16 call still rounds its result
// once from the fp32 one), at the cost of one more forward.
template <class T>
void attention_backward(host, T* dqkv, const T* dout, const T* qkv, const acc_t<T>* att, std::int64_t B,
                        std::int64_t T_, std::int64_t C, std::int64_t NH,
                        const std::type_identity_t<T>* out = nullptr) {
  const attention_shape s = attention_detail::multi_head_shape("attention_backward", B, T_, C, NH);
  if (out) {
    attention_detail::backward(dqkv, dout, qkv, att, out, s);
    return;
  }
  std::vector<acc_t<T>> recomputed(std::size_t(B * T_ * C));
  attention_detail::forward(recomputed.data(), static_cast<acc_t<T>*>(nullptr), qkv, s);
  attention_detail::backward(dqkv, dout, qkv, att, recomputed.data(), s);
}

// Compiled once where a program asks (kernels/host/instantiation.hpp); the shape overloads,
// which the (B, T, C, NH) ones call.
#define STRATA_HOST_ATTENTION(type)                                                                                    \
  STRATA_HOST_KERNEL_AS(type,                                                                                          \
                        void attention_forward<type>(host, type*, acc_t<type>*, const type*, const attention_shape&))  \
  STRATA_HOST_KERNEL_AS(type, void attention_backward<type>(host, type*, const type*, const type*, const acc_t<type>*, \
                                                            const type*, const attention_shape&))
STRATA_HOST_ATTENTION(float)
STRATA_HOST_ATTENTION(double)
STRATA_HOST_ATTENTION(bf16)
STRATA_HOST_ATTENTION(fp16)
#undef STRATA_HOST_ATTENTION

}  // namespace strata::kernels
