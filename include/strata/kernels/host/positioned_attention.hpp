// strata/kernels/host/positioned_attention.hpp - attention of query rows against a block of
// key/value rows at given absolute positions, for attention split by tokens over ranks (context
// parallelism, layers/context_attention.hpp), where a rank's rows are not a prefix of the
// sequence and the keys arrive a block at a time. Multi-head, grouped-query and multi-query
// (kernels/attention_shape.hpp); shape.seq is the number of query rows m.
//
//   qkv    [B, m, (H + 2·KV)·d]  the query rows in the fused layout; only the q part is read
//   kv     [B, n, 2·KV·d]        the key rows packed: per token the KV key heads, then the KV
//                                value heads (what travels a ring; attention_kv_pack makes it)
//   q_pos  [m], k_pos [n]        absolute positions, the same for every sequence of the batch;
//                                key j is visible to query i iff k_pos[j] <= q_pos[i]
//
// Forward: per (b, query head h, row i) the block's own softmax over its visible keys,
//   out [B, m, H·d] (acc_t)  sum_j P[i, j] v[j], normalised within the block
//   lse [B, H, m]   (acc_t)  logsumexp of the row's scaled scores; -inf and out 0 when the row
//                            sees no key of the block
// so partial results of several blocks combine exactly by logsumexp (attention_merge).
// Backward, given the FINAL lse of each row over all blocks and D = rowsum(dout · out) of the
// final output (attention_delta): P = exp(S - lse), dS = P (dP - D) · scale with dP = dout · v,
// accumulated (+=, the caller zeroes) into
//   dq  [B, m, H·d]      (acc_t)  sum_j dS[i, j] k[j]
//   dkv [B, n, 2·KV·d]   (acc_t)  dk[j] = sum over (h, i) of dS[i, j] q[i], dv[j] = sum of P[i, j] dout[i]
// Each returns the number of score entries it computed, B · H · (visible (query, key) pairs): the
// attention work, which context parallelism must share out evenly.
//
// The serial kernel's blocks (host/attention.hpp): query rows and keys in blocks of 64, each pair
// of blocks a few register-tiled products on acc_t copies of the head, with visibility by
// position (a key a row does not see scores -inf, P and dS 0) instead of by index; a pair of
// blocks in which no row sees a key is skipped. Forward runs one (b, query head, query block) per task
// with an online softmax over the key blocks; backward one (b, key/value head), which owns that
// head's dK and dV sums and the dQ of its group's query heads: every output element is added to
// by one task in an order fixed by the shape, so nothing depends on the thread count.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/attention_shape.hpp"
#include "strata/kernels/host/attention.hpp"
#include "strata/kernels/host/openmp.hpp"
#include "strata/kernels/host/vector_math.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

