// strata/comm/mesh_position.hpp - where a rank sits in the process mesh; pure, no MPI.
//
// World ranks are laid out as an array with one dimension per axis of policy/mesh_axes.hpp,
// [pp][dp][cp][tp] with tp varying fastest, so the ranks of a tensor-parallel group are
// consecutive (neighbours on one node, where the bandwidth is), context peers are tp apart,
// data-parallel peers cp·tp apart and pipeline stages dp·cp·tp apart:
//
//   rank = ((pp_rank · dp + dp_rank) · cp + cp_rank) · tp + tp_rank
//
//   pp=2 x dp=2 x tp=2:   stage 0: dp0 {0 1}  dp1 {2 3}     tp groups {0,1} {2,3} {4,5} {6,7}
//                         stage 1: dp0 {4 5}  dp1 {6 7}     dp groups {0,2} {1,3} {4,6} {5,7}
//                                                           pp groups {0,4} {1,5} {2,6} {3,7}
//
// A group spans a set of axes: the ranks that share every other coordinate. One per axis (tp,
// cp, dp, pp), and the gradient group over the axes that replicate parameters (dp × cp), in
// which a rank's place is its dp and cp coordinates in rank order (cp fastest). Expert
// parallelism cuts the gradient group in two ways (Megatron-Core's layout): the expert group is ep
// consecutive ranks of it (place g: group g / ep, rank g % ep) and the expert-data group the
// ranks ep apart (group g % ep, rank g / ep), those that hold the same experts.
// mesh_position_of() computes one rank's coordinates, the world ranks of its groups (in
// group-rank order), its pipeline neighbours, and its embedding group: the first and last stage
// of its pipeline, which hold the tied input embedding and LM head (just the rank itself when
// pp = 1). process_mesh (mesh.hpp) builds the MPI groups from exactly these numbers; tests check
// both against each other.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/policy/layout.hpp"
#include "strata/policy/mesh_axes.hpp"

namespace strata {

// A group of the mesh: the world ranks in group-rank order, this rank's place, and the color
// that splits the world into such groups (shared by the MPI mesh's MPI_Comm_split and the NCCL
// groups' ncclCommSplit, so both agree).
struct mesh_group {
  std::vector<int> ranks;
  int rank = 0;
  int color = 0;
};

struct mesh_position {
  int world_size = 1, rank = 0;
  int pp = 1, dp = 1, cp = 1, tp = 1;                      // degrees
  int pp_rank = 0, dp_rank = 0, cp_rank = 0, tp_rank = 0;  // coordinates; also the rank in each group

  std::vector<int> tp_group, cp_group, dp_group, pp_group;  // world ranks, in group-rank order
  // Over the axes that replicate parameters (dp × cp): where gradients are reduced and ZeRO
  // shards. Its rank is dp_rank · cp + cp_rank.
  std::vector<int> gradient_group;
  int gradient_rank = 0;
  int ep = 1, ep_rank = 0, expert_data_rank = 0;
  std::vector<int> expert_group, expert_data_group;  // world ranks, in group-rank order
  std::vector<int> embedding_group;                  // world ranks of the first and last stage
  bool in_embedding_group = false;

  // Pipeline neighbours as stages, i.e. ranks in the pp group (no_stage at the ends), and as
  // world ranks; the cyclic ones wrap around (for interleaved schedules).
  static constexpr int no_stage = -1;
  int prev_stage = no_stage, next_stage = no_stage;
  int prev_world_rank = no_stage, next_world_rank = no_stage;
  int prev_stage_cyclic = 0, next_stage_cyclic = 0;

  // The colors that split the world into these groups (one per group; -1: not a member).
  int tp_color = 0, cp_color = 0, dp_color = 0, pp_color = 0, gradient_color = 0, embedding_color = -1;
  int expert_color = 0, expert_data_color = 0;

