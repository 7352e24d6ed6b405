// The library's emulated device memory (core/emulated_memory.hpp) under the tests' names: host
// memory that claims not to be and counts what goes through it, so code that must allocate, free
// and move every byte through its ledger's space (as on a GPU) can be checked on the CPU.
#pragma once
#include <strata/core/emulated_memory.hpp>

namespace strata_test {

inline strata::emulated_memory_counts& counts = strata::emulated_memory_stats();

inline const strata::memory_space& counting_space() { return strata::emulated_device_memory(); }

}  // namespace strata_test
