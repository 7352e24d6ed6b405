// The two measures the reference tests report against outside fixtures: the largest magnitude of
// a reference, and the largest element-wise difference from it (sizes must match).
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace strata_test {

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

inline double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace strata_test