  bool is_first_stage() const { return pp_rank == 0; }
  bool is_last_stage() const { return pp_rank == pp - 1; }
};

// The world rank at the given coordinates, one per axis in mesh_axes order.
inline int mesh_rank_at(const layout_config& cfg, const std::array<int, mesh_axis_count>& coords) {
  int rank = 0;
  for (std::size_t i = mesh_axis_count; i-- > 0;) rank = rank * cfg.degree(mesh_axes[i].axis) + coords[i];
  return rank;
}

// The world rank at coordinates (pp_rank, dp_rank, tp_rank), the context coordinate 0.
inline int mesh_rank_of(const layout_config& cfg, int pp_rank, int dp_rank, int tp_rank, int cp_rank = 0) {
  std::array<int, mesh_axis_count> c{};
  c[index_of(mesh_axis::tp)] = tp_rank;
  c[index_of(mesh_axis::cp)] = cp_rank;
  c[index_of(mesh_axis::dp)] = dp_rank;
  c[index_of(mesh_axis::pp)] = pp_rank;
  return mesh_rank_at(cfg, c);
}

// The coordinates of `rank`, one per axis.
inline std::array<int, mesh_axis_count> mesh_coordinates(const layout_config& cfg, int rank) {
  std::array<int, mesh_axis_count> c{};
  for (std::size_t i = 0; i < mesh_axis_count; ++i) {
    const int n = cfg.degree(mesh_axes[i].axis);
    c[i] = rank % n;
    rank /= n;
  }
  return c;
}

// The group of `rank` spanning `axes`: the ranks whose other coordinates are rank's, ordered by
// their coordinates on `axes` with the earlier axis in rank order fastest.
inline mesh_group mesh_group_of(const layout_config& cfg, int rank, mesh_axis_set axes) {
  const auto mine = mesh_coordinates(cfg, rank);
  mesh_group g;
  // Color: the coordinates off the group, as one number; place: the coordinates on it.
  int color = 0, place = 0;
  for (std::size_t i = mesh_axis_count; i-- > 0;) {
    const int n = cfg.degree(mesh_axes[i].axis);
    if (axes.contains(mesh_axes[i].axis)) place = place * n + mine[i];
    else color = color * n + mine[i];
  }
  g.color = color;
  g.rank = place;
  const int size = cfg.ranks(axes);
  for (int member = 0; member < size; ++member) {
    auto c = mine;
    int rest = member;
    for (std::size_t i = 0; i < mesh_axis_count; ++i)
      if (axes.contains(mesh_axes[i].axis)) {
        const int n = cfg.degree(mesh_axes[i].axis);
        c[i] = rest % n;
        rest /= n;
      }
    g.ranks.push_back(mesh_rank_at(cfg, c));
  }
  return g;
}

// The one line every rank prints when the degrees do not multiply to the world size.
inline std::string mesh_mismatch_message(const layout_config& cfg, int world_size) {
  return detail::concat("layout ", cfg.degrees_text(), " = ", cfg.ranks(), " ranks does not match the world size ",
                        world_size);
}

// Throws strata::error unless the degrees are positive and multiply to world_size.
inline void check_mesh(const layout_config& cfg, int world_size) {
  bool positive = true;
  for (const auto& a : mesh_axes) positive = positive && cfg.degree(a.axis) >= 1;
  STRATA_CHECK(positive, "layout ", cfg.degrees_text(),
               ": every degree must be >= 1 (resolve strata::dynamic degrees first)");
  STRATA_CHECK(cfg.ranks() == world_size, mesh_mismatch_message(cfg, world_size));
}

// Everything about `rank`'s place in the mesh, from the degrees alone.
inline mesh_position mesh_position_of(const layout_config& cfg, int world_size, int rank) {
  check_mesh(cfg, world_size);
  STRATA_CHECK(rank >= 0 && rank < world_size, "rank ", rank, " is not in a world of ", world_size);
  mesh_position m;
  m.world_size = world_size;
  m.rank = rank;
  m.pp = cfg.pp;
  m.dp = cfg.dp;
  m.cp = cfg.cp;
  m.tp = cfg.tp;
  const auto axis_group = [&](mesh_axis a, std::vector<int>& ranks, int& place, int& color) {
    mesh_group g = mesh_group_of(cfg, rank, {a});
    ranks = std::move(g.ranks);
    place = g.rank;
    color = g.color;
  };
  axis_group(mesh_axis::tp, m.tp_group, m.tp_rank, m.tp_color);
  axis_group(mesh_axis::cp, m.cp_group, m.cp_rank, m.cp_color);
  axis_group(mesh_axis::dp, m.dp_group, m.dp_rank, m.dp_color);
  axis_group(mesh_axis::pp, m.pp_group, m.pp_rank, m.pp_color);
  mesh_group grad = mesh_group_of(cfg, rank, mesh_axis_set::replicating());
  m.gradient_group = std::move(grad.ranks);
  m.gradient_rank = grad.rank;
  m.gradient_color = grad.color;

  STRATA_CHECK(cfg.ep >= 1 && int(m.gradient_group.size()) % cfg.ep == 0, "layout ep=", cfg.ep,
               " does not divide dp x cp = ", m.gradient_group.size());
  m.ep = cfg.ep;
  const int expert_groups = int(m.gradient_group.size()) / cfg.ep;
  m.ep_rank = m.gradient_rank % cfg.ep;
  m.expert_data_rank = m.gradient_rank / cfg.ep;
  for (int q = 0; q < cfg.ep; ++q)
    m.expert_group.push_back(m.gradient_group[std::size_t(m.expert_data_rank * cfg.ep + q)]);
  for (int q = 0; q < expert_groups; ++q)
    m.expert_data_group.push_back(m.gradient_group[std::size_t(q * cfg.ep + m.ep_rank)]);
  m.expert_color = m.gradient_color * expert_groups + m.expert_data_rank;
  m.expert_data_color = m.gradient_color * cfg.ep + m.ep_rank;

  m.embedding_group.push_back(m.pp_group.front());
  if (cfg.pp > 1) m.embedding_group.push_back(m.pp_group.back());
  m.in_embedding_group = m.is_first_stage() || m.is_last_stage();

  if (m.pp_rank > 0) {
    m.prev_stage = m.pp_rank - 1;
    m.prev_world_rank = m.pp_group[static_cast<std::size_t>(m.prev_stage)];
  }
  if (m.pp_rank < cfg.pp - 1) {
    m.next_stage = m.pp_rank + 1;
    m.next_world_rank = m.pp_group[static_cast<std::size_t>(m.next_stage)];
  }
  m.embedding_color = m.in_embedding_group ? m.pp_color : -1;

  m.prev_stage_cyclic = (m.pp_rank + cfg.pp - 1) % cfg.pp;
  m.next_stage_cyclic = (m.pp_rank + 1) % cfg.pp;
  return m;
}

}  // namespace strata