namespace strata::kernels {

namespace positioned_detail {

inline void check(const char* who, const attention_shape& s, std::int64_t keys) {
  STRATA_CHECK(s.valid() && keys >= 0, who,
               ": need batch, seq, keys >= 0, heads, kv_heads, head_dim > 0 and kv_heads dividing heads, got batch = ",
               s.batch, ", seq = ", s.seq, ", keys = ", keys, ", heads = ", s.heads, ", kv_heads = ", s.kv_heads,
               ", head_dim = ", s.head_dim);
  STRATA_CHECK(std::isfinite(s.scale), who, ": the softmax scale must be finite (0: 1/sqrt(head_dim)), got ", s.scale);
}

// Whether the tasks are worth a team (the serial kernel's threshold).
inline bool parallel_worth(std::int64_t tasks, const attention_shape& s, std::int64_t keys) {
  return tasks > 1 && s.batch * s.heads * s.seq * keys * s.head_dim > 65536;
}

// Query rows qp[0 .. mb) (positions; in f.q as load_rows left them) against keys 0 .. n-1 of kt
// and v (load_head) at positions kp: leaves each row's unnormalised output in f.o, its max in
// f.mx (-inf: no key visible) and its sum of exponentials in f.l, as the serial kernel's
// forward_rows does with visibility by position instead of by index. Returns the visible pairs.
template <class A>
std::int64_t forward_rows(attention_detail::forward_block_scratch<A>& f, const std::int64_t* qp, std::int64_t mb,
                          const A* kt, const A* v, const std::int64_t* kp, std::int64_t n, std::int64_t d,
                          std::int64_t dp, std::int64_t lp, A scale) {
  using namespace attention_detail;
  constexpr std::int64_t L = width<A>;
  const std::int64_t mp = round_up(mb, tile_rows);
  std::int64_t work = 0;
  for (std::int64_t r = 0; r < mp; ++r) f.mx[r] = -INFINITY, f.l[r] = 0;
  for (std::int64_t i = 0; i < mp * dp; ++i) f.o[i] = 0;
  const std::int64_t last = mb > 0 ? *std::max_element(qp, qp + mb) : -1;  // the latest query position
  for (std::int64_t kb = 0; kb < n; kb += block) {
    const std::int64_t nk = std::min(block, n - kb);
    if (*std::min_element(kp + kb, kp + kb + nk) > last) continue;  // no row sees a key of the block
    for (std::int64_t i = 0; i < mp; i += tile_rows)                // S = Q K_blkᵀ · scale
      row_tile<false>(f.s + i * block, block, f.q + i * dp, dp, 1, kt + kb, lp, round_up(nk, L), d, scale);
    // Keys a row does not see (and the padding rows and columns) score -inf.
    for (std::int64_t r = 0; r < mp; ++r) {
      A* sr = f.s + r * block;
      A bm = -INFINITY;
      for (std::int64_t j = 0; j < block; ++j) {
        const bool seen = r < mb && j < nk && kp[kb + j] <= qp[r];
        sr[j] = seen ? sr[j] : A(-INFINITY);
        work += seen;
        bm = sr[j] > bm ? sr[j] : bm;
      }
      f.bm[r] = bm;
    }
    // Online softmax; a row that has seen nothing yet keeps max -inf, sum 0 and P = 0.
    for (std::int64_t r = 0; r < mp; ++r) {
      const A mx = f.bm[r] > f.mx[r] ? f.bm[r] : f.mx[r];
      f.bm[r] = mx == -INFINITY ? A(1) : exp_fast(f.mx[r] - mx);  // the rescale factor
      f.mx[r] = mx;
    }
    for (std::int64_t r = 0; r < mp; ++r) {
      A* sr = f.s + r * block;
      const A mx = f.mx[r] == -INFINITY ? A(0) : f.mx[r];
      for (std::int64_t j = 0; j < block; ++j) sr[j] = exp_fast(sr[j] - mx);  // 0 for -inf
      vec<A> sum{}, x;
      for (std::int64_t j = 0; j < block; j += L) load(x, sr + j), sum += x;
      f.l[r] = f.l[r] * f.bm[r] + horizontal_sum<A>(sum);
      if (f.bm[r] != A(1))
        for (std::int64_t i = 0; i < dp; ++i) f.o[r * dp + i] *= f.bm[r];
    }
    for (std::int64_t i = 0; i < mp; i += tile_rows)  // O += P V_blk
      row_tile<true>(f.o + i * dp, dp, f.s + i * block, block, 1, v + kb * dp, dp, dp, nk, A(1));
  }
  return work;
}

}  // namespace positioned_detail

// The key/value part of a fused qkv [B, m, (H + 2·KV)·d] packed as kv [B, m, 2·KV·d].
template <class T>
void attention_kv_pack(host, T* kv, const T* qkv, const attention_shape& s) {
  const std::int64_t W = s.row_width(), KVW = 2 * s.kv_width();
  for (std::int64_t r = 0; r < s.batch * s.seq; ++r)
    for (std::int64_t j = 0; j < KVW; ++j) kv[r * KVW + j] = qkv[r * W + s.q_width() + j];
}

// Partial outputs of one block of keys for m = s.seq query rows; returns the score entries
// computed. out and lse are written whole.
template <class T>
std::int64_t positioned_attention_forward(host, acc_t<T>* out, acc_t<T>* lse, const T* qkv, const std::int64_t* q_pos,
                                          const T* kv, const std::int64_t* k_pos, std::int64_t keys,
                                          const attention_shape& s) {
  using A = acc_t<T>;
  using namespace attention_detail;
  positioned_detail::check("positioned_attention_forward", s, keys);
  const std::int64_t B = s.batch, m = s.seq, n = keys, H = s.heads, d = s.head_dim, G = s.group();
  const std::int64_t W = s.row_width(), KVW = 2 * s.kv_width();
  const std::int64_t dp = round_up(d, width<A>), lp = round_up(n, block), blocks = (m + block - 1) / block;
  const A scale = A(s.softmax_scale());
  // Per thread: the current key/value head's kt and v (converted once per head a thread meets)
  // and one query block's scratch.
  const int threads = openmp::max_threads();
  scratch_space<A> scratch(threads, std::size_t(2 * lp * dp) + forward_block_scratch<A>::size(dp));
  const std::int64_t tasks = B * H * blocks;
  std::int64_t work = 0;

#pragma omp parallel num_threads(threads) if (positioned_detail::parallel_worth(tasks, s, n)) reduction(+ : work)
  {
    A* kt = scratch.slice(openmp::thread_id());
    A* v = kt + lp * dp;
    forward_block_scratch<A> f(v + lp * dp, dp);
    std::int64_t cached = -1;  // b * KV + key/value head held in kt, v
#pragma omp for schedule(static)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t qb = task % blocks, h = (task / blocks) % H, b = task / (blocks * H);
      const std::int64_t kvh = h / G, t0 = qb * block, mb = std::min(block, m - t0);
      const T* kv_b = kv + b * n * KVW;
      if (cached != b * s.kv_heads + kvh) {
        cached = b * s.kv_heads + kvh;
        load_head(kt, static_cast<A*>(nullptr), v, kv_b + kvh * d, kv_b + s.kv_width() + kvh * d, KVW, n, d, dp, lp);
      }
      load_rows(f.q, qkv + (b * m + t0) * W + h * d, W, mb, d, dp);
      work += positioned_detail::forward_rows(f, q_pos + t0, mb, kt, v, k_pos, n, d, dp, lp, scale);
      for (std::int64_t r = 0; r < mb; ++r) {
        A* o = out + (b * m + t0 + r) * H * d + h * d;
        A* l = lse + (b * H + h) * m + t0 + r;
        if (f.mx[r] == -INFINITY) {  // nothing visible: no contribution
          for (std::int64_t i = 0; i < d; ++i) o[i] = 0;
          *l = -INFINITY;
          continue;
        }
        const A inv_sum = A(1) / f.l[r];
        for (std::int64_t i = 0; i < d; ++i) o[i] = f.o[r * dp + i] * inv_sum;
        *l = f.mx[r] + std::log(f.l[r]);
      }
    }
  }
  return work;
}

