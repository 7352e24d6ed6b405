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
// Loops in acc_t, one row at a time, keys in index order, dot products in vector_math.hpp's fixed
// lanes (what the compiler vectorises); skipped keys cost a comparison.
// Forward runs one (b, query head) per task, backward one (b, key/value head), which owns that
// head's dk and dv and the dq of its group's query heads: every output element is written by one
// task in an order fixed by the shape, so nothing depends on the thread count.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/attention_shape.hpp"
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

// One key/value head of one sequence widened to acc_t: k and v [n, d].
template <class A, class T>
void load_kv_head(A* k, A* v, const T* kv_seq, std::int64_t n, std::int64_t kvh, const attention_shape& s) {
  const std::int64_t d = s.head_dim, ld = 2 * s.kv_width();
  for (std::int64_t j = 0; j < n; ++j) {
    const T* row = kv_seq + j * ld;
    for (std::int64_t i = 0; i < d; ++i) {
      k[j * d + i] = convert<A>(row[kvh * d + i]);
      v[j * d + i] = convert<A>(row[s.kv_width() + kvh * d + i]);
    }
  }
}

// Whether the tasks are worth a team (the serial kernel's threshold).
inline bool parallel_worth(std::int64_t tasks, const attention_shape& s, std::int64_t keys) {
  return tasks > 1 && s.batch * s.heads * s.seq * keys * s.head_dim > 65536;
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
  positioned_detail::check("positioned_attention_forward", s, keys);
  const std::int64_t B = s.batch, m = s.seq, n = keys, H = s.heads, d = s.head_dim, G = s.group();
  const std::int64_t W = s.row_width(), KVW = 2 * s.kv_width(), tasks = B * H;
  const A scale = A(s.softmax_scale());
  // Per thread: the head's k and v [n, d], one query row and its scores [n].
  const std::size_t per_thread = std::size_t(2 * n * d + d + n);
  const int threads = openmp::max_threads();
  std::vector<A> scratch(std::size_t(threads) * per_thread);
  std::int64_t work = 0;

#pragma omp parallel num_threads(threads) if (positioned_detail::parallel_worth(tasks, s, n)) reduction(+ : work)
  {
    A* k = scratch.data() + std::size_t(openmp::thread_id()) * per_thread;
    A* v = k + n * d;
    A* q = v + n * d;
    A* sc = q + d;
#pragma omp for schedule(static)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t b = task / H, h = task % H;
      positioned_detail::load_kv_head(k, v, kv + b * n * KVW, n, h / G, s);
      for (std::int64_t i = 0; i < m; ++i) {
        const T* q_src = qkv + (b * m + i) * W + h * d;
        for (std::int64_t x = 0; x < d; ++x) q[x] = convert<A>(q_src[x]);
        A mx = -INFINITY;
        for (std::int64_t j = 0; j < n; ++j) {
          if (k_pos[j] > q_pos[i]) continue;
          sc[j] = dot_in_lanes<A>(q, k + j * d, d) * scale;
          mx = std::max(mx, sc[j]);
          ++work;
        }
        A* o = out + (b * m + i) * H * d + h * d;
        for (std::int64_t x = 0; x < d; ++x) o[x] = 0;
        A* l = lse + (b * H + h) * m + i;
        if (mx == -INFINITY) {  // nothing visible (or every score -inf): no contribution
          *l = -INFINITY;
          continue;
        }
        A sum = 0;
        for (std::int64_t j = 0; j < n; ++j) {
          if (k_pos[j] > q_pos[i]) continue;
          const A p = exp_fast(sc[j] - mx);
          sum += p;
          for (std::int64_t x = 0; x < d; ++x) o[x] += p * v[j * d + x];
        }
        for (std::int64_t x = 0; x < d; ++x) o[x] /= sum;
        *l = mx + std::log(sum);
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

// Accumulates one block's gradients (see the top of this file); lse and D are the rows' final
// ones. Returns the score entries computed. Rows whose lse is -inf (no visible key anywhere)
// contribute nothing.
template <class T>
std::int64_t positioned_attention_backward(host, acc_t<T>* dq, acc_t<T>* dkv, const T* dout, const acc_t<T>* lse,
                                           const acc_t<T>* D, const T* qkv, const std::int64_t* q_pos, const T* kv,
                                           const std::int64_t* k_pos, std::int64_t keys, const attention_shape& s) {
  using A = acc_t<T>;
  positioned_detail::check("positioned_attention_backward", s, keys);
  const std::int64_t B = s.batch, m = s.seq, n = keys, H = s.heads, KV = s.kv_heads, d = s.head_dim, G = s.group();
  const std::int64_t W = s.row_width(), KVW = 2 * s.kv_width(), tasks = B * KV;
  const A scale = A(s.softmax_scale());
  // Per thread: the head's k and v [n, d], one query row, its dout and its dq sum.
  const std::size_t per_thread = std::size_t(2 * n * d + 3 * d);
  const int threads = openmp::max_threads();
  std::vector<A> scratch(std::size_t(threads) * per_thread);
  std::int64_t work = 0;

#pragma omp parallel num_threads(threads) if (positioned_detail::parallel_worth(tasks, s, n)) reduction(+ : work)
  {
    A* k = scratch.data() + std::size_t(openmp::thread_id()) * per_thread;
    A* v = k + n * d;
    A* q = v + n * d;
    A* dy = q + d;
    A* dq_row = dy + d;
#pragma omp for schedule(static)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t b = task / KV, kvh = task % KV;
      positioned_detail::load_kv_head(k, v, kv + b * n * KVW, n, kvh, s);
      A* dk = dkv + b * n * KVW + kvh * d;  // row j at dk + j * KVW
      A* dv = dk + s.kv_width();
      // Query heads of the group in order, rows in order, keys in order: a fixed summation order.
      for (std::int64_t h = kvh * G; h < (kvh + 1) * G; ++h)
        for (std::int64_t i = 0; i < m; ++i) {
          const A L = lse[(b * H + h) * m + i], Di = D[(b * H + h) * m + i];
          if (L == -INFINITY) continue;
          const T* q_src = qkv + (b * m + i) * W + h * d;
          const T* dy_src = dout + (b * m + i) * H * d + h * d;
          for (std::int64_t x = 0; x < d; ++x) {
            q[x] = convert<A>(q_src[x]);
            dy[x] = convert<A>(dy_src[x]);
            dq_row[x] = 0;
          }
          for (std::int64_t j = 0; j < n; ++j) {
            if (k_pos[j] > q_pos[i]) continue;
            const A p = exp_fast(dot_in_lanes<A>(q, k + j * d, d) * scale - L);
            const A ds = p * (dot_in_lanes<A>(dy, v + j * d, d) - Di) * scale;
            for (std::int64_t x = 0; x < d; ++x) {
              dq_row[x] += ds * k[j * d + x];
              dk[j * KVW + x] += ds * q[x];
              dv[j * KVW + x] += p * dy[x];
            }
            ++work;
          }
          A* dq_out = dq + (b * m + i) * H * d + h * d;
          for (std::int64_t x = 0; x < d; ++x) dq_out[x] += dq_row[x];
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
