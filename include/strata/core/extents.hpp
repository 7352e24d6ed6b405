// strata/core/extents.hpp - the one sentinel for "known only at run time".
//
// A degree or extent is either a positive number fixed at compile time, or strata::dynamic,
// read at start-up and checked then. Only one sentinel exists so every template agrees.
#pragma once
#include <cstdint>

namespace strata {

inline constexpr int dynamic = -1;

constexpr bool is_dynamic(int extent) { return extent == dynamic; }

// A static extent must be positive; dynamic is the only other allowed value.
constexpr bool is_valid_extent(int extent) { return extent == dynamic || extent >= 1; }

}  // namespace strata
