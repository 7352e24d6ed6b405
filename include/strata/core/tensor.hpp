// strata/core/tensor.hpp - a non-owning view of a dense row-major array with a checked shape.
//
// Layers pass views across their boundaries; a mismatch between what one layer produces and
// the next expects is caught there with both shapes in the message, not as a wrong answer.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>

#include "strata/core/checked_math.hpp"
#include "strata/core/error.hpp"

namespace strata {

inline constexpr int max_rank = 4;

struct shape {
  std::array<std::int64_t, max_rank> dims{};
  int rank = 0;

  shape() = default;
  shape(std::initializer_list<std::int64_t> d) {
    STRATA_CHECK(d.size() <= max_rank, "shape: rank ", d.size(), " exceeds ", max_rank);
    for (auto x : d) dims[static_cast<std::size_t>(rank++)] = x;
  }
  std::int64_t operator[](int i) const { return dims[static_cast<std::size_t>(i)]; }
  // Checked: shapes also come from files (checkpoint pieces), where [2^31, 2^31, 4] must be an
  // error, not a wrapped count.
  std::int64_t numel() const {
    STRATA_CHECK(rank >= 0 && rank <= max_rank, "shape: rank ", rank, " outside [0, ", max_rank, "]");
    const auto n = checked_numel(std::span<const std::int64_t>(dims.data(), static_cast<std::size_t>(rank)));
    STRATA_CHECK(n.has_value(), "shape ", str(), " has a negative dimension or more than 2^63 elements");
    return *n;
  }
  friend bool operator==(const shape& a, const shape& b) {
    return a.rank == b.rank && std::equal(a.dims.begin(), a.dims.begin() + a.rank, b.dims.begin());
  }
  std::string str() const {
    std::ostringstream os;
    os << '[';
    for (int i = 0; i < rank; ++i) os << (i ? ", " : "") << dims[static_cast<std::size_t>(i)];
    os << ']';
    return os.str();
  }
};

template <class T>
struct tensor_view {
  T* data = nullptr;
  strata::shape shape;

  tensor_view() = default;
  tensor_view(T* d, strata::shape s) : data(d), shape(s) {}
  std::int64_t numel() const { return shape.numel(); }
  std::int64_t dim(int i) const { return shape[i]; }
  // A mutable view converts to a read-only one (and a read-only view needs no conversion).
  template <class U = T>
  requires(!std::is_const_v<U>) operator tensor_view<const U>() const { return {data, shape}; }
};

// Throws when `v` does not have shape `expected`, naming who expected it.
template <class T>
void check_shape(const tensor_view<T>& v, const shape& expected, const char* who) {
  STRATA_CHECK(v.shape == expected, who, ": expected shape ", expected.str(), ", got ", v.shape.str());
}

}  // namespace strata
