// strata/kernels/host/attention.hpp - causal self-attention between the QKV projection and the
// output projection: multi-head, grouped-query and multi-query (kernels/attention_shape.hpp).
//
//   qkv  [B, T, (H + 2·KV)·d]  per token the H query heads, then the KV key heads, then the KV
//        value heads; query head h reads key/value head h / (H / KV), never a repeated copy
//   out  [B, T, H·d]           out[b, t, h] = sum_{t2 <= t} P[t, t2] v[b, t2, h / group]
//   lse  [B, H, T] (acc_t)     max + log(sum exp) of the row's scaled scores, all backward keeps
//
// score[t, t2] = q[t] . k[t2] · scale (scale = attention_shape::softmax_scale()), t2 <= t only,
// and P = exp(score - lse) = softmax(score). The forward runs one (b, h, t) row per task, t
// varying fastest, so a thread meets each key/value head once and keeps a contiguous acc_t copy
// of its K and V in cache while it works through the head's rows. Backward recomputes P from lse
// (no T x T state anywhere) and runs one (b, key/value head) per task: that task owns the head's
// dK and dV, summed in acc_t over every query head of its group and every later t before one
// rounding, and writes the dQ rows of its group's query heads. Every sum runs in an order fixed
// by the shape alone, so the results do not depend on the thread count.
//
// Multi-head overloads in GPT-2's terms (B, T, C, NH) are shorthands for
// attention_shape::multi_head (kernels/cuda/attention.cuh has the same ones).
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/attention_shape.hpp"
#include "strata/kernels/host/openmp.hpp"
#include "strata/policy/device.hpp"

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
  STRATA_CHECK(s.valid(), who, ": need batch, seq >= 0, heads, kv_heads, head_dim > 0 and kv_heads dividing heads, got batch = ",
               s.batch, ", seq = ", s.seq, ", heads = ", s.heads, ", kv_heads = ", s.kv_heads, ", head_dim = ",
               s.head_dim);
  STRATA_CHECK(std::isfinite(s.scale), who, ": the softmax scale must be finite (0: 1/sqrt(head_dim)), got ", s.scale);
}

// The GPT-2 overloads' shape: C channels in NH heads.
inline attention_shape multi_head_shape(const char* who, std::int64_t B, std::int64_t T, std::int64_t C,
                                        std::int64_t NH) {
  STRATA_CHECK(B >= 0 && T >= 0 && C > 0 && NH > 0, who, ": need B, T >= 0 and C, NH > 0, got B = ", B,
               ", T = ", T, ", C = ", C, ", NH = ", NH);
  STRATA_CHECK(C % NH == 0, who, ": heads = ", NH, " does not divide channels C = ", C);
  return attention_shape::multi_head(B, T, C, NH);
}

