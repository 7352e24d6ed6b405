// tests/mpi/test_mesh.cpp - the (pp, dp, cp, tp) mesh: the pure placement and the real MPI groups.
//
// The pure function is checked for many shapes (every factorisation of 1..12 ranks) against
// the rules, and against hand-written values for pp=3 x dp=2 x tp=1 and pp=2 x dp=2 x tp=2. The
// MPI mesh is built for every factorisation of the world size this test runs at, and its groups
// (members, order, names), neighbours and embedding group must equal the pure function's. With a
// context axis: every 4-factorisation of 1..12 ranks against the rank formula, and the MPI cp
// and gradient (dp x cp) groups against the pure ones.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <strata/comm/mesh.hpp>
#include <strata/comm/mesh_position.hpp>

#include "mpi_test.hpp"

using namespace strata_test;

namespace {

strata::layout_config shape(int pp, int dp, int tp) {
  strata::layout_config c;
  c.pp = pp;
  c.dp = dp;
  c.tp = tp;
  return c;
}

// Every (pp, dp, tp) with pp * dp * tp == n.
std::vector<strata::layout_config> factorisations(int n) {
  std::vector<strata::layout_config> out;
  for (int pp = 1; pp <= n; ++pp)
    for (int dp = 1; dp <= n; ++dp)
      if (n % (pp * dp) == 0) out.push_back(shape(pp, dp, n / (pp * dp)));
  return out;
}

std::string name_of(const strata::layout_config& c) {
  return "pp=" + std::to_string(c.pp) + " dp=" + std::to_string(c.dp) + " tp=" + std::to_string(c.tp);
}

// Every (pp, dp, cp, tp) with pp * dp * cp * tp == n.
std::vector<strata::layout_config> factorisations4(int n) {
  std::vector<strata::layout_config> out;
  for (int cp = 1; cp <= n; ++cp)
    if (n % cp == 0)
      for (auto c : factorisations(n / cp)) {
        c.cp = cp;
        out.push_back(c);
      }
  return out;
}

}  // namespace

TEST_CASE("mesh_position_of: with a context axis, rank = ((pp·dp + dp)·cp + cp)·tp + tp") {
  int shapes = 0;
  for (int n = 1; n <= 12; ++n) {
    for (const auto& cfg : factorisations4(n)) {
      ++shapes;
      CAPTURE(name_of(cfg) + " cp=" + std::to_string(cfg.cp));
      std::set<std::vector<int>> coords;
      for (int r = 0; r < n; ++r) {
        const auto m = strata::mesh_position_of(cfg, n, r);
        CHECK(((m.pp_rank * cfg.dp + m.dp_rank) * cfg.cp + m.cp_rank) * cfg.tp + m.tp_rank == r);
        CHECK(strata::mesh_rank_of(cfg, m.pp_rank, m.dp_rank, m.tp_rank, m.cp_rank) == r);
        coords.insert({m.pp_rank, m.dp_rank, m.cp_rank, m.tp_rank});
        REQUIRE(m.cp_group.size() == std::size_t(cfg.cp));
        CHECK(m.cp_group[std::size_t(m.cp_rank)] == r);
        for (int i = 1; i < cfg.cp; ++i) CHECK(m.cp_group[std::size_t(i)] - m.cp_group[std::size_t(i - 1)] == cfg.tp);
        for (int i = 1; i < cfg.dp; ++i)
          CHECK(m.dp_group[std::size_t(i)] - m.dp_group[std::size_t(i - 1)] == cfg.cp * cfg.tp);
        // The gradient group: every (dp, cp) of this rank's tp and pp place, cp fastest.
        std::vector<int> grads;
        for (int d = 0; d < cfg.dp; ++d)
          for (int c = 0; c < cfg.cp; ++c) grads.push_back(strata::mesh_rank_of(cfg, m.pp_rank, d, m.tp_rank, c));
        CHECK(m.gradient_group == grads);
        CHECK(m.gradient_rank == m.dp_rank * cfg.cp + m.cp_rank);
        CHECK(m.gradient_group[std::size_t(m.gradient_rank)] == r);
      }
      CHECK(coords.size() == std::size_t(n));
    }
  }
  CHECK(shapes == 133);  // sum over n = 1..12 of the ordered 4-factorisations of n
}

