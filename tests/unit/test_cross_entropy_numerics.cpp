// The host cross-entropy at a GPT-2 vocabulary (50257) against a float64 reference written here:
// the mean loss within 1e-7 relative, whole-row and vocabulary-parallel, in fp32 and with 16-bit
// storage, and the gradient (softmax - onehot) * dloss within a few float roundings. The softmax
// sum over the vocabulary must not lose accuracy as the vocabulary grows (a float summed one term
// at a time was 1.4e-6 relative too low on this batch).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "strata/core/init.hpp"
#include "strata/kernels/cross_entropy.hpp"

namespace {

namespace k = strata::kernels;
using strata::host;

constexpr std::int64_t N = 16, V = 50257;

std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

// GPT-2-like rows: N(offset, std^2) with std 3..5, a negative offset on some rows (as GPT-2's
// own logits have), and a few large logits per row (the plausible next tokens). Seeded.
struct batch {
  std::vector<float> logits;  // [N, V]
  std::vector<std::int32_t> targets;
};

batch make_batch() {
  batch b{std::vector<float>(sz(N * V)), std::vector<std::int32_t>(sz(N))};
  for (std::int64_t i = 0; i < N; ++i) {
    const double std_dev = 3.0 + 2.0 * double(i % 5) / 4.0;  // 3 .. 5
    const double offset = (i % 3 == 0) ? -60.0 : (i % 3 == 1 ? 0.0 : -8.0);
    float* row = b.logits.data() + i * V;
    for (std::int64_t v = 0; v < V; ++v) row[v] = float(offset + std_dev * strata::counter_normal(1717, sz(i), sz(v)));
    // A handful of large logits, 4 to 8 standard deviations above the rest.
    std::int32_t spike = 0;
    for (int j = 0; j < 5; ++j) {
      spike = std::int32_t(strata::counter_bits(1718, sz(i), sz(j)) % std::uint64_t(V));
      row[spike] = float(offset + std_dev * (4.0 + 4.0 * strata::counter_uniform(1719, sz(i), sz(j))));
    }
    // Three targets in four are a large logit (a good guess), the rest are anywhere.
    b.targets[sz(i)] = (i % 4 != 3) ? spike : std::int32_t(strata::counter_bits(1720, sz(i), 0) % std::uint64_t(V));
  }
  b.targets[0] = 0;
  b.targets[sz(N - 1)] = std::int32_t(V - 1);
  return b;
}

// float64 reference on the same (already rounded) logits: per-row losses and the gradient of
// dloss * sum_i losses[i].
struct reference {
  std::vector<double> losses, grad;
  double mean = 0;
};

reference reference_of(const std::vector<float>& logits, const std::vector<std::int32_t>& targets, double dloss) {
  reference r{std::vector<double>(sz(N)), std::vector<double>(sz(N * V))};
  for (std::int64_t i = 0; i < N; ++i) {
    const float* row = logits.data() + i * V;
    double m = -INFINITY;
    for (std::int64_t v = 0; v < V; ++v) m = std::max(m, double(row[v]));
    double s = 0;
    for (std::int64_t v = 0; v < V; ++v) s += std::exp(double(row[v]) - m);
    r.losses[sz(i)] = m + std::log(s) - double(row[targets[sz(i)]]);
    r.mean += r.losses[sz(i)] / double(N);
    for (std::int64_t v = 0; v < V; ++v)
      r.grad[sz(i * V + v)] = (std::exp(double(row[v]) - m) / s - (v == targets[sz(i)] ? 1.0 : 0.0)) * dloss;
  }
  return r;
}

// The mean as lm_head takes it: float losses summed in double.
double mean_of(const std::vector<float>& losses) {
  double s = 0;
  for (const float l : losses) s += double(l);
  return s / double(losses.size());
}

double relative(double got, double want) { return std::abs(got - want) / std::abs(want); }

// Largest |got - want| over the gradient, relative to max |want|.
template <class T>
double grad_error(const std::vector<T>& got, const std::vector<double>& want) {
  double diff = 0, scale = 0;
  for (std::size_t j = 0; j < want.size(); ++j) {
    diff = std::max(diff, std::abs(double(strata::convert<float>(got[j])) - want[j]));
    scale = std::max(scale, std::abs(want[j]));
  }
  return diff / scale;
}

// The vocabulary-parallel pieces over t simulated ranks, with the all-reduces done here in float
// in rank order (as an MPI all-reduce of acc_t would). Returns the losses; `grad` gets the
// assembled gradient [N, V].
template <class T>
std::vector<float> vocab_parallel(const std::vector<T>& logits, const std::vector<std::int32_t>& targets, int t,
                                  float dloss, std::vector<T>& grad) {
  const std::int64_t Vl = (V + t - 1) / t;
  std::vector<std::vector<T>> piece(sz(t), std::vector<T>(sz(N * Vl), strata::convert<T>(1e3f)));
  for (int r = 0; r < t; ++r)
    for (std::int64_t i = 0; i < N; ++i)
      for (std::int64_t v = 0; v < Vl && r * Vl + v < V; ++v)
        piece[sz(r)][sz(i * Vl + v)] = logits[sz(i * V + r * Vl + v)];
  std::vector<float> row_max(sz(N), -INFINITY), sums(sz(2 * N), 0.0f), m(sz(N)), s(sz(2 * N)), losses(sz(N));
  for (int r = 0; r < t; ++r) {
    k::vocab_parallel_max(host{}, m.data(), piece[sz(r)].data(), targets.data(), N, Vl, r * Vl, V);
    for (std::int64_t i = 0; i < N; ++i) row_max[sz(i)] = std::max(row_max[sz(i)], m[sz(i)]);
  }
  for (int r = 0; r < t; ++r) {
    k::vocab_parallel_sums(host{}, s.data(), piece[sz(r)].data(), row_max.data(), targets.data(), N, Vl, r * Vl, V);
    for (std::int64_t j = 0; j < 2 * N; ++j) sums[sz(j)] += s[sz(j)];
  }
  grad.assign(sz(N * V), T{});
  for (int r = 0; r < t; ++r) {
    k::vocab_parallel_finish(host{}, losses.data(), piece[sz(r)].data(), row_max.data(), sums.data(), targets.data(), N,
                             Vl, r * Vl, V, dloss);
    for (std::int64_t i = 0; i < N; ++i)
      for (std::int64_t v = 0; v < Vl && r * Vl + v < V; ++v)
        grad[sz(i * V + r * Vl + v)] = piece[sz(r)][sz(i * Vl + v)];
  }
  return losses;
}

template <class T>
std::vector<T> narrow(const std::vector<float>& x) {
  std::vector<T> y(x.size());
  for (std::size_t j = 0; j < x.size(); ++j) y[j] = strata::convert<T>(x[j]);
  return y;
}

template <class T>
std::vector<float> widen(const std::vector<T>& x) {
  std::vector<float> y(x.size());
  for (std::size_t j = 0; j < x.size(); ++j) y[j] = strata::convert<float>(x[j]);
  return y;
}

}  // namespace