// The forward with the output in O (T, or acc_t when backward recomputes it unrounded); lse may
// be null (only backward's recomputation, which has the caller's lse already).
template <class T, class O>
void forward(O* out, acc_t<T>* lse, const T* qkv, const attention_shape& s) {
  using A = acc_t<T>;
  const std::int64_t B = s.batch, T_ = s.seq, H = s.heads, d = s.head_dim, G = s.group();
  const std::int64_t W = s.row_width(), k_off = s.q_width(), v_off = s.q_width() + s.kv_width();
  const A scale = A(s.softmax_scale());
  // Per thread: the current key/value head's K and V in acc_t, contiguous [T, d] (converted once
  // per head a thread meets, not once per query row: unit-stride rows that stay in cache, and
  // bf16/fp16 widened once), the row's scores then probabilities [T], its query [d] and output
  // accumulator [d], so bf16/fp16 outputs round once.
  const std::size_t per_thread = std::size_t(2 * T_ * d + T_ + 2 * d);
  const int threads = openmp::max_threads();
  std::vector<A> scratch(std::size_t(threads) * per_thread);
  const std::int64_t rows = B * H * T_;

#pragma omp parallel num_threads(threads) if (rows * T_ * d > 65536)
  {
    A* ka = scratch.data() + std::size_t(openmp::thread_id()) * per_thread;
    A* va = ka + T_ * d;
    A* p = va + T_ * d;
    A* qa = p + T_;
    A* acc = qa + d;
    std::int64_t cached = -1;  // b * KV + key/value head held in ka, va
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t t = r % T_, h = (r / T_) % H, b = r / (T_ * H);
      const std::int64_t kvh = h / G;
      const T* base = qkv + b * T_ * W;
      if (cached != b * s.kv_heads + kvh) {
        cached = b * s.kv_heads + kvh;
        for (std::int64_t t2 = 0; t2 < T_; ++t2)
          for (std::int64_t i = 0; i < d; ++i) {
            ka[t2 * d + i] = convert<A>(base[t2 * W + k_off + kvh * d + i]);
            va[t2 * d + i] = convert<A>(base[t2 * W + v_off + kvh * d + i]);
          }
      }
      const T* q = base + t * W + h * d;
      for (std::int64_t i = 0; i < d; ++i) qa[i] = convert<A>(q[i]);

      A max_score = -INFINITY;
      for (std::int64_t t2 = 0; t2 <= t; ++t2) {
        p[t2] = dot<A>(qa, ka + t2 * d, d) * scale;
        if (p[t2] > max_score) max_score = p[t2];
      }
      A sum = 0;
      for (std::int64_t t2 = 0; t2 <= t; ++t2) {
        p[t2] = std::exp(p[t2] - max_score);
        sum += p[t2];
      }
      for (std::int64_t i = 0; i < d; ++i) acc[i] = 0;
      for (std::int64_t t2 = 0; t2 <= t; ++t2) {
        const A* v = va + t2 * d;
        const A pv = p[t2];
        for (std::int64_t i = 0; i < d; ++i) acc[i] += pv * v[i];
      }
      const A inv_sum = A(1) / sum;
      O* o = out + (b * T_ + t) * H * d + h * d;
      for (std::int64_t i = 0; i < d; ++i) o[i] = convert<O>(acc[i] * inv_sum);
      if (lse) lse[(b * H + h) * T_ + t] = max_score + std::log(sum);
    }
  }
}