// Folds one block's partial result (part_out, part_lse, as positioned_attention_forward writes
// them) into the running one (out, lse) by logsumexp: both stay normalised, out over all blocks
// so far. Running rows start at out 0, lse -inf. s.seq rows.
template <class A>
void attention_merge(host, A* out, A* lse, const A* part_out, const A* part_lse, const attention_shape& s) {
  static_assert(std::is_floating_point_v<A>, "attention_merge works in the accumulation type");
  const std::int64_t B = s.batch, m = s.seq, H = s.heads, d = s.head_dim, tasks = B * H;
#pragma omp parallel for schedule(static) if (tasks > 1 && B * H * m * d > 65536)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::int64_t b = task / H, h = task % H;
    for (std::int64_t i = 0; i < m; ++i) {
      const A l2 = part_lse[(b * H + h) * m + i];
      if (l2 == -INFINITY) continue;  // the block gave this row nothing
      A& l1 = lse[(b * H + h) * m + i];
      A* o = out + (b * m + i) * H * d + h * d;
      const A* o2 = part_out + (b * m + i) * H * d + h * d;
      const A mx = std::max(l1, l2);
      const A w1 = std::exp(l1 - mx), w2 = std::exp(l2 - mx);  // w1 = 0 for the first block
      const A sum = w1 + w2;
      for (std::int64_t x = 0; x < d; ++x) o[x] = (o[x] * w1 + o2[x] * w2) / sum;
      l1 = mx + std::log(sum);
    }
  }
}

// D [B, H, m] (acc_t) = rowsum(dout · out) per (b, query head, row), out the final output.
template <class T>
void attention_delta(host, acc_t<T>* D, const T* dout, const T* out, const attention_shape& s) {
  using A = acc_t<T>;
  const std::int64_t B = s.batch, m = s.seq, H = s.heads, d = s.head_dim;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < m; ++i) {
        const std::int64_t at = (b * m + i) * H * d + h * d;
        A sum = 0;
        for (std::int64_t x = 0; x < d; ++x) sum += convert<A>(dout[at + x]) * convert<A>(out[at + x]);
        D[(b * H + h) * m + i] = sum;
      }
}

