// strata/comm/mesh_position.hpp - where a rank sits in the (pp, dp, tp) process mesh; pure, no MPI.
//
// World ranks are laid out as a 3-D array [pp][dp][tp] with tp varying fastest, so the ranks of
// a tensor-parallel group are consecutive (neighbours on one node, where the bandwidth is),
// data-parallel peers are tp apart and pipeline stages dp * tp apart:
//
//   rank = (pp_rank * dp + dp_rank) * tp + tp_rank
//
//   pp=2 x dp=2 x tp=2:   stage 0: dp0 {0 1}  dp1 {2 3}     tp groups {0,1} {2,3} {4,5} {6,7}
//                         stage 1: dp0 {4 5}  dp1 {6 7}     dp groups {0,2} {1,3} {4,6} {5,7}
//                                                           pp groups {0,4} {1,5} {2,6} {3,7}
//
// mesh_position_of() computes one rank's coordinates, the world ranks of its three groups (in
// group-rank order: a group's rank is the rank's coordinate on that axis), its pipeline
// neighbours, and its embedding group: the first and last stage of its pipeline, which hold the
// tied input embedding and LM head (just the rank itself when pp = 1). process_mesh (mesh.hpp)
// builds the MPI groups from exactly these numbers; tests check both against each other.
#pragma once
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/policy/layout.hpp"

namespace strata {

struct mesh_position {
  int world_size = 1, rank = 0;
  int pp = 1, dp = 1, tp = 1;                 // degrees
  int pp_rank = 0, dp_rank = 0, tp_rank = 0;  // coordinates; also the rank in each group

  std::vector<int> tp_group, dp_group, pp_group;  // world ranks, in group-rank order
  std::vector<int> embedding_group;               // world ranks of the first and last stage
  bool in_embedding_group = false;

  // Pipeline neighbours as stages, i.e. ranks in the pp group (no_stage at the ends), and as
  // world ranks; the cyclic ones wrap around (for interleaved schedules).
  static constexpr int no_stage = -1;
  int prev_stage = no_stage, next_stage = no_stage;
  int prev_world_rank = no_stage, next_world_rank = no_stage;
  int prev_stage_cyclic = 0, next_stage_cyclic = 0;

  // The colors that split the world into these groups (one per group; -1: not a member), shared
  // by the MPI mesh (MPI_Comm_split) and the NCCL groups (ncclCommSplit) so both agree.
  int tp_color = 0, dp_color = 0, pp_color = 0, embedding_color = -1;

  bool is_first_stage() const { return pp_rank == 0; }
  bool is_last_stage() const { return pp_rank == pp - 1; }
};

// The world rank at coordinates (pp_rank, dp_rank, tp_rank).
inline int mesh_rank_of(const layout_config& cfg, int pp_rank, int dp_rank, int tp_rank) {
  return (pp_rank * cfg.dp + dp_rank) * cfg.tp + tp_rank;
}

// The one line every rank prints when the degrees do not multiply to the world size.
inline std::string mesh_mismatch_message(const layout_config& cfg, int world_size) {
  return detail::concat("layout dp=", cfg.dp, " x tp=", cfg.tp, " x pp=", cfg.pp, " = ", cfg.ranks(),
                        " ranks does not match the world size ", world_size);
}

// Throws strata::error unless the degrees are positive and multiply to world_size.
inline void check_mesh(const layout_config& cfg, int world_size) {
  STRATA_CHECK(cfg.dp >= 1 && cfg.tp >= 1 && cfg.pp >= 1, "layout dp=", cfg.dp, " x tp=", cfg.tp, " x pp=", cfg.pp,
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
  m.tp = cfg.tp;
  m.tp_rank = rank % cfg.tp;
  m.dp_rank = (rank / cfg.tp) % cfg.dp;
  m.pp_rank = rank / (cfg.tp * cfg.dp);

  for (int t = 0; t < cfg.tp; ++t) m.tp_group.push_back(mesh_rank_of(cfg, m.pp_rank, m.dp_rank, t));
  for (int d = 0; d < cfg.dp; ++d) m.dp_group.push_back(mesh_rank_of(cfg, m.pp_rank, d, m.tp_rank));
  for (int p = 0; p < cfg.pp; ++p) m.pp_group.push_back(mesh_rank_of(cfg, p, m.dp_rank, m.tp_rank));

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
  m.tp_color = m.pp_rank * cfg.dp + m.dp_rank;
  m.dp_color = m.pp_rank * cfg.tp + m.tp_rank;
  m.pp_color = m.dp_rank * cfg.tp + m.tp_rank;
  m.embedding_color = m.in_embedding_group ? m.pp_color : -1;

  m.prev_stage_cyclic = (m.pp_rank + cfg.pp - 1) % cfg.pp;
  m.next_stage_cyclic = (m.pp_rank + 1) % cfg.pp;
  return m;
}

}  // namespace strata
