// strata/parallel/pipeline_schedule.hpp - pipeline schedules as pure functions.
//
// p stages (ranks of the pipeline group), M micro-batches, V model chunks per stage. The model's
// layers form p·V virtual stages; virtual stage v = c·p + s is chunk c of stage s, so a
// micro-batch visits stage 0, 1, .., p-1, then stage 0 again (chunk 1), and so on (V = 1: each
// stage one contiguous piece). pipeline_actions(kind, p, M, V, s) is the ordered list of what
// stage s computes in one step; communication follows from it: the forward of (m, v) needs the
// activation of (m, v-1), the backward of (m, v) the gradient of (m, v+1).
//
//   gpipe        every forward, then every backward (M micro-batches in flight)
//   1f1b         p-s-1 warm-up forwards, then one forward / one backward, then the remaining
//                backwards (at most p micro-batches in flight on stage 0)
//   interleaved  1F1B over the V·M chunk-micro-batches, taken p micro-batches at a time through
//                the chunks (Narayanan et al. 2021); needs M divisible by p
//
// simulate() runs the lists with unit costs (a forward of one chunk takes forward_cost/V, a
// backward backward_cost/V, messages are free, a stage waits only for what it receives): it says
// whether the lists can deadlock, how long the step takes, each stage's idle share (the bubble)
// and how many chunk-micro-batches each stage holds at most. The tests hold the bubble to the
// analytic (p-1)/(M+p-1), and (p-1)/(V·M+p-1) interleaved. timeline() prints the lists.
#pragma once
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/extents.hpp"
#include "strata/policy/parallel.hpp"

namespace strata {

// Compile-time fit of a static pipeline to a model's depth:
//   static_assert(st::pipeline_layout_fits<Layout, /*layers*/ 12>);
// Layers that do not split evenly over stages x virtual chunks fail to compile in
// pipeline_chunks_divide_layers<8, 12> (which names the numbers); a dynamic degree passes here
// and is checked at start-up ("pipeline: 12 layers do not split evenly over ..."), and a model
// may also give its layers per stage explicitly.
template <int Chunks, std::int64_t Layers>
struct pipeline_chunks_divide_layers {
  static_assert(Layers % Chunks == 0,
                "strata::pipeline: the layers must split evenly over stages x virtual chunks (or be given per stage)");
  static constexpr bool value = true;
};
template <parallel_layout Layout, std::int64_t Layers>
inline constexpr bool pipeline_layout_fits = [] {
  if constexpr (is_dynamic(Layout::pp)) return true;
  else return pipeline_chunks_divide_layers<Layout::pp * Layout::virtual_chunks, Layers>::value;
}();

enum class pipeline_schedule_kind { gpipe, one_f_one_b, interleaved };

inline pipeline_schedule_kind parse_pipeline_schedule(std::string_view s) {
  if (s == "gpipe") return pipeline_schedule_kind::gpipe;
  if (s == "1f1b" || s == "one_f_one_b") return pipeline_schedule_kind::one_f_one_b;
  if (s == "interleaved" || s == "interleaved_1f1b") return pipeline_schedule_kind::interleaved;
  fail("pipeline: unknown schedule '", s, "' (gpipe, 1f1b or interleaved)");
}
inline std::string_view schedule_label(pipeline_schedule_kind k) {
  switch (k) {
    case pipeline_schedule_kind::gpipe: return "gpipe";
    case pipeline_schedule_kind::one_f_one_b: return "1f1b";
    case pipeline_schedule_kind::interleaved: return "interleaved";
  }
  return "?";
}

struct pipeline_action {
  enum kind_t { forward, backward } kind = forward;
  int microbatch = 0;
  int chunk = 0;
  bool operator==(const pipeline_action&) const = default;
};

struct pipeline_shape {
  pipeline_schedule_kind schedule = pipeline_schedule_kind::one_f_one_b;
  int stages = 1, microbatches = 1, chunks = 1;  // p, M, V