namespace positioned_detail {

// What backward's pieces share of the shape: m query rows and n keys, W the row width of qkv, dp
// and lp the head size and key count padded for the block GEMMs.
template <class A>
struct backward_geometry {
  std::int64_t m, n, H, d, W, dp, lp;
  A scale;
};

// Query rows t0 .. t0 + mp - 1 (padded) against keys kb .. kb + nk - 1: P and dS recomputed where
// a row sees the key by position, dQ added to w.dq, dK and dV to the head's. Returns the score
// entries computed.
template <class A>
std::int64_t backward_key_block(const attention_detail::backward_block_scratch<A>& w, const backward_geometry<A>& g,
                                const std::int64_t* q_pos, const std::int64_t* k_pos, std::int64_t t0, std::int64_t mp,
                                std::int64_t kb, std::int64_t nk) {
  using namespace attention_detail;
  const std::int64_t d = g.d, dp = g.dp, lp = g.lp, ne = round_up(nk, width<A>);
  const A scale = g.scale;
  A *kt = w.kt, *vt = w.vt, *k = w.k, *dk = w.dk, *dv = w.dv, *q = w.q, *dy = w.dy, *dq_blk = w.dq, *p = w.p,
    *ds = w.ds, *D_r = w.D, *lse_r = w.lse;
  std::int64_t work = 0;
  for (std::int64_t i = 0; i < mp; i += tile_rows) {  // S = Q K_blkᵀ · scale; dP = dO V_blkᵀ
    row_tile<false>(p + i * block, block, q + i * dp, dp, 1, kt + kb, lp, ne, d, scale);
    row_tile<false>(ds + i * block, block, dy + i * dp, dp, 1, vt + kb, lp, ne, d, A(1));
  }
  // P = exp(S - lse) and dS = P (dP - D) · scale where the row sees the key, else 0.
  for (std::int64_t r = 0; r < mp; ++r) {
    A* pr = p + r * block;
    A* dsr = ds + r * block;
    const A Lr = lse_r[r], Dr = D_r[r];
    const bool row = Lr != A(INFINITY);
    for (std::int64_t j = 0; j < block; ++j) {
      const bool seen = row && j < nk && k_pos[kb + j] <= q_pos[t0 + r];
      const A pj = seen ? exp_fast(pr[j] - Lr) : A(0);
      pr[j] = pj;
      dsr[j] = seen ? pj * (dsr[j] - Dr) * scale : A(0);
      work += seen;
    }
  }
  for (std::int64_t i = 0; i < mp; i += tile_rows)  // dQ += dS K_blk
    row_tile<true>(dq_blk + i * dp, dp, ds + i * block, block, 1, k + kb * dp, dp, dp, nk, A(1));
  for (std::int64_t j = 0; j < nk; j += tile_rows) {  // dK_blk += dSᵀ Q, dV_blk += Pᵀ dO
    row_tile<true>(dk + (kb + j) * dp, dp, ds + j, 1, block, q, dp, dp, mp, A(1));
    row_tile<true>(dv + (kb + j) * dp, dp, p + j, 1, block, dy, dp, dp, mp, A(1));
  }
  return work;
}

// Query block t0 of query head h of sequence b against every key block any of its rows sees;
// adds the block's dQ rows into dq. Returns the score entries computed.
template <class T, class A>
std::int64_t backward_query_block(const attention_detail::backward_block_scratch<A>& w, const backward_geometry<A>& g,
                                  A* dq, const T* dout, const A* lse, const A* D, const T* qkv,
                                  const std::int64_t* q_pos, const std::int64_t* k_pos, std::int64_t b, std::int64_t h,
                                  std::int64_t t0) {
  using namespace attention_detail;
  const std::int64_t m = g.m, n = g.n, H = g.H, d = g.d, W = g.W, dp = g.dp;
  A *q = w.q, *dy = w.dy, *dq_blk = w.dq, *D_r = w.D, *lse_r = w.lse;
  std::int64_t work = 0;
  const std::int64_t mb = std::min(block, m - t0), mp = round_up(mb, tile_rows);
  load_rows(q, qkv + (b * m + t0) * W + h * d, W, mb, d, dp);
  load_rows(dy, dout + (b * m + t0) * H * d + h * d, H * d, mb, d, dp);
  for (std::int64_t r = 0; r < mp; ++r) {
    // Padding rows, and rows that see no key anywhere (lse -inf), take no part: lse = inf.
    const A L = r < mb ? lse[(b * H + h) * m + t0 + r] : A(-INFINITY);
    lse_r[r] = L == -INFINITY ? A(INFINITY) : L;
    D_r[r] = L == -INFINITY ? A(0) : D[(b * H + h) * m + t0 + r];
  }
  for (std::int64_t i = 0; i < mp * dp; ++i) dq_blk[i] = 0;
  const std::int64_t last = *std::max_element(q_pos + t0, q_pos + t0 + mb);  // the latest query position

  for (std::int64_t kb = 0; kb < n; kb += block) {
    const std::int64_t nk = std::min(block, n - kb);
    if (*std::min_element(k_pos + kb, k_pos + kb + nk) > last) continue;  // no row sees a key of the block
    work += backward_key_block(w, g, q_pos, k_pos, t0, mp, kb, nk);
  }
  for (std::int64_t r = 0; r < mb; ++r) {
    A* dq_out = dq + (b * m + t0 + r) * H * d + h * d;
    for (std::int64_t i = 0; i < d; ++i) dq_out[i] += dq_blk[r * dp + i];
  }
  return work;
}

}  // namespace positioned_detail