TEST_CASE("fp32 cross-entropy at vocab 50257: mean loss within 1e-7 relative of float64") {
  const batch b = make_batch();
  const float dloss = 1.0f / float(N);
  const reference ref = reference_of(b.logits, b.targets, double(dloss));

  std::vector<float> losses(sz(N));
  k::cross_entropy_forward(host{}, losses.data(), b.logits.data(), b.targets.data(), N, V, V);
  const double forward_err = relative(mean_of(losses), ref.mean);
  double worst_row = 0;
  for (std::int64_t i = 0; i < N; ++i) worst_row = std::max(worst_row, relative(losses[sz(i)], ref.losses[sz(i)]));
  MESSAGE("vocab " << V << ", " << N << " rows, mean loss " << ref.mean
                   << ": fp32 cross_entropy_forward relative error " << forward_err << " (worst row " << worst_row
                   << ")");
  CHECK(forward_err <= 1e-7);
  CHECK(worst_row <= 2e-7);  // one row: a few float roundings of the loss itself

  auto grad = b.logits;
  std::vector<float> fused(sz(N));
  k::cross_entropy_forward_backward(host{}, fused.data(), grad.data(), b.targets.data(), N, V, V, dloss);
  CHECK(fused == losses);  // the same sum, bit for bit
  // Each element is exp(x - max) / sum in float: a few roundings of p plus the rounding of
  // x - max (|x - max| * 2^-24), so 1e-6 of max |g| is a bound with room, not a fit.
  const double gerr = grad_error(grad, ref.grad);
  MESSAGE("fp32 dlogits: max |g - g64| / max |g64| = " << gerr);
  CHECK(gerr <= 1e-6);

  for (int t : {2, 3, 4}) {
    CAPTURE(t);
    std::vector<float> vgrad;
    const auto vlosses = vocab_parallel(b.logits, b.targets, t, dloss, vgrad);
    const double verr = relative(mean_of(vlosses), ref.mean);
    MESSAGE("vocab-parallel over " << t << " pieces: relative error " << verr);
    CHECK(verr <= 1e-7);
    CHECK(grad_error(vgrad, ref.grad) <= 1e-6);
  }
}

TEST_CASE_TEMPLATE("16-bit storage at vocab 50257: the loss is as accurate as fp32's, dlogits rounded once", T,
                   strata::bf16, strata::fp16) {
  const batch b = make_batch();
  const float dloss = 1.0f / float(N);
  const std::vector<T> logits16 = narrow<T>(b.logits);
  const reference ref = reference_of(widen(logits16), b.targets, double(dloss));  // on the stored values

  std::vector<float> losses(sz(N));
  k::cross_entropy_forward(host{}, losses.data(), logits16.data(), b.targets.data(), N, V, V);
  CHECK(relative(mean_of(losses), ref.mean) <= 1e-7);

  auto grad = logits16;
  std::vector<float> fused(sz(N));
  k::cross_entropy_forward_backward(host{}, fused.data(), grad.data(), b.targets.data(), N, V, V, dloss);
  CHECK(fused == losses);
  // One rounding to T of a value within 1e-6 (of max |g|) of the reference.
  const double unit = std::is_same_v<T, strata::bf16> ? 0x1p-8 : 0x1p-11;
  CHECK(grad_error(grad, ref.grad) <= unit + 1e-6);

  std::vector<T> vgrad;
  const auto vlosses = vocab_parallel(logits16, b.targets, 2, dloss, vgrad);
  CHECK(relative(mean_of(vlosses), ref.mean) <= 1e-7);
  CHECK(grad_error(vgrad, ref.grad) <= unit + 1e-6);
}
