// strata/parallel/gather.hpp - the serial model's weights from a sharded one.
//
// Under tensor parallelism a rank holds a piece of each sharded parameter (tensor_shard says
// where each element sits in the full tensor); under pipeline parallelism a stage holds the
// parameters of its layers. These put the pieces back together, laid out like the serial
// model's flat weight buffer (the same parameters in the same order, full shapes, vocabulary
// padding dropped), so a split model can be compared with, or saved as, the unsplit one.
// Collective over the groups named.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "strata/comm/group_ref.hpp"
#include "strata/core/dtype.hpp"
#include "strata/layers/parameters.hpp"

namespace strata {

// One parameter, whole: its tensor-parallel pieces gathered over `tp` (as double).
// `weights`: this rank's flat weights, indexed like the store, in host memory (read here
// directly; data_parallel::full_weights gives such a copy).
template <class T>
std::vector<double> gather_full_parameter(const param_info& e, std::span<const T> weights, group_ref& tp) {
  const T* mine = weights.data() + e.offset;
  const tensor_shard& s = e.shard;
  const std::int64_t cols = s.full.rank >= 2 ? s.full[1] : 1;
  const std::int64_t kept = s.real_rows < 0 ? s.full.numel() : s.real_rows * cols;
  std::vector<double> tensor(static_cast<std::size_t>(s.sharded() ? s.full.numel() : kept));
  if (!s.sharded()) {
    for (std::int64_t i = 0; i < kept; ++i) tensor[static_cast<std::size_t>(i)] = convert<double>(mine[i]);
    return tensor;
  }
  std::vector<double> piece(static_cast<std::size_t>(e.numel)),
      pieces(piece.size() * static_cast<std::size_t>(s.parts));
  for (std::int64_t i = 0; i < e.numel; ++i) piece[static_cast<std::size_t>(i)] = convert<double>(mine[i]);
  tp.all_gather(std::span<const double>(piece), std::span<double>(pieces));
  for (int q = 0; q < s.parts; ++q) {
    const tensor_shard theirs = s.of_rank(q);
    for (std::int64_t i = 0; i < e.numel; ++i)
      tensor[static_cast<std::size_t>(theirs.global_index(i))] = pieces[static_cast<std::size_t>(q * e.numel + i)];
  }
  tensor.resize(static_cast<std::size_t>(kept));
  return tensor;
}

// Every parameter of this rank's store, whole, in the store's order (tensor parallelism only).
template <class T>
std::vector<double> gather_full_weights(const parameter_store<T>& store, std::span<const T> weights, group_ref& tp) {
  std::vector<double> out;
  for (const auto& e : store.entries()) {
    const auto whole = gather_full_parameter(e, weights, tp);
    out.insert(out.end(), whole.begin(), whole.end());
  }
  return out;
}

// The whole model in the serial order `names` (with each parameter's element count), from the
// stages of the pipeline group `pp`, the pieces of the tensor group `tp` and, under expert
// parallelism, the expert ranks of `ep` (each holds its share of the experts): each parameter
// comes from the first stage that owns it (not a replica), and within it from the first expert
// rank that holds it, broadcast to every rank.
template <class T>
std::vector<double> gather_model_weights(const parameter_store<T>& store, std::span<const T> weights,
                                         const std::vector<std::pair<std::string, std::int64_t>>& names, group_ref& tp,
                                         group_ref& pp, group_ref ep = {}) {
  std::vector<double> out;
  for (const auto& [name, count] : names) {
    const param_handle h = store.find(name);
    const bool mine = h.valid() && !store.info(h).replica;
    // The ranks of an expert group sit on one stage: settle the expert rank there first.
    double holder = mine ? double(ep.size() - ep.rank()) : 0.0;  // the lowest expert rank holding it wins
    ep.all_reduce(std::span<double>(&holder, 1), reduce_op::max);
    const bool stage_holds = holder > 0;
    const int ep_root = ep.size() - static_cast<int>(holder);
    double owner = stage_holds ? double(pp.size() - pp.rank()) : 0.0;  // the lowest stage that owns it wins
    pp.all_reduce(std::span<double>(&owner, 1), reduce_op::max);
    STRATA_CHECK(owner > 0, "gather_model_weights: no pipeline stage holds '", name, "'");
    const int root = pp.size() - static_cast<int>(owner);
    std::vector<double> values(static_cast<std::size_t>(count));
    if (mine) {
      auto whole = gather_full_parameter(store.info(h), weights, tp);
      STRATA_CHECK(static_cast<std::int64_t>(whole.size()) == count, "gather_model_weights: '", name, "' has ",
                   whole.size(), " elements here, ", count, " in the serial model");
      if (pp.rank() == root && ep.rank() == ep_root) values = std::move(whole);
    }
    if (stage_holds) ep.broadcast(std::span<double>(values), ep_root);
    pp.broadcast(std::span<double>(values), root);
    out.insert(out.end(), values.begin(), values.end());
  }
  return out;
}

// The inverse: sets this rank's weights (its pieces, its stage's parameters, replicas included)
// from the serial model's flat weights `serial`, laid out as `names` says. Padding rows get zero.
// Local, no communication: every rank reads what it needs from the same serial vector.
// `weights`: the store's flat weights, in the store's memory space (each parameter is built on
// the host, then copied there).
template <class T>
void scatter_model_weights(parameter_store<T>& store, std::span<T> weights,
                           const std::vector<std::pair<std::string, std::int64_t>>& names,
                           const std::vector<double>& serial) {
  std::int64_t offset = 0;
  for (const auto& [name, count] : names) {
    const param_handle h = store.find(name);
    if (h.valid()) {
      const param_info& e = store.info(h);
      const bool whole = !e.shard.sharded() && e.shard.real_rows < 0;
      STRATA_CHECK(!whole || e.numel == count, "scatter_model_weights: '", name, "' has ", e.numel, " elements here, ",
                   count, " in the serial model");
      std::vector<T> mine(static_cast<std::size_t>(e.numel));
      for (std::int64_t i = 0; i < e.numel; ++i) {
        if (!whole && e.shard.is_padding(i)) {
          mine[static_cast<std::size_t>(i)] = convert<T>(0.0);
          continue;
        }
        const std::int64_t g = whole ? i : e.shard.global_index(i);
        mine[static_cast<std::size_t>(i)] = convert<T>(serial[static_cast<std::size_t>(offset + g)]);
      }
      store.ledger().space().copy(weights.data() + e.offset, mine.data(), mine.size() * sizeof(T),
                                  copy_direction::host_to_space);
    }
    offset += count;
  }
  STRATA_CHECK(offset == static_cast<std::int64_t>(serial.size()), "scatter_model_weights: the serial layout has ",
               offset, " elements, the weights given ", serial.size());
}

}  // namespace strata
