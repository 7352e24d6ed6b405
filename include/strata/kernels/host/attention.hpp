// strata/kernels/host/attention.hpp - causal multi-head self-attention, the part between the
// QKV projection and the output projection.
//
//   qkv  [B, T, 3C]  rows hold q | k | v; head h uses columns h*hs .. (h+1)*hs of each, hs = C/NH
//   att  [B, NH, T, T]  softmax probabilities (acc_t), kept for the backward pass; 0 where t2 > t
//   out  [B, T, C]   out[b, t, h*hs + i] = sum_t2 att[b, h, t, t2] * v[b, t2, h, i]
//
// Scores are q.k / sqrt(hs); position t attends to t2 <= t only. The forward runs one
// (b, h, t) row per task; the backward runs one (b, h) per task, because every t writes into
// the k and v gradients of all earlier positions of its head. Each task sums in a fixed order,
// so the result does not depend on the thread count.
//
// The signatures are the CUDA kernels' (kernels/cuda/attention.cuh), so a layer makes one call
// for every device: attention_backward takes the forward's output as an optional last argument,
// which the host ignores (it keeps the probabilities), and attention_saved_per_row says how
// large `att` is on each device.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/host/openmp.hpp"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace attention_detail {
// x . y over n elements in acc_t, as 8 interleaved partial sums combined in a fixed tree: the
// compiler vectorises it, and the order is still fixed, whatever the thread count.
template <class A, class T>
inline A dot(const T* x, const T* y, std::int64_t n) {
  constexpr int lanes = 8;
  A part[lanes] = {};
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (int j = 0; j < lanes; ++j) part[j] += convert<A>(x[i + j]) * convert<A>(y[i + j]);
  for (; i < n; ++i) part[0] += convert<A>(x[i]) * convert<A>(y[i]);
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

inline void check_shape(const char* who, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
  STRATA_CHECK(B >= 0 && T >= 0 && C > 0 && NH > 0, who, ": need B, T >= 0 and C, NH > 0, got B = ", B,
               ", T = ", T, ", C = ", C, ", NH = ", NH);
  STRATA_CHECK(C % NH == 0, who, ": heads = ", NH, " does not divide channels C = ", C);
}
}  // namespace attention_detail

// How many acc_t values attention_forward keeps in `att` per query row for attention_backward:
// the host keeps the row's probabilities, seq of them, so `att` holds B * NH * seq * seq. The
// CUDA overload (kernels/cuda/attention_saved.hpp) keeps one; the planner prices both from g++.
constexpr std::int64_t attention_saved_per_row(host, std::int64_t seq) { return seq; }

template <class T>
void attention_forward(host, T* out, acc_t<T>* att, const T* qkv, std::int64_t B, std::int64_t T_,
                       std::int64_t C, std::int64_t NH) {
  using A = acc_t<T>;
  attention_detail::check_shape("attention_forward", B, T_, C, NH);
  const std::int64_t hs = C / NH, C3 = 3 * C;
  const A scale = A(1) / std::sqrt(A(hs));
  // Per-thread accumulator for one output row of one head, so bf16/fp16 round once.
  const int threads = openmp::max_threads();
  std::vector<A> scratch(std::size_t(threads) * std::size_t(hs));
  const std::int64_t rows = B * T_ * NH;

#pragma omp parallel num_threads(threads) if (rows * T_ * hs > 65536)
  {
    A* acc = scratch.data() + std::size_t(openmp::thread_id()) * std::size_t(hs);
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      // t varies fastest so a thread sweeps one head's k and v while they sit in its cache.
      const std::int64_t t = r % T_, h = (r / T_) % NH, b = r / (T_ * NH);
      const T* base = qkv + b * T_ * C3;
      const T* q = base + t * C3 + h * hs;
      A* p = att + ((b * NH + h) * T_ + t) * T_;

      A max_score = -INFINITY;
      for (std::int64_t t2 = 0; t2 <= t; ++t2) {
        const T* k = base + t2 * C3 + C + h * hs;
        p[t2] = attention_detail::dot<A>(q, k, hs) * scale;
        if (p[t2] > max_score) max_score = p[t2];
      }
      A sum = 0;
      for (std::int64_t t2 = 0; t2 <= t; ++t2) {
        p[t2] = std::exp(p[t2] - max_score);
        sum += p[t2];
      }
      const A inv_sum = A(1) / sum;
      for (std::int64_t t2 = 0; t2 <= t; ++t2) p[t2] *= inv_sum;
      for (std::int64_t t2 = t + 1; t2 < T_; ++t2) p[t2] = 0;

      for (std::int64_t i = 0; i < hs; ++i) acc[i] = 0;
      for (std::int64_t t2 = 0; t2 <= t; ++t2) {
        const T* v = base + t2 * C3 + 2 * C + h * hs;
        for (std::int64_t i = 0; i < hs; ++i) acc[i] += p[t2] * convert<A>(v[i]);
      }
      T* o = out + (b * T_ + t) * C + h * hs;
      for (std::int64_t i = 0; i < hs; ++i) o[i] = convert<T>(acc[i]);
    }
  }
}

