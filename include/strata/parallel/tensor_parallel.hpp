// strata/parallel/tensor_parallel.hpp - whole parameters from their tensor-parallel pieces.
//
// Each rank of a tensor-parallel group holds its piece of every sharded parameter (tensor_shard
// says where each element sits in the full tensor). gather_full_weights puts the pieces back
// together: the result is laid out exactly like the serial model's flat weight buffer (the same
// parameters in the same order, full shapes, vocabulary padding dropped), so a sharded model can
// be compared with, or saved as, the unsharded one. Collective over the group.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "strata/comm/group_ref.hpp"
#include "strata/core/dtype.hpp"
#include "strata/layers/parameters.hpp"

namespace strata {

// `weights`: this rank's flat weights, indexed like the store (for ZeRO, data_parallel's
// full_weights()). Returns the serial model's flat weights, as double.
template <class T>
std::vector<double> gather_full_weights(const parameter_store<T>& store, std::span<const T> weights, group_ref& tp) {
  std::vector<double> full_model;
  for (const auto& e : store.entries()) {
    const T* mine = weights.data() + e.offset;
    const tensor_shard& s = e.shard;
    const std::int64_t cols = s.full.rank >= 2 ? s.full[1] : 1;
    const std::int64_t kept = s.real_rows < 0 ? s.full.numel() : s.real_rows * cols;
    if (!s.sharded()) {
      for (std::int64_t i = 0; i < kept; ++i) full_model.push_back(convert<double>(mine[i]));
      continue;
    }
    std::vector<double> piece(static_cast<std::size_t>(e.numel)), pieces(piece.size() * static_cast<std::size_t>(s.parts));
    for (std::int64_t i = 0; i < e.numel; ++i) piece[static_cast<std::size_t>(i)] = convert<double>(mine[i]);
    tp.all_gather(std::span<const double>(piece), std::span<double>(pieces));
    std::vector<double> tensor(static_cast<std::size_t>(s.full.numel()));
    for (int q = 0; q < s.parts; ++q) {
      const tensor_shard theirs = s.of_rank(q);
      for (std::int64_t i = 0; i < e.numel; ++i)
        tensor[static_cast<std::size_t>(theirs.global_index(i))] = pieces[static_cast<std::size_t>(q * e.numel + i)];
    }
    full_model.insert(full_model.end(), tensor.begin(), tensor.begin() + kept);
  }
  return full_model;
}

}  // namespace strata
