// strata/layers/expert_dispatch.hpp - what a rank's mixture-of-experts blocks sent to each expert
// under expert parallelism.
//
// Each forward of an MoE block under expert parallelism (layers/moe.hpp) adds the (token, slot)
// pairs its rank's tokens routed to each of the E experts: the rows it sends to each expert's
// rank, which decide every all-to-all byte the block moves. Kept per block of the whole model,
// summed over forwards (recomputation's included) until clear(). From these and the expert group,
// the all-to-all volume follows without asking the communicator, so tests hold the counted
// bytes to it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "strata/core/error.hpp"

namespace strata {

class expert_dispatch_log {
 public:
  struct block_record {
    std::int64_t forwards = 0;
    std::vector<std::int64_t> pairs;  // per expert, summed over the forwards
  };

  void add(std::int64_t block, std::span<const std::int64_t> pairs) {
    auto& r = blocks_[block];
    if (r.pairs.empty()) r.pairs.assign(pairs.size(), 0);
    STRATA_CHECK(r.pairs.size() == pairs.size(), "expert_dispatch_log: block ", block, " routed to ", pairs.size(),
                 " experts, earlier to ", r.pairs.size());
    for (std::size_t e = 0; e < pairs.size(); ++e) r.pairs[e] += pairs[e];
    ++r.forwards;
  }
  // The blocks that routed anything since clear(), by their index in the model.
  const std::map<std::int64_t, block_record>& blocks() const { return blocks_; }
  void clear() { blocks_.clear(); }

 private:
  std::map<std::int64_t, block_record> blocks_;
};

}  // namespace strata
