// The device-neutral building blocks for custom ops (kernels/elementwise.hpp,
// kernels/rowwise.hpp) on the host: ops written with them - not strata's own - checked as
// test_kernels_fd.cpp checks the library's kernels: each backward against float64 fourth-order
// finite differences (max relative error <= 1e-6 with a 1e-3 floor), called twice (parameter
// gradients accumulate and double; input gradients are written, so NaN in them changes
// nothing); the strided and the contiguous paths give the same numbers; the results are the
// same bits with 1, 2 and 3 OpenMP threads. (residual, SwiGLU and RMSNorm, which strata writes
// with these blocks, keep their own tests in test_kernels_fd.cpp and test_llama_kernels_fd.cpp;
// tests/cuda/gpu_tests.cu runs the GPU halves against these host ones.)
#include <doctest/doctest.h>

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "strata/kernels/all.hpp"
#include "finite_difference.hpp"

namespace {

namespace k = strata::kernels;
using strata::bf16;
using strata::convert;
using strata::host;
using namespace finite_difference;

constexpr std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

struct omp_threads {
  int saved = omp_get_max_threads();
  explicit omp_threads(int n) { omp_set_num_threads(n); }
  ~omp_threads() { omp_set_num_threads(saved); }
};

template <class X>
bool bit_identical(const std::vector<X>& a, const std::vector<X>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(X)) == 0;
}

// An exponential gate over a fused [N, 2H] input (z then u per row): y = z · e^u, and its
// gradient dz = dy · e^u, du = dy · z · e^u, written into the two halves of a [N, 2H] buffer.
struct exp_gate {
  template <class A>
  STRATA_HD void operator()(A& y, A z, A u) const {
    y = z * k::hd_exp(u);
  }
};
struct exp_gate_backward {
  template <class A>
  STRATA_HD void operator()(A& dz, A& du, A dy, A z, A u) const {
    const A e = k::hd_exp(u);
    dz = dy * e;
    du = dy * z * e;
  }
};
template <class D, class T>
void exp_gate_forward(D d, T* y, const T* zu, std::int64_t N, std::int64_t H) {
  k::elementwise(d, N, H, k::outputs(y), k::inputs(k::strided(zu, 2 * H), k::strided(zu + H, 2 * H)), exp_gate{});
}
template <class D, class T>
void exp_gate_backward_(D d, T* dzu, const T* dy, const T* zu, std::int64_t N, std::int64_t H) {
  k::elementwise(d, N, H, k::outputs(k::strided(dzu, 2 * H), k::strided(dzu + H, 2 * H)),
                 k::inputs(dy, k::strided(zu, 2 * H), k::strided(zu + H, 2 * H)), exp_gate_backward{});
}

// A centring norm with a gain: y = (x - mean_c x) · g per row; mean [N] kept.
//   dx = g·dy - mean_c(g·dy),  dg += sum_r dy · (x - mean)
template <class T, class A = strata::acc_t<T>>
struct centre_forward {
  const T* x;
  const T* g;
  T* y;
  A* mean;
  std::int64_t C;
  STRATA_HD A term(std::int64_t r, std::int64_t c) const { return convert<A>(x[r * C + c]); }
  STRATA_HD A finish(std::int64_t r, A s) const { return mean[r] = s / A(C); }
  STRATA_HD void write(std::int64_t r, std::int64_t c, A m) const {
    y[r * C + c] = convert<T>((convert<A>(x[r * C + c]) - m) * convert<A>(g[c]));
  }
};
template <class T, class A = strata::acc_t<T>>
struct centre_backward {
  const T* dy;
  const T* g;
  T* dx;
  std::int64_t C;
  STRATA_HD A term(std::int64_t r, std::int64_t c) const { return convert<A>(dy[r * C + c]) * convert<A>(g[c]); }
  STRATA_HD A finish(std::int64_t, A s) const { return s / A(C); }
  STRATA_HD void write(std::int64_t r, std::int64_t c, A m) const {
    dx[r * C + c] = convert<T>(convert<A>(dy[r * C + c]) * convert<A>(g[c]) - m);
  }
};
template <class T, class A = strata::acc_t<T>>
struct centre_gain_grad {
  const T* dy;
  const T* x;
  const A* mean;
  std::int64_t C;
  STRATA_HD A operator()(std::int64_t r, std::int64_t c) const {
    return convert<A>(dy[r * C + c]) * (convert<A>(x[r * C + c]) - mean[r]);
  }
};

