// strata/kernels/cuda/attention_saved.hpp - how many acc_t values the CUDA attention forward
// keeps per query row for its backward: one, the row's logsumexp (kernels/cuda/attention.cuh
// recomputes the probabilities from it), so `att` holds B * NH * seq floats.
//
// Plain C++ (no CUDA include), apart from attention.cuh: the planner prices CUDA policies in
// translation units that g++ compiles, and there this overload must sit beside the host one
// (kernels/host/attention.hpp: seq per row). kernels/attention.hpp includes both, so
// attention_saved_per_row(Device{}, seq) picks by the device tag, a tag derived from
// strata::cuda included.
#pragma once
#include <cstdint>

#include "strata/policy/device.hpp"

namespace strata::kernels {

constexpr std::int64_t attention_saved_per_row(cuda, std::int64_t /*seq*/) { return 1; }

}  // namespace strata::kernels
