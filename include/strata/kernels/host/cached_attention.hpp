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
// Each new token's row runs attention_forward's block code (attention_detail::forward_rows) at
// its position, against the same keys and values widened to acc_t: the key blocks start at
// multiples of 64 as there, and a row's result depends on its own query, position and keys
// alone, so given the same qkv the output is bit for bit the full forward's; only the
// projections around it see another row count. One (b, h, block of new tokens) per task and
// nothing summed across threads: the result does not depend on the thread count.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/attention_shape.hpp"
#include "strata/kernels/host/attention.hpp"
#include "strata/kernels/host/openmp.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

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

  // Per thread: the current key/value head's keys (transposed) and values in acc_t, converted
  // once per head a thread meets, and one block of new tokens' scratch.
  namespace ad = attention_detail;
  const std::int64_t len = pos + n, dp = ad::round_up(d, ad::width<A>), lp = ad::round_up(len, ad::block);
  const std::int64_t blocks = (n + ad::block - 1) / ad::block, tasks = B * H * blocks;
  const int threads = openmp::max_threads();
  ad::scratch_space<A> scratch(threads, std::size_t(2 * lp * dp) + ad::forward_block_scratch<A>::size(dp));

#pragma omp parallel num_threads(threads) if (tasks > 1 && B * H * n * len * d > 65536)
  {
    A* kt = scratch.slice(openmp::thread_id());
    A* v = kt + lp * dp;
    ad::forward_block_scratch<A> f(v + lp * dp, dp);
    std::int64_t cached = -1;  // b * KV + key/value head held in kt, v
#pragma omp for schedule(static)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t qb = task % blocks, h = (task / blocks) % H, b = task / (blocks * H);
      const std::int64_t kvh = h / G, i0 = qb * ad::block, m = std::min(ad::block, n - i0);
      if (cached != b * s.kv_heads + kvh) {
        cached = b * s.kv_heads + kvh;
        const std::int64_t at = b * capacity * KVd + kvh * d;
        ad::load_head(kt, static_cast<A*>(nullptr), v, k_cache + at, v_cache + at, KVd, len, d, dp, lp);
      }
      ad::load_rows(f.q, qkv + (b * n + i0) * W + h * d, W, m, d, dp);
      ad::forward_rows(f, pos + i0, m, kt, v, len, d, dp, lp, scale);
      for (std::int64_t r = 0; r < m; ++r) {
        const A inv_sum = A(1) / f.l[r];
        T* o = out + (b * n + i0 + r) * H * d + h * d;
        for (std::int64_t j = 0; j < d; ++j) o[j] = convert<T>(f.o[r * dp + j] * inv_sum);
      }
    }
  }
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(cached_attention_forward)

}  // namespace strata::kernels
