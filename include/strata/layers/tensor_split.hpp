// strata/layers/tensor_split.hpp - how a layer is split over its tensor-parallel group, as
// numbers: what its costs and shapes depend on, and what a degree must divide.
//
// A layer reads its split from where it is built (module_scope::split()); its constexpr costs
// take it from a cost_scope (cost.hpp). A layer lists the extents a tensor-parallel degree must
// divide (tensor_extents(config)): the model is checked against them at start-up, and at
// compile time when both the degree and the model's shape are static (tensor_checks.hpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace strata {

struct tensor_split {
  int degree = 1;
  bool sequence_parallel = false;

  bool operator==(const tensor_split&) const = default;
  // Rows of activations held between regions, out of `rows` tokens.
  constexpr std::int64_t local_rows(std::int64_t rows) const { return sequence_parallel ? rows / degree : rows; }
};

// Which half of a linear layer's weight a rank holds.
enum class tensor_split_kind { none, column, row };

// One extent a tensor-parallel degree must divide, with what it is ("heads", "FFN width"). A
// `shareable` extent also takes a degree that is a multiple of it: each of its units (a
// key/value head) is then held by degree/extent ranks. A structural type: the compile-time check
// carries it into the compiler's message.
struct tensor_extent {
  char what[32] = {};
  std::int64_t extent = 0;
  bool shareable = false;

  constexpr tensor_extent() = default;
  constexpr tensor_extent(std::string_view name, std::int64_t n, bool shared = false) : extent(n), shareable(shared) {
    for (std::size_t i = 0; i < name.size() && i + 1 < sizeof what; ++i) what[i] = name[i];
  }
  constexpr std::string_view name() const {
    std::size_t n = 0;
    while (n < sizeof what && what[n] != 0) ++n;
    return {what, n};
  }
  constexpr bool fits(int degree) const {
    return degree > 0 && (extent % degree == 0 || (shareable && extent > 0 && degree % extent == 0));
  }
  // How the message goes on after "tensor parallelism tp=N does not divide <name> = <extent>".
  constexpr std::string_view otherwise() const { return shareable ? " and is not a multiple of it" : ""; }
};

// The extents a layer (and everything inside it) needs divided; a few per layer.
struct tensor_extent_list {
  static constexpr int capacity = 16;
  tensor_extent items[capacity] = {};
  int count = 0;

  constexpr tensor_extent_list() = default;
  constexpr tensor_extent_list(std::initializer_list<tensor_extent> list) {
    for (const auto& e : list) add(e);
  }
  constexpr tensor_extent_list& add(const tensor_extent& e) {
    for (int i = 0; i < count; ++i)
      if (items[i].name() == e.name() && items[i].extent == e.extent && items[i].shareable == e.shareable)
        return *this;  // said already
    if (count < capacity) items[count++] = e;
    return *this;
  }
  constexpr tensor_extent_list& add(const tensor_extent_list& other) {
    for (int i = 0; i < other.count; ++i) add(other.items[i]);
    return *this;
  }
  // The first extent `degree` does not divide, or null.
  constexpr const tensor_extent* first_not_divided_by(int degree) const {
    for (int i = 0; i < count; ++i)
      if (degree > 0 && !items[i].fits(degree)) return &items[i];
    return nullptr;
  }
};

}  // namespace strata