struct add {
  template <class A>
  STRATA_HD void operator()(A& o, A a, A b) const {
    o = a + b;
  }
};
struct reverse {
  const float* in;
  float* out;
  std::int64_t n;
  STRATA_HD void operator()(std::int64_t i) const { out[i] = in[n - 1 - i]; }
};

}  // namespace

TEST_CASE("elementwise: a strided two-output op's backward matches finite differences; written, not read") {
  const std::int64_t N = 6, H = 7;
  vec zu = randn(sz(N * 2 * H), 1, 0.7), g = randn(sz(N * H), 2);
  vec y(sz(N * H));
  auto loss = [&] {
    exp_gate_forward(host{}, y.data(), zu.data(), N, H);
    return weighted_sum(g, y);
  };
  loss();
  for (std::int64_t i = 0; i < N * H; ++i) {  // the forward, directly
    const std::int64_t r = i / H, c = i % H;
    CHECK(y[sz(i)] == doctest::Approx(zu[sz(r * 2 * H + c)] * std::exp(zu[sz(r * 2 * H + H + c)])).epsilon(1e-15));
  }
  vec dzu(zu.size());
  exp_gate_backward_(host{}, dzu.data(), g.data(), zu.data(), N, H);
  check_gradient("exp_gate dzu", dzu, zu, loss);
  vec dzu2(zu.size(), std::numeric_limits<double>::quiet_NaN());
  exp_gate_backward_(host{}, dzu2.data(), g.data(), zu.data(), N, H);
  CHECK(dzu2 == dzu);
}

TEST_CASE("elementwise: the strided path and the contiguous path give the same numbers; outputs may be inputs") {
  const std::int64_t N = 300, H = 256;  // above the parallel threshold
  const vec zu_d = randn(sz(N * 2 * H), 3, 0.5);
  std::vector<bf16> zu(zu_d.size());
  for (std::size_t i = 0; i < zu.size(); ++i) zu[i] = convert<bf16>(zu_d[i]);
  std::vector<bf16> y(sz(N * H));
  exp_gate_forward(host{}, y.data(), zu.data(), N, H);
  // The halves copied out, then the same functor over contiguous operands of N * H elements.
  std::vector<bf16> z(sz(N * H)), u(sz(N * H)), y2(sz(N * H));
  for (std::int64_t r = 0; r < N; ++r)
    for (std::int64_t c = 0; c < H; ++c) {
      z[sz(r * H + c)] = zu[sz(r * 2 * H + c)];
      u[sz(r * H + c)] = zu[sz(r * 2 * H + H + c)];
    }
  k::elementwise(host{}, N * H, k::outputs(y2.data()), k::inputs(z.data(), u.data()), exp_gate{});
  CHECK(bit_identical(y, y2));
  // Each element rounded once from float.
  for (std::size_t i = 0; i < y.size(); i += 97)
    CHECK(convert<float>(y[i]) ==
          convert<float>(convert<bf16>(convert<float>(z[i]) * k::exp_fast(convert<float>(u[i])))));
  // y2 = y2 + z, in place.
  std::vector<bf16> expect(y2.size());
  for (std::size_t i = 0; i < y2.size(); ++i) expect[i] = convert<bf16>(convert<float>(y2[i]) + convert<float>(z[i]));
  k::elementwise(host{}, N * H, k::outputs(y2.data()), k::inputs(y2.data(), z.data()), add{});
  CHECK(bit_identical(y2, expect));
  // Strides below the row length, null operands and negative sizes are refused; empty is a no-op.
  CHECK_THROWS_AS(
      k::elementwise(host{}, N, H, k::outputs(k::strided(y.data(), H - 1)), k::inputs(z.data(), u.data()), exp_gate{}),
      strata::error);
  CHECK_THROWS_AS(k::elementwise(host{}, N * H, k::outputs(y.data()),
                                 k::inputs(z.data(), static_cast<const bf16*>(nullptr)), exp_gate{}),
                  strata::error);
  CHECK_THROWS_AS(k::elementwise(host{}, -1, k::outputs(y.data()), k::inputs(z.data(), u.data()), exp_gate{}),
                  strata::error);
  k::elementwise(host{}, 0, k::outputs(static_cast<bf16*>(nullptr)), k::inputs(z.data(), u.data()), exp_gate{});
}