TEST_CASE("mesh_position_of: dp=2 x cp=2 x tp=2 by hand") {
  auto cfg = shape(1, 2, 2);
  cfg.cp = 2;
  const auto m = strata::mesh_position_of(cfg, 8, 5);  // dp 1, cp 0, tp 1
  CHECK(m.dp_rank == 1);
  CHECK(m.cp_rank == 0);
  CHECK(m.tp_rank == 1);
  CHECK(m.tp_group == std::vector<int>{4, 5});
  CHECK(m.cp_group == std::vector<int>{5, 7});
  CHECK(m.dp_group == std::vector<int>{1, 5});
  CHECK(m.gradient_group == std::vector<int>{1, 3, 5, 7});
  CHECK(m.gradient_rank == 2);
  CHECK_THROWS_WITH_AS(strata::mesh_position_of(cfg, 6, 0),
                       "layout dp=2 x cp=2 x tp=2 x pp=1 = 8 ranks does not match the world size 6", strata::error);
}

TEST_CASE("mesh_position_of: the expert groups cut the gradient group, dp=4 x cp=2 x tp=2, ep=4 by hand") {
  auto cfg = shape(1, 4, 2);
  cfg.cp = 2;
  cfg.ep = 4;
  // World rank 13: dp 3, cp 0, tp 1; its gradient group (tp 1) is {1,3,5,...,15}, where it is 6th.
  const auto m = strata::mesh_position_of(cfg, 16, 13);
  CHECK(m.gradient_group == std::vector<int>{1, 3, 5, 7, 9, 11, 13, 15});
  CHECK(m.gradient_rank == 6);
  CHECK(m.ep_rank == 2);
  CHECK(m.expert_data_rank == 1);
  CHECK(m.expert_group == std::vector<int>{9, 11, 13, 15});  // 4 consecutive members
  CHECK(m.expert_data_group == std::vector<int>{5, 13});     // those 4 apart: the same experts
  // Every rank's groups: a partition of each gradient group, the colors telling them apart.
  std::map<int, std::vector<int>> by_expert_color, by_data_color;
  for (int r = 0; r < 16; ++r) {
    const auto q = strata::mesh_position_of(cfg, 16, r);
    by_expert_color[q.expert_color].push_back(r);
    by_data_color[q.expert_data_color].push_back(r);
    CHECK(q.expert_group[std::size_t(q.ep_rank)] == r);
    CHECK(q.expert_data_group[std::size_t(q.expert_data_rank)] == r);
  }
  CHECK(by_expert_color.size() == 4);  // 2 gradient groups x 2 expert groups
  CHECK(by_data_color.size() == 8);    // 2 gradient groups x 4 expert ranks
}

TEST_CASE("process_mesh: the expert groups equal the pure placement") {
  auto& w = world();
  const int n = w.size(), r = w.rank();
  for (auto cfg : factorisations4(n)) {
    const int grads = cfg.dp * cfg.cp;
    for (int ep = 2; ep <= grads; ++ep) {
      if (grads % ep) continue;
      cfg.ep = ep;
      CAPTURE(name_of(cfg) + " cp=" + std::to_string(cfg.cp) + " ep=" + std::to_string(ep));
      strata::process_mesh mesh(w, cfg);
      const auto expect = strata::mesh_position_of(cfg, n, r);
      REQUIRE(mesh.experts() != nullptr);
      CHECK(mesh.experts()->name() == "ep");
      CHECK(mesh.experts()->world_ranks() == expect.expert_group);
      CHECK(mesh.experts()->rank() == expect.ep_rank);
      CHECK(mesh.expert_data().name() == "edp");
      CHECK(mesh.expert_data().world_ranks() == expect.expert_data_group);
      CHECK(mesh.expert_data().rank() == expect.expert_data_rank);
    }
  }
}

TEST_CASE("process_mesh: the context and gradient groups equal the pure placement") {
  auto& w = world();
  const int n = w.size(), r = w.rank();
  for (const auto& cfg : factorisations4(n)) {
    CAPTURE(name_of(cfg) + " cp=" + std::to_string(cfg.cp));
    strata::process_mesh mesh(w, cfg);
    const auto expect = strata::mesh_position_of(cfg, n, r);
    CHECK(mesh.cp().name() == "cp");
    CHECK(mesh.cp().world_ranks() == expect.cp_group);
    CHECK(mesh.cp().rank() == expect.cp_rank);
    CHECK(mesh.gradients().world_ranks() == expect.gradient_group);
    CHECK(mesh.gradients().rank() == expect.gradient_rank);
    CHECK(mesh.gradients().name() == (cfg.cp > 1 ? "dp_cp" : "dp"));
    std::vector<double> v{double(r)};
    mesh.gradients().all_reduce(v);
    CHECK(v[0] == double(std::accumulate(expect.gradient_group.begin(), expect.gradient_group.end(), 0)));
    const std::string json = mesh.counters_json();
    CHECK((json.find("\"dp_cp\":{\"all_reduce\":{\"calls\":1") != std::string::npos) == (cfg.cp > 1));
  }
}