// Accumulates (+=) into dqkv. For query row t of head h, with P[t2] = exp(score - lse[t]):
//   dP[t2] = dout[t] . v[t2],  D = dout[t] . out[t]  (= sum_t2 P[t2] dP[t2])
//   dS[t2] = P[t2] (dP[t2] - D) · scale
//   dq[t] += sum_t2 dS[t2] k[t2],  dk[t2] += dS[t2] q[t],  dv[t2] += P[t2] dout[t]
template <class T, class O>
void backward(T* dqkv, const T* dout, const T* qkv, const acc_t<T>* lse, const O* out, const attention_shape& s) {
  using A = acc_t<T>;
  const std::int64_t B = s.batch, T_ = s.seq, H = s.heads, KV = s.kv_heads, d = s.head_dim, G = s.group();
  const std::int64_t W = s.row_width(), k_off = s.q_width(), v_off = s.q_width() + s.kv_width();
  const A scale = A(s.softmax_scale());
  // Per thread: the head's K and V in acc_t, contiguous [T, d] (converted once per task rather
  // than once per query row), its dK and dV accumulators [T, d], and for a block of R query rows
  // their q, dout and dq accumulators [R, d], D and lse [R].
  constexpr std::int64_t R = 4;
  static_assert(R == 4, "the unrolled dk/dv update below adds four rows");
  const std::size_t per_thread = std::size_t(4 * T_ * d + 3 * R * d + 2 * R);
  const int threads = openmp::max_threads();
  std::vector<A> scratch(std::size_t(threads) * per_thread);
  const std::int64_t tasks = B * KV;

#pragma omp parallel num_threads(threads) if (tasks > 1 && B * H * T_ * T_ * d > 65536)
  {
    A* ka = scratch.data() + std::size_t(openmp::thread_id()) * per_thread;
    A* va = ka + T_ * d;
    A* dk = va + T_ * d;
    A* dv = dk + T_ * d;
    A* qa = dv + T_ * d;  // row r of the block at qa + r * d
    A* dya = qa + R * d;
    A* dq = dya + R * d;
    A* D = dq + R * d;
    A* L = D + R;
#pragma omp for schedule(static)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t b = task / KV, kvh = task % KV;
      const T* base = qkv + b * T_ * W;
      T* dbase = dqkv + b * T_ * W;
      for (std::int64_t t2 = 0; t2 < T_; ++t2)
        for (std::int64_t i = 0; i < d; ++i) {
          ka[t2 * d + i] = convert<A>(base[t2 * W + k_off + kvh * d + i]);
          va[t2 * d + i] = convert<A>(base[t2 * W + v_off + kvh * d + i]);
        }
      for (std::int64_t i = 0; i < 2 * T_ * d; ++i) dk[i] = 0;  // dk and dv

      // Query rows t0 .. t0 + R - 1 together: each key row's dk and dv are read and written once
      // per block rather than once per query. Within a block the rows still add in t order, left
      // to right, so every sum keeps the order of one row at a time: (b, h, t) ascending.
      for (std::int64_t h = kvh * G; h < (kvh + 1) * G; ++h)
        for (std::int64_t t0 = 0; t0 < T_; t0 += R) {
          const std::int64_t rows = T_ - t0 < R ? T_ - t0 : R;
          for (std::int64_t r = 0; r < rows; ++r) {
            const std::int64_t t = t0 + r;
            const T* q = base + t * W + h * d;
            const T* dy = dout + (b * T_ + t) * H * d + h * d;
            const O* o = out + (b * T_ + t) * H * d + h * d;
            for (std::int64_t i = 0; i < d; ++i) qa[r * d + i] = convert<A>(q[i]), dya[r * d + i] = convert<A>(dy[i]);
            D[r] = dot<A>(dya + r * d, o, d);
            L[r] = lse[(b * H + h) * T_ + t];
            for (std::int64_t i = 0; i < d; ++i) dq[r * d + i] = 0;
          }

          for (std::int64_t t2 = 0; t2 < t0 + rows; ++t2) {
            const A* k = ka + t2 * d;
            const A* v = va + t2 * d;
            A* dk_row = dk + t2 * d;
            A* dv_row = dv + t2 * d;
            // Rows r with t0 + r >= t2 see key t2 (causal); below the diagonal that is all of them.
            const std::int64_t first = t2 > t0 ? t2 - t0 : 0;
            A pr[R] = {}, g[R] = {};
            for (std::int64_t r = first; r < rows; ++r) {
              pr[r] = std::exp(dot<A>(qa + r * d, k, d) * scale - L[r]);
              g[r] = pr[r] * (dot<A>(dya + r * d, v, d) - D[r]) * scale;  // dS
              A* dq_r = dq + r * d;
              for (std::int64_t i = 0; i < d; ++i) dq_r[i] += g[r] * k[i];
            }
            if (first == 0 && rows == R) {
              const A *q0 = qa, *q1 = qa + d, *q2 = qa + 2 * d, *q3 = qa + 3 * d;
              const A *y0 = dya, *y1 = dya + d, *y2 = dya + 2 * d, *y3 = dya + 3 * d;
              for (std::int64_t i = 0; i < d; ++i)
                dk_row[i] = dk_row[i] + g[0] * q0[i] + g[1] * q1[i] + g[2] * q2[i] + g[3] * q3[i];
              for (std::int64_t i = 0; i < d; ++i)
                dv_row[i] = dv_row[i] + pr[0] * y0[i] + pr[1] * y1[i] + pr[2] * y2[i] + pr[3] * y3[i];
            } else {
              for (std::int64_t r = first; r < rows; ++r) {
                const A* q_r = qa + r * d;
                const A* y_r = dya + r * d;
                for (std::int64_t i = 0; i < d; ++i) dk_row[i] += g[r] * q_r[i];
                for (std::int64_t i = 0; i < d; ++i) dv_row[i] += pr[r] * y_r[i];
              }
            }
          }
          for (std::int64_t r = 0; r < rows; ++r) {
            T* dq_out = dbase + (t0 + r) * W + h * d;
            for (std::int64_t i = 0; i < d; ++i) dq_out[i] = convert<T>(convert<A>(dq_out[i]) + dq[r * d + i]);
          }
        }

      for (std::int64_t t2 = 0; t2 < T_; ++t2) {
        T* dk_out = dbase + t2 * W + k_off + kvh * d;
        T* dv_out = dbase + t2 * W + v_off + kvh * d;
        for (std::int64_t i = 0; i < d; ++i) {
          dk_out[i] = convert<T>(convert<A>(dk_out[i]) + dk[t2 * d + i]);
          dv_out[i] = convert<T>(convert<A>(dv_out[i]) + dv[t2 * d + i]);
        }
      }
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

// Accumulates (+=) into dqkv [B, T, row_width]: the q, k and v gradients. lse and out are the
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

// As above; accumulates (+=) into dqkv [B, T, 3C]. out: the forward's output. Without it the
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

}  // namespace strata::kernels