  int virtual_stages() const { return stages * chunks; }
  int virtual_stage(int stage, int chunk) const { return chunk * stages + stage; }

  // Throws (the same words on every rank) when the schedule cannot take these numbers.
  void validate() const {
    STRATA_CHECK(stages >= 1 && microbatches >= 1 && chunks >= 1, "pipeline: stages (", stages, "), microbatches (",
                 microbatches, ") and virtual chunks (", chunks, ") must be >= 1");
    if (schedule == pipeline_schedule_kind::interleaved)
      STRATA_CHECK(microbatches % stages == 0, "interleaved 1F1B needs microbatches (", microbatches,
                   ") divisible by the pipeline degree (", stages, ")");
    else
      STRATA_CHECK(chunks == 1, "pipeline: ", chunks, " virtual chunks per stage need the interleaved schedule (",
                   schedule_label(schedule), " runs one)");
  }
};

// What stage `stage` computes in one step, in order.
inline std::vector<pipeline_action> pipeline_actions(const pipeline_shape& sh, int stage) {
  sh.validate();
  STRATA_CHECK(stage >= 0 && stage < sh.stages, "pipeline: stage ", stage, " of ", sh.stages);
  const int p = sh.stages, M = sh.microbatches, V = sh.chunks;
  std::vector<pipeline_action> out;
  using A = pipeline_action;
  if (sh.schedule == pipeline_schedule_kind::gpipe) {
    for (int m = 0; m < M; ++m) out.push_back({A::forward, m, 0});
    for (int m = 0; m < M; ++m) out.push_back({A::backward, m, 0});
    return out;
  }
  // 1F1B over `total` units; unit k's micro-batch and chunk (plain 1F1B: V = 1, unit k = m).
  const int total = M * V;
  auto forward_unit = [&](int k) -> A {
    const int group = k / (p * V), in_group = k % (p * V);
    return {A::forward, group * p + in_group % p, in_group / p};
  };
  auto backward_unit = [&](int k) -> A {
    A a = forward_unit(k);
    a.kind = A::backward;
    a.chunk = V - 1 - a.chunk;  // backwards run the chunks last to first
    return a;
  };
  int warmup = 0;
  if (V == 1) warmup = std::min(p - stage - 1, M);
  else warmup = M == p ? total : std::min(total, (p - stage - 1) * 2 + (V - 1) * p);
  if (V == 1) {
    // Plain 1F1B: unit k is micro-batch k.
    for (int k = 0; k < warmup; ++k) out.push_back({A::forward, k, 0});
    for (int k = 0; k < M - warmup; ++k) {
      out.push_back({A::forward, warmup + k, 0});
      out.push_back({A::backward, k, 0});
    }
    for (int k = M - warmup; k < M; ++k) out.push_back({A::backward, k, 0});
    return out;
  }
  for (int k = 0; k < warmup; ++k) out.push_back(forward_unit(k));
  for (int k = 0; k < total - warmup; ++k) {
    out.push_back(forward_unit(warmup + k));
    out.push_back(backward_unit(k));
  }
  for (int k = total - warmup; k < total; ++k) out.push_back(backward_unit(k));
  return out;
}

struct pipeline_simulation {
  bool deadlock = false;
  std::string stuck;                // when deadlocked: what each stage waits for
  double step_time = 0;             // until the last stage finishes
  std::vector<double> busy, idle;   // per stage
  std::vector<int> peak_in_flight;  // chunk-micro-batches forwarded but not yet backwarded
  double bubble(int stage) const { return idle[std::size_t(stage)] / step_time; }
};

// Runs every stage's list with unit costs; see the top of the file.
inline pipeline_simulation simulate(const pipeline_shape& sh, double forward_cost = 1.0, double backward_cost = 2.0) {
  const int p = sh.stages, M = sh.microbatches, V = sh.chunks, VS = sh.virtual_stages();
  std::vector<std::vector<pipeline_action>> lists;
  for (int s = 0; s < p; ++s) lists.push_back(pipeline_actions(sh, s));
  // done[kind][m][v]: finish time, or -1 while not yet run.
  std::vector<double> done(std::size_t(2 * M * VS), -1.0);
  auto at = [&](int kind, int m, int v) -> double& { return done[std::size_t((kind * M + m) * VS + v)]; };
  std::vector<std::size_t> next(std::size_t(p), 0);
  std::vector<double> clock(std::size_t(p), 0.0);
  pipeline_simulation r;
  r.busy.assign(std::size_t(p), 0.0);
  r.peak_in_flight.assign(std::size_t(p), 0);
  std::vector<int> in_flight(std::size_t(p), 0);
  const double tf = forward_cost / V, tb = backward_cost / V;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      while (next[std::size_t(s)] < lists[std::size_t(s)].size()) {
        const auto& a = lists[std::size_t(s)][next[std::size_t(s)]];
        const int v = sh.virtual_stage(s, a.chunk);
        double ready = 0;
        if (a.kind == pipeline_action::forward && v > 0) ready = at(0, a.microbatch, v - 1);
        if (a.kind == pipeline_action::backward) {
          if (at(0, a.microbatch, v) < 0)
            fail("pipeline: stage ", s, " runs the backward of micro-batch ", a.microbatch, " chunk ", a.chunk,
                 " before its forward");
          ready = v + 1 < VS ? at(1, a.microbatch, v + 1) : at(0, a.microbatch, v);
        }
        if (ready < 0) break;  // waits for a message not yet sent
        const double start = std::max(clock[std::size_t(s)], ready);
        const double cost = a.kind == pipeline_action::forward ? tf : tb;
        clock[std::size_t(s)] = start + cost;
        r.busy[std::size_t(s)] += cost;
        at(a.kind == pipeline_action::forward ? 0 : 1, a.microbatch, v) = clock[std::size_t(s)];
        in_flight[std::size_t(s)] += a.kind == pipeline_action::forward ? 1 : -1;
        r.peak_in_flight[std::size_t(s)] = std::max(r.peak_in_flight[std::size_t(s)], in_flight[std::size_t(s)]);
        ++next[std::size_t(s)];
        progress = true;
      }
    }
  }
  std::ostringstream stuck;
  for (int s = 0; s < p; ++s)
    if (next[std::size_t(s)] < lists[std::size_t(s)].size()) {
      r.deadlock = true;
      const auto& a = lists[std::size_t(s)][next[std::size_t(s)]];
      stuck << "stage " << s << " waits at " << (a.kind == pipeline_action::forward ? "F" : "B") << a.microbatch << "."
            << a.chunk << "; ";
    }
  r.stuck = stuck.str();
  r.step_time = *std::max_element(clock.begin(), clock.end());
  for (int s = 0; s < p; ++s) r.idle.push_back(r.step_time - r.busy[std::size_t(s)]);
  return r;
}

// The analytic bubble share of the step (Narayanan et al. 2021): (p-1)/(M+p-1), and
// (p-1)/(V·M+p-1) for the interleaved schedule.
inline double analytic_bubble(const pipeline_shape& sh) {
  const double p = sh.stages, M = sh.microbatches, V = sh.chunks;
  return (p - 1) / (V * M + p - 1);
}

// One line per stage: F3.1 = forward of micro-batch 3, chunk 1 (".c" only when V > 1).
inline std::string timeline(const pipeline_shape& sh) {
  std::ostringstream os;
  os << schedule_label(sh.schedule) << ": " << sh.stages << " stages, " << sh.microbatches << " micro-batches";
  if (sh.chunks > 1) os << ", " << sh.chunks << " chunks per stage";
  os << '\n';
  for (int s = 0; s < sh.stages; ++s) {
    os << "stage " << s << ':';
    for (const auto& a : pipeline_actions(sh, s)) {
      os << ' ' << (a.kind == pipeline_action::forward ? 'F' : 'B') << a.microbatch;
      if (sh.chunks > 1) os << '.' << a.chunk;
    }
    os << '\n';
  }
  return os.str();
}

}  // namespace strata