// Accumulates one block's gradients (see the top of this file); lse and D are the rows' final
// ones. Returns the score entries computed. Rows whose lse is -inf (no visible key anywhere)
// contribute nothing.
template <class T>
std::int64_t positioned_attention_backward(host, acc_t<T>* dq, acc_t<T>* dkv, const T* dout, const acc_t<T>* lse,
                                           const acc_t<T>* D, const T* qkv, const std::int64_t* q_pos, const T* kv,
                                           const std::int64_t* k_pos, std::int64_t keys, const attention_shape& s) {
  using A = acc_t<T>;
  using namespace attention_detail;
  positioned_detail::check("positioned_attention_backward", s, keys);
  const std::int64_t B = s.batch, m = s.seq, n = keys, H = s.heads, KV = s.kv_heads, d = s.head_dim, G = s.group();
  const std::int64_t W = s.row_width(), KVW = 2 * s.kv_width();
  const std::int64_t dp = round_up(d, width<A>), lp = round_up(n, block);
  const A scale = A(s.softmax_scale());
  const positioned_detail::backward_geometry<A> geometry{m, n, H, d, W, dp, lp, scale};
  const int threads = openmp::max_threads();
  scratch_space<A> scratch(threads, backward_block_scratch<A>::size(lp, dp));
  const std::int64_t tasks = B * KV;
  std::int64_t work = 0;

#pragma omp parallel num_threads(threads) if (positioned_detail::parallel_worth(tasks, s, n)) reduction(+ : work)
  {
    const auto w = backward_block_scratch<A>::carve(scratch.slice(openmp::thread_id()), lp, dp);
#pragma omp for schedule(static)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t b = task / KV, kvh = task % KV;
      const T* kv_b = kv + b * n * KVW;
      load_head(w.kt, w.k, static_cast<A*>(nullptr), kv_b + kvh * d, kv_b, KVW, n, d, dp, lp);
      load_head(w.vt, static_cast<A*>(nullptr), static_cast<A*>(nullptr), kv_b + s.kv_width() + kvh * d, kv_b, KVW, n,
                d, dp, lp);
      for (std::int64_t i = 0; i < 2 * lp * dp; ++i) w.dk[i] = 0;  // dk and dv

      // Query heads of the group in order, query blocks in order, key blocks in order: every sum
      // runs in an order fixed by the shape.
      for (std::int64_t h = kvh * G; h < (kvh + 1) * G; ++h)
        for (std::int64_t t0 = 0; t0 < m; t0 += block)
          work += positioned_detail::backward_query_block(w, geometry, dq, dout, lse, D, qkv, q_pos, k_pos, b, h, t0);
      for (std::int64_t j = 0; j < n; ++j) {
        A* dk_out = dkv + (b * n + j) * KVW + kvh * d;
        A* dv_out = dk_out + s.kv_width();
        for (std::int64_t i = 0; i < d; ++i) {
          dk_out[i] += w.dk[j * dp + i];
          dv_out[i] += w.dv[j * dp + i];
        }
      }
    }
  }
  return work;
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(attention_kv_pack)
STRATA_HOST_KERNEL(positioned_attention_forward)
STRATA_HOST_KERNEL(attention_delta)
STRATA_HOST_KERNEL(positioned_attention_backward)

}  // namespace strata::kernels