TEST_CASE("mesh_position_of: rules hold for every shape up to 12 ranks") {
  int shapes = 0;
  for (int n = 1; n <= 12; ++n) {
    for (const auto& cfg : factorisations(n)) {
      ++shapes;
      CAPTURE(name_of(cfg));
      std::set<std::vector<int>> coords;
      for (int r = 0; r < n; ++r) {
        const auto m = strata::mesh_position_of(cfg, n, r);
        CHECK(strata::mesh_rank_of(cfg, m.pp_rank, m.dp_rank, m.tp_rank) == r);
        coords.insert({m.pp_rank, m.dp_rank, m.tp_rank});
        REQUIRE(m.tp_group.size() == std::size_t(cfg.tp));
        REQUIRE(m.dp_group.size() == std::size_t(cfg.dp));
        REQUIRE(m.pp_group.size() == std::size_t(cfg.pp));
        // Group rank = coordinate; tp peers consecutive, dp peers tp apart, stages dp*tp apart.
        CHECK(m.tp_group[std::size_t(m.tp_rank)] == r);
        CHECK(m.dp_group[std::size_t(m.dp_rank)] == r);
        CHECK(m.pp_group[std::size_t(m.pp_rank)] == r);
        for (int i = 1; i < cfg.tp; ++i) CHECK(m.tp_group[std::size_t(i)] - m.tp_group[std::size_t(i - 1)] == 1);
        for (int i = 1; i < cfg.dp; ++i) CHECK(m.dp_group[std::size_t(i)] - m.dp_group[std::size_t(i - 1)] == cfg.tp);
        for (int i = 1; i < cfg.pp; ++i)
          CHECK(m.pp_group[std::size_t(i)] - m.pp_group[std::size_t(i - 1)] == cfg.tp * cfg.dp);
        // Neighbours.
        CHECK(m.prev_stage == (m.pp_rank > 0 ? m.pp_rank - 1 : strata::no_peer));
        CHECK(m.next_stage == (m.pp_rank < cfg.pp - 1 ? m.pp_rank + 1 : strata::no_peer));
        CHECK(m.prev_world_rank == (m.pp_rank > 0 ? r - cfg.tp * cfg.dp : -1));
        CHECK(m.next_world_rank == (m.pp_rank < cfg.pp - 1 ? r + cfg.tp * cfg.dp : -1));
        CHECK(m.next_stage_cyclic == (m.pp_rank + 1) % cfg.pp);
        CHECK(m.prev_stage_cyclic == (m.pp_rank + cfg.pp - 1) % cfg.pp);
        // Embedding group: first and last stage of this pipeline.
        std::vector<int> emb{m.pp_group.front()};
        if (cfg.pp > 1) emb.push_back(m.pp_group.back());
        CHECK(m.embedding_group == emb);
        CHECK(m.in_embedding_group == (m.pp_rank == 0 || m.pp_rank == cfg.pp - 1));
      }
      CHECK(coords.size() == std::size_t(n));  // a bijection
    }
  }
  CHECK(shapes == 74);  // sum over n = 1..12 of the ordered 3-factorisations of n
}

TEST_CASE("mesh_position_of: pp=3 x dp=2 x tp=1 by hand") {
  const auto cfg = shape(3, 2, 1);
  const auto m = strata::mesh_position_of(cfg, 6, 3);
  CHECK(m.pp_rank == 1);
  CHECK(m.dp_rank == 1);
  CHECK(m.tp_rank == 0);
  CHECK(m.tp_group == std::vector<int>{3});
  CHECK(m.dp_group == std::vector<int>{2, 3});
  CHECK(m.pp_group == std::vector<int>{1, 3, 5});
  CHECK(m.prev_world_rank == 1);
  CHECK(m.next_world_rank == 5);
  CHECK(m.embedding_group == std::vector<int>{1, 5});
  CHECK_FALSE(m.in_embedding_group);
  const auto last = strata::mesh_position_of(cfg, 6, 4);
  CHECK(last.pp_rank == 2);
  CHECK(last.is_last_stage());
  CHECK(last.next_stage == strata::no_peer);
  CHECK(last.in_embedding_group);
  CHECK(last.embedding_group == std::vector<int>{0, 4});
}

TEST_CASE("mesh_position_of: pp=2 x dp=2 x tp=2 by hand") {
  const auto cfg = shape(2, 2, 2);
  const auto m = strata::mesh_position_of(cfg, 8, 5);
  CHECK(m.pp_rank == 1);
  CHECK(m.dp_rank == 0);
  CHECK(m.tp_rank == 1);
  CHECK(m.tp_group == std::vector<int>{4, 5});
  CHECK(m.dp_group == std::vector<int>{5, 7});
  CHECK(m.pp_group == std::vector<int>{1, 5});
  CHECK(m.prev_world_rank == 1);
  CHECK(m.embedding_group == std::vector<int>{1, 5});
}

