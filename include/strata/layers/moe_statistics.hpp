// strata/layers/moe_statistics.hpp - what a mixture-of-experts block reports each step, and the
// summary the metrics and the progress line show of it.
//
// A block's row (layers/auxiliary_loss.hpp; layers/moe.hpp writes it): balance and z before
// their coefficients (values: averaged over the step), then the (token, slot) pairs dropped over
// capacity and the pairs each expert received (counts: summed over the step's micro-batches and
// data-parallel ranks).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "strata/layers/auxiliary_loss.hpp"

namespace strata {

inline constexpr std::int64_t moe_row_balance = 0, moe_row_z = 1, moe_row_dropped = 2, moe_row_tokens = 3;

// One block's load in a step.
struct expert_load {
  std::int64_t block = 0;
  double balance = 0, z = 0, dropped = 0;
  double tokens_min = 0, tokens_max = 0, tokens_mean = 0;  // pairs per expert
};

// The blocks whose rows hold any pairs (a model's dense blocks, and a model without experts,
// give none).
inline std::vector<expert_load> expert_loads(const auxiliary_sums& a) {
  std::vector<expert_load> out;
  if (a.width <= moe_row_tokens) return out;
  const std::int64_t experts = a.width - moe_row_tokens;
  for (std::int64_t b = 0; b < a.blocks; ++b) {
    const double* row = a.rows.data() + b * a.width;
    const double* tokens = row + moe_row_tokens;
    double sum = 0;
    for (std::int64_t e = 0; e < experts; ++e) sum += tokens[e];
    if (sum == 0) continue;
    out.push_back({.block = b,
                   .balance = row[moe_row_balance],
                   .z = row[moe_row_z],
                   .dropped = row[moe_row_dropped],
                   .tokens_min = *std::min_element(tokens, tokens + experts),
                   .tokens_max = *std::max_element(tokens, tokens + experts),
                   .tokens_mean = sum / double(experts)});
  }
  return out;
}

}  // namespace strata
