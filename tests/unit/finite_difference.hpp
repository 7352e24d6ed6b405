// tests/unit/finite_difference.hpp - what the kernels' finite-difference tests share: seeded
// inputs, the weighted-sum loss, a fourth-order numerical gradient and the checks on it.
//
// For each op: random inputs and a random output weighting g, the scalar L = sum(g * out), the
// analytic gradients from the backward kernel (dout = g), and a numerical gradient of L for every
// element of every differentiable input.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "strata/core/init.hpp"

namespace finite_difference {

using vec = std::vector<double>;

vec randn(std::size_t n, std::uint64_t stream, double scale = 1.0, double shift = 0.0) {
  vec v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = shift + scale * strata::counter_normal(2024, stream, i);
  return v;
}

// sum(g * out), summed in long double so the sum itself adds no noise to the differences.
double weighted_sum(const vec& g, const vec& out) {
  long double s = 0;
  for (std::size_t i = 0; i < out.size(); ++i) s += (long double)g[i] * out[i];
  return double(s);
}

// Numerical derivative of loss() with respect to each x[i], by the fourth-order central
// difference (8[L(x+h) - L(x-h)] - [L(x+2h) - L(x-2h)]) / 12h. Its truncation error is
// O(h^4) (about 1e-16 at h = 1e-4), and its rounding error about eps * |L| / h (~1e-11), so
// the numerical gradient is good to ~1e-10 absolute: far below the tolerance.
// (The plain two-point difference at h = 1e-6 has a noise floor near 1e-9 absolute, which
// would dominate the relative error of small gradient entries.)
constexpr double fd_step = 1e-4;

vec numerical_gradient(vec& x, const std::function<double()>& loss) {
  vec grad(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    auto at = [&](double offset) {
      x[i] = saved + offset;
      return loss();
    };
    const double near = at(fd_step) - at(-fd_step);
    const double far = at(2 * fd_step) - at(-2 * fd_step);
    x[i] = saved;
    grad[i] = (8 * near - far) / (12 * fd_step);
  }
  return grad;
}

// Relative error |a - n| / max(|a|, |n|, 1e-3): relative where the gradient is of ordinary
// size, and absolute (scaled by 1e3) for entries near zero, whose relative error would only
// measure the finite-difference noise. The gradients here are O(0.01 .. 10).
double max_relative_error(const vec& analytic, const vec& numerical) {
  REQUIRE(analytic.size() == numerical.size());
  double worst = 0;
  for (std::size_t i = 0; i < analytic.size(); ++i) {
    const double a = analytic[i], n = numerical[i];
    const double denom = std::max({std::fabs(a), std::fabs(n), 1e-3});
    worst = std::max(worst, std::fabs(a - n) / denom);
  }
  return worst;
}

constexpr double fd_tolerance = 1e-6;

// Checks one input's gradient; prints the error when STRATA_TEST_VERBOSE is set.
void check_gradient(const char* what, const vec& analytic, vec& x, const std::function<double()>& loss) {
  const double err = max_relative_error(analytic, numerical_gradient(x, loss));
  if (std::getenv("STRATA_TEST_VERBOSE")) std::printf("  fd max rel err %-26s %.3e\n", what, err);
  INFO(what, ": max relative error ", err);
  CHECK(err <= fd_tolerance);
}

// The second call of an accumulating backward, from zero, must leave exactly twice the first.
void check_doubled(const char* what, const vec& once, const vec& twice) {
  INFO(what, " after two backward calls");
  REQUIRE(once.size() == twice.size());
  double worst = 0;
  for (std::size_t i = 0; i < once.size(); ++i)
    worst = std::max(worst, std::fabs(twice[i] - 2 * once[i]) / std::max(std::fabs(once[i]), 1e-300));
  CHECK(worst <= 1e-12);
}

}  // namespace finite_difference