TEST_CASE("mesh_position_of: a world size the degrees do not match is an error naming both") {
  CHECK_THROWS_WITH_AS(strata::mesh_position_of(shape(1, 2, 2), 3, 0),
                       "layout dp=2 x tp=2 x pp=1 = 4 ranks does not match the world size 3", strata::error);
  CHECK_THROWS_WITH_AS(strata::mesh_position_of(shape(3, 2, 1), 8, 0),
                       "layout dp=2 x tp=1 x pp=3 = 6 ranks does not match the world size 8", strata::error);
  CHECK_THROWS_AS(strata::mesh_position_of(shape(1, 0, 1), 0, 0), strata::error);
  // resolve_layout says the same words.
  strata::layout_config declared = shape(1, 2, 2);
  CHECK_THROWS_WITH_AS((void)strata::resolve_layout(declared, 3),
                       "layout dp=2 x tp=2 x pp=1 = 4 ranks does not match the world size 3", strata::error);
}

TEST_CASE("process_mesh: MPI groups equal the pure placement, for every shape of this world") {
  auto& w = world();
  const int n = w.size(), r = w.rank();
  for (const auto& cfg : factorisations(n)) {
    CAPTURE(name_of(cfg));
    strata::process_mesh mesh(w, cfg);
    const auto expect = strata::mesh_position_of(cfg, n, r);
    const auto& m = mesh.position();
    CHECK(m.pp_rank == expect.pp_rank);
    CHECK(m.dp_rank == expect.dp_rank);
    CHECK(m.tp_rank == expect.tp_rank);
    CHECK(mesh.tp().name() == "tp");
    CHECK(mesh.dp().name() == "dp");
    CHECK(mesh.pp().name() == "pp");
    CHECK(mesh.world().name() == "world");
    CHECK(mesh.tp().world_ranks() == expect.tp_group);
    CHECK(mesh.dp().world_ranks() == expect.dp_group);
    CHECK(mesh.pp().world_ranks() == expect.pp_group);
    CHECK(mesh.tp().rank() == expect.tp_rank);
    CHECK(mesh.dp().rank() == expect.dp_rank);
    CHECK(mesh.pp().rank() == expect.pp_rank);
    REQUIRE((mesh.embedding() != nullptr) == expect.in_embedding_group);
    if (mesh.embedding()) {
      CHECK(mesh.embedding()->name() == "embedding");
      CHECK(mesh.embedding()->world_ranks() == expect.embedding_group);
    }

    // Each group sums its members' world ranks: membership seen through communication.
    auto group_sum = [&](strata::mpi_communicator& g, const std::vector<int>& members) {
      std::vector<double> v{double(r)};
      g.all_reduce(v);
      CHECK(v[0] == double(std::accumulate(members.begin(), members.end(), 0)));
    };
    group_sum(mesh.tp(), expect.tp_group);
    group_sum(mesh.dp(), expect.dp_group);
    group_sum(mesh.pp(), expect.pp_group);
    if (mesh.embedding()) group_sum(*mesh.embedding(), expect.embedding_group);

    // The pipeline: activations forward, gradients back, posted together on every stage
    // (the ends' missing neighbours are no_peer and skipped).
    std::vector<float> act_out{float(r)}, act_in{-1.0f}, grad_out{float(100 + r)}, grad_in{-1.0f};
    mesh.pp().p2p({strata::send_to(mesh.next_stage(), act_out), strata::recv_from(mesh.prev_stage(), act_in),
                   strata::send_to(mesh.prev_stage(), grad_out), strata::recv_from(mesh.next_stage(), grad_in)});
    CHECK(act_in[0] == (expect.prev_world_rank >= 0 ? float(expect.prev_world_rank) : -1.0f));
    CHECK(grad_in[0] == (expect.next_world_rank >= 0 ? float(100 + expect.next_world_rank) : -1.0f));

    // Counters are per group, and the mesh prints them as the metrics' comm object.
    CHECK(mesh.tp().counters()[strata::op_kind::all_reduce].calls == 1);
    const std::string json = mesh.counters_json();
    CHECK(json.find("\"world\":") != std::string::npos);
    CHECK(json.find("\"dp\":{\"all_reduce\":{\"calls\":1") != std::string::npos);
    CHECK((json.find("\"embedding\":") != std::string::npos) == expect.in_embedding_group);
  }
}

TEST_CASE("process_mesh: a mismatched layout throws the same words on every rank, before communicating") {
  auto& w = world();
  strata::layout_config cfg = shape(1, w.size() + 1, 1);
  CHECK_THROWS_WITH_AS(strata::process_mesh(w, cfg), strata::mesh_mismatch_message(cfg, w.size()).c_str(),
                       strata::error);
  w.comm().barrier();  // every rank got here: nothing was left waiting
}