// Accumulates (+=) into dqkv [B, T, 3C]. With P = att row t, dP[t2] = dout[t] . v[t2]:
//   dv[t2] += P[t2] dout[t]
//   dS[t2]  = P[t2] (dP[t2] - sum_j P[j] dP[j]) / sqrt(hs)        (softmax backward, scaled)
//   dq[t]  += sum_t2 dS[t2] k[t2],   dk[t2] += dS[t2] q[t]
// out: the forward's output [B, T, C], accepted for the CUDA signature and not read: the kept
// probabilities already give everything the backward needs.
template <class T>
void attention_backward(host, T* dqkv, const T* dout, const T* qkv, const acc_t<T>* att,
                        std::int64_t B, std::int64_t T_, std::int64_t C, std::int64_t NH,
                        [[maybe_unused]] const std::type_identity_t<T>* out = nullptr) {
  using A = acc_t<T>;
  attention_detail::check_shape("attention_backward", B, T_, C, NH);
  const std::int64_t hs = C / NH, C3 = 3 * C;
  const A scale = A(1) / std::sqrt(A(hs));
  // Per thread: dk and dv of the whole head in acc_t (summed over every later t before one
  // rounding into dqkv), dP for one row, dq for one row.
  const std::size_t per_thread = std::size_t(2 * T_ * hs + T_ + hs);
  const int threads = openmp::max_threads();
  std::vector<A> scratch(std::size_t(threads) * per_thread);
  const std::int64_t heads = B * NH;

#pragma omp parallel num_threads(threads) if (heads * T_ * T_ * hs > 65536)
  {
    A* dk_acc = scratch.data() + std::size_t(openmp::thread_id()) * per_thread;
    A* dv_acc = dk_acc + T_ * hs;
    A* dp = dv_acc + T_ * hs;
    A* dq_acc = dp + T_;
#pragma omp for schedule(static)
    for (std::int64_t bh = 0; bh < heads; ++bh) {
      const std::int64_t b = bh / NH, h = bh % NH;
      const T* base = qkv + b * T_ * C3;
      T* dbase = dqkv + b * T_ * C3;
      for (std::int64_t i = 0; i < 2 * T_ * hs; ++i) dk_acc[i] = 0;

      for (std::int64_t t = 0; t < T_; ++t) {
        const A* p = att + ((b * NH + h) * T_ + t) * T_;
        const T* dy = dout + (b * T_ + t) * C + h * hs;
        const T* q = base + t * C3 + h * hs;

        A p_dot_dp = 0;
        for (std::int64_t t2 = 0; t2 <= t; ++t2) {
          const T* v = base + t2 * C3 + 2 * C + h * hs;
          A* dv = dv_acc + t2 * hs;
          for (std::int64_t i = 0; i < hs; ++i) dv[i] += p[t2] * convert<A>(dy[i]);
          dp[t2] = attention_detail::dot<A>(dy, v, hs);
          p_dot_dp += p[t2] * dp[t2];
        }

        for (std::int64_t i = 0; i < hs; ++i) dq_acc[i] = 0;
        for (std::int64_t t2 = 0; t2 <= t; ++t2) {
          const A ds = p[t2] * (dp[t2] - p_dot_dp) * scale;
          const T* k = base + t2 * C3 + C + h * hs;
          A* dk = dk_acc + t2 * hs;
          for (std::int64_t i = 0; i < hs; ++i) {
            dq_acc[i] += ds * convert<A>(k[i]);
            dk[i] += ds * convert<A>(q[i]);
          }
        }
        T* dq = dbase + t * C3 + h * hs;
        for (std::int64_t i = 0; i < hs; ++i) dq[i] = convert<T>(convert<A>(dq[i]) + dq_acc[i]);
      }

      for (std::int64_t t2 = 0; t2 < T_; ++t2) {
        T* dk = dbase + t2 * C3 + C + h * hs;
        T* dv = dbase + t2 * C3 + 2 * C + h * hs;
        for (std::int64_t i = 0; i < hs; ++i) {
          dk[i] = convert<T>(convert<A>(dk[i]) + dk_acc[t2 * hs + i]);
          dv[i] = convert<T>(convert<A>(dv[i]) + dv_acc[t2 * hs + i]);
        }
      }
    }
  }
}

}  // namespace strata::kernels