TEST_CASE("for_each_index: a gather, each index once") {
  const std::int64_t n = 100000;
  std::vector<float> in(sz(n)), out(sz(n), -1.0f);
  for (std::int64_t i = 0; i < n; ++i) in[sz(i)] = float(i);
  k::for_each_index(host{}, n, reverse{in.data(), out.data(), n});
  bool ok = true;
  for (std::int64_t i = 0; i < n; ++i) ok = ok && out[sz(i)] == float(n - 1 - i);
  CHECK(ok);
  CHECK_THROWS_AS(k::for_each_index(host{}, -1, reverse{in.data(), out.data(), n}), strata::error);
}

TEST_CASE("row_reduce and sum_columns: a custom norm's gradients match finite differences; dg accumulates") {
  const std::int64_t N = 9, C = 21;  // C = 21: one full 16-lane block and a tail
  vec x = randn(sz(N * C), 4, 1.2, 0.4), gain = randn(sz(C), 5, 0.3, 1.0), g = randn(sz(N * C), 6);
  vec y(sz(N * C)), mean(sz(N));
  auto loss = [&] {
    k::row_reduce(host{}, N, C, centre_forward<double>{x.data(), gain.data(), y.data(), mean.data(), C});
    return weighted_sum(g, y);
  };
  loss();
  for (std::int64_t r = 0; r < N; ++r) {  // the forward, directly
    double m = 0;
    for (std::int64_t c = 0; c < C; ++c) m += x[sz(r * C + c)];
    m /= double(C);
    CHECK(mean[sz(r)] == doctest::Approx(m).epsilon(1e-14));
    for (std::int64_t c = 0; c < C; ++c)
      CHECK(y[sz(r * C + c)] == doctest::Approx((x[sz(r * C + c)] - m) * gain[sz(c)]).epsilon(1e-13));
  }
  auto backward = [&](vec& dx, vec& dgain) {
    k::row_reduce(host{}, N, C, centre_backward<double>{g.data(), gain.data(), dx.data(), C});
    k::sum_columns(host{}, N, C, dgain.data(), centre_gain_grad<double>{g.data(), x.data(), mean.data(), C});
  };
  vec dx(sz(N * C)), dgain(sz(C));
  backward(dx, dgain);
  check_gradient("centre dx", dx, x, loss);
  check_gradient("centre dgain", dgain, gain, loss);
  loss();
  vec dx2(dx.size(), std::numeric_limits<double>::quiet_NaN()), dgain2 = dgain;
  backward(dx2, dgain2);
  CHECK(dx2 == dx);
  check_doubled("centre dgain", dgain, dgain2);
  // Empty rows add nothing; a zero-width row is refused.
  vec unchanged = dgain;
  k::sum_columns(host{}, 0, C, dgain.data(), centre_gain_grad<double>{g.data(), x.data(), mean.data(), C});
  CHECK(dgain == unchanged);
  CHECK_THROWS_AS(k::row_reduce(host{}, N, 0, centre_backward<double>{g.data(), gain.data(), dx.data(), C}),
                  strata::error);
}

TEST_CASE("row_reduce, sum_columns and elementwise: the same bits with 1, 2 and 3 threads") {
  const std::int64_t N = 1000, C = 200;  // above the parallel thresholds; 16 row chunks
  const vec xd = randn(sz(N * C), 7), gd = randn(sz(C), 8, 0.2, 1.0), dyd = randn(sz(N * C), 9);
  std::vector<float> x(xd.begin(), xd.end()), gain(gd.begin(), gd.end()), dy(dyd.begin(), dyd.end());
  auto run = [&](int threads) {
    omp_threads scope(threads);
    std::vector<float> y(x.size()), mean(sz(N)), dx(x.size()), dgain(gain.size()), zu(sz(N * 2 * C)), e(x.size());
    k::row_reduce(host{}, N, C, centre_forward<float>{x.data(), gain.data(), y.data(), mean.data(), C});
    k::row_reduce(host{}, N, C, centre_backward<float>{dy.data(), gain.data(), dx.data(), C});
    k::sum_columns(host{}, N, C, dgain.data(), centre_gain_grad<float>{dy.data(), x.data(), mean.data(), C});
    for (std::int64_t r = 0; r < N; ++r)
      for (std::int64_t c = 0; c < C; ++c)
        zu[sz(r * 2 * C + c)] = x[sz(r * C + c)], zu[sz(r * 2 * C + C + c)] = dy[sz(r * C + c)];
    exp_gate_forward(host{}, e.data(), zu.data(), N, C);
    for (auto* v : {&mean, &dx, &dgain, &e}) y.insert(y.end(), v->begin(), v->end());
    return y;
  };
  const auto one = run(1);
  CHECK(bit_identical(one, run(2)));
  CHECK(bit_identical(one, run(3)));
}
