// Pipeline schedules as pure functions, tested without running a model: for every valid
// (schedule, p <= 8, M <= 32, V <= 4) each stage's list holds every (micro-batch, chunk) forward
// and backward exactly once, forward first; every message has its sender and receiver; the lists
// cannot deadlock; the bubble under unit costs equals the analytic one; and the micro-batches in
// flight are what each schedule promises.
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "strata/parallel/pipeline_schedule.hpp"

namespace st = strata;
using kind = st::pipeline_schedule_kind;

namespace {

std::vector<st::pipeline_shape> valid_shapes() {
  std::vector<st::pipeline_shape> out;
  for (auto k : {kind::gpipe, kind::one_f_one_b, kind::interleaved})
    for (int p = 1; p <= 8; ++p)
      for (int M = 1; M <= 32; ++M)
        for (int V = 1; V <= 4; ++V) {
          st::pipeline_shape sh{k, p, M, V};
          if ((k != kind::interleaved && V > 1) || (k == kind::interleaved && M % p != 0)) continue;
          out.push_back(sh);
        }
  return out;
}

}  // namespace

TEST_CASE("every stage runs each of its (micro-batch, chunk) forwards and backwards once, forward first") {
  int shapes = 0;
  for (const auto& sh : valid_shapes()) {
    ++shapes;
    for (int s = 0; s < sh.stages; ++s) {
      const auto list = st::pipeline_actions(sh, s);
      REQUIRE(list.size() == std::size_t(2 * sh.microbatches * sh.chunks));
      std::set<std::pair<int, int>> forwarded, backwarded;
      for (const auto& a : list) {
        const auto key = std::make_pair(a.microbatch, a.chunk);
        if (a.kind == st::pipeline_action::forward) {
          CHECK(forwarded.insert(key).second);
        } else {
          CHECK(forwarded.count(key) == 1);  // its forward came first, on this stage
          CHECK(backwarded.insert(key).second);
        }
      }
      CHECK(backwarded.size() == std::size_t(sh.microbatches * sh.chunks));
    }
  }
  CHECK(shapes == 852);
}

TEST_CASE("every send has its receive: a micro-batch visits every virtual stage once each way") {
  for (const auto& sh : valid_shapes()) {
    // (micro-batch, virtual stage) pairs forwarded and backwarded over all stages: each exactly
    // once, so each activation sent from v to v+1 (and gradient from v+1 to v) has one receiver.
    std::multiset<std::tuple<int, int, int>> seen;
    for (int s = 0; s < sh.stages; ++s)
      for (const auto& a : st::pipeline_actions(sh, s))
        seen.insert({int(a.kind), a.microbatch, sh.virtual_stage(s, a.chunk)});
    for (int m = 0; m < sh.microbatches; ++m)
      for (int v = 0; v < sh.virtual_stages(); ++v) {
        CHECK(seen.count({int(st::pipeline_action::forward), m, v}) == 1);
        CHECK(seen.count({int(st::pipeline_action::backward), m, v}) == 1);
      }
  }
}

TEST_CASE("no deadlock, and the bubble under unit costs is the analytic one") {
  for (const auto& sh : valid_shapes()) {
    CAPTURE(st::timeline(sh));
    for (double backward_cost : {1.0, 2.0}) {
      const auto sim = st::simulate(sh, 1.0, backward_cost);
      REQUIRE_FALSE(sim.deadlock);
      // (p-1)/(M+p-1), or (p-1)/(V·M+p-1) interleaved: every stage idles that share of the step.
      for (int s = 0; s < sh.stages; ++s) CHECK(std::abs(sim.bubble(s) - st::analytic_bubble(sh)) <= 1e-12);
    }
  }
  const auto sim = st::simulate({kind::one_f_one_b, 4, 8, 1});
  CHECK(sim.step_time == doctest::Approx((8 + 3) * 3.0));
}

TEST_CASE("micro-batches in flight: M for GPipe, p - s for 1F1B, the warm-up plus one interleaved") {
  // Interleaved with V chunks holds chunk-micro-batches: on stage 0, 2(p-1) + (V-1)p + 1 of
  // them, i.e. p + (p-1)/V micro-batches' worth of activations (each chunk is 1/V of the stage).
  for (const auto& sh : valid_shapes()) {
    const auto sim = st::simulate(sh);
    const int p = sh.stages, M = sh.microbatches, V = sh.chunks;
    for (int s = 0; s < p; ++s) {
      CAPTURE(st::timeline(sh));
      const int in_flight = sim.peak_in_flight[std::size_t(s)];  // chunk-micro-batches
      if (sh.schedule == kind::gpipe) CHECK(in_flight == M);
      if (sh.schedule == kind::one_f_one_b || (sh.schedule == kind::interleaved && V == 1))
        CHECK(in_flight == std::min(p - s, M));  // interleaved with V = 1 is 1F1B
      else if (sh.schedule == kind::interleaved) {
        const int warmup = M == p ? M * V : std::min(M * V, 2 * (p - s - 1) + (V - 1) * p);
        CHECK(in_flight == std::min(M * V, warmup + 1));
      }
    }
  }
}

TEST_CASE("schedules print as a timeline") {
  CHECK(st::timeline({kind::one_f_one_b, 2, 3, 1}) ==
        "1f1b: 2 stages, 3 micro-batches\n"
        "stage 0: F0 F1 B0 F2 B1 B2\n"
        "stage 1: F0 B0 F1 B1 F2 B2\n");
  CHECK(st::timeline({kind::interleaved, 2, 2, 2}) ==
        "interleaved: 2 stages, 2 micro-batches, 2 chunks per stage\n"
        "stage 0: F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0\n"
        "stage 1: F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0\n");
}

TEST_CASE("a schedule that cannot take the numbers says which") {
  CHECK_THROWS_WITH_AS(st::pipeline_actions({kind::interleaved, 4, 6, 2}, 0),
                       "interleaved 1F1B needs microbatches (6) divisible by the pipeline degree (4)", st::error);
  CHECK_THROWS_WITH_AS(st::pipeline_actions({kind::one_f_one_b, 2, 4, 2}, 0),
                       "pipeline: 2 virtual chunks per stage need the interleaved schedule (1f1b runs one)", st::error);
  CHECK_THROWS_WITH_AS(st::parse_pipeline_schedule("zigzag"),
                       "pipeline: unknown schedule 'zigzag' (gpipe, 1f1b or interleaved)", st::error);
}
