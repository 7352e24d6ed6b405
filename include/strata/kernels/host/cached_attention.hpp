// strata/kernels/host/cached_attention.hpp - causal attention of new tokens over a key/value
// cache, for generation: multi-head, grouped-query and multi-query (kernels/attention_shape.hpp;
// shape.seq is the number of new tokens n).
//
//   qkv      [B, n, (H + 2·KV)·d]   the new tokens, at positions pos .. pos + n - 1 of each sequence
//                                   (q and k already turned by those positions when rotary)
//   k_cache, v_cache [B, capacity, KV·d]  each sequence's keys and values by position: 0 .. pos - 1
//                                   on entry; the new tokens' are written at pos .. pos + n - 1 first
//   out      [B, n, H·d]            new token i attends to positions 0 .. pos + i
//
// Each (b, h, i) row runs the operations of attention_forward's row at position pos + i in the
// same order (the same dot, running max, exponentials, sum and weighted sum, on the same stored
// keys and values), so given the same qkv the output is bit for bit the full forward's; only the
// projections around it see another row count. The keys and values are read where the cache
// keeps them (widening bf16/fp16 is exact, so no converted copy is needed). One row per task and
// nothing summed across threads: the result does not depend on the thread count.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/attention_shape.hpp"
#include "strata/kernels/host/attention.hpp"
#include "strata/kernels/host/openmp.hpp"
#include "strata/policy/device.hpp"

namespace strata::kernels {

template <class T>
void cached_attention_forward(host, T* out, T* k_cache, T* v_cache, const T* qkv, const attention_shape& s,
                              std::int64_t pos, std::int64_t capacity) {
  using A = acc_t<T>;
  attention_detail::check_shape("cached_attention_forward", s);
  STRATA_CHECK(pos >= 0 && pos + s.seq <= capacity, "cached_attention_forward: positions ", pos, " .. ",
               pos + s.seq - 1, " do not fit a cache of ", capacity, " positions");
  const std::int64_t B = s.batch, n = s.seq, H = s.heads, d = s.head_dim, G = s.group();
  const std::int64_t W = s.row_width(), KVd = s.kv_width(), k_off = s.q_width(), v_off = s.q_width() + s.kv_width();
  const A scale = A(s.softmax_scale());

  // The new keys and values join the cache.
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < n; ++i) {
      const T* row = qkv + (b * n + i) * W;
      T* k = k_cache + (b * capacity + pos + i) * KVd;
      T* v = v_cache + (b * capacity + pos + i) * KVd;
      for (std::int64_t j = 0; j < KVd; ++j) k[j] = row[k_off + j], v[j] = row[v_off + j];
    }

  // Per thread: the row's scores then probabilities [pos + n], its query [d] and output
  // accumulator [d], so bf16/fp16 outputs round once.
  const std::int64_t len = pos + n;
  const std::size_t per_thread = std::size_t(len + 2 * d);
  const int threads = openmp::max_threads();
  std::vector<A> scratch(std::size_t(threads) * per_thread);
  const std::int64_t rows = B * H * n;

#pragma omp parallel num_threads(threads) if (rows * len * d > 65536)
  {
    A* p = scratch.data() + std::size_t(openmp::thread_id()) * per_thread;
    A* qa = p + len;
    A* acc = qa + d;
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t i = r % n, h = (r / n) % H, b = r / (n * H);
      const std::int64_t kvh = h / G, last = pos + i;
      const T* keys = k_cache + b * capacity * KVd + kvh * d;
      const T* values = v_cache + b * capacity * KVd + kvh * d;
      const T* q = qkv + (b * n + i) * W + h * d;
      for (std::int64_t j = 0; j < d; ++j) qa[j] = convert<A>(q[j]);

      A max_score = -INFINITY;
      for (std::int64_t t2 = 0; t2 <= last; ++t2) {
        p[t2] = attention_detail::dot<A>(qa, keys + t2 * KVd, d) * scale;
        if (p[t2] > max_score) max_score = p[t2];
      }
      A sum = 0;
      for (std::int64_t t2 = 0; t2 <= last; ++t2) {
        p[t2] = std::exp(p[t2] - max_score);
        sum += p[t2];
      }
      for (std::int64_t j = 0; j < d; ++j) acc[j] = 0;
      for (std::int64_t t2 = 0; t2 <= last; ++t2) {
        const T* v = values + t2 * KVd;
        const A pv = p[t2];
        for (std::int64_t j = 0; j < d; ++j) acc[j] += pv * convert<A>(v[j]);
      }
      const A inv_sum = A(1) / sum;
      T* o = out + (b * n + i) * H * d + h * d;
      for (std::int64_t j = 0; j < d; ++j) o[j] = convert<T>(acc[j] * inv_sum);
    }
  }
}

}  // namespace strata::kernels
