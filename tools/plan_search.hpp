// tools/plan_search.hpp - strata-plan --search: every layout of the GPUs that fits, ranked by the
// step-time model.
//
// The search walks the layouts the shape allows (tensor degrees within a node that suit the
// heads, context degrees whose chunks divide the sequence, pipelines that divide the blocks),
// with every schedule, micro-batch, ZeRO stage, sequence parallelism and recomputation, but for
// the settings given, which pin every candidate (e.g. to a published run's). Each is planned as
// the plan mode plans it; the ones whose busiest rank fits the device are ranked fastest first,
// as a table or JSON, and --rank-layout says where one layout of interest ranks.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <strata/core/json_number.hpp>
#include <strata/plan/plan.hpp>

#include "plan_estimate.hpp"
#include "plan_options.hpp"
#include "plan_setup.hpp"
#include "plan_text.hpp"

namespace strata_plan {

struct candidate {
  int dp = 1, cp = 1, tp = 1, pp = 1, v = 1, zero = 0;
  std::string cp_form = "ring";
  std::int64_t micro = 1;
  bool sp = false;
  st::recompute_mode recompute = st::recompute_mode::none;
  st::plan_result plan;
  step_estimate est;
};

// The candidates that fit, and how many the planner took (fitting or not).
struct search_result {
  std::vector<candidate> fitting;
  std::int64_t considered = 0;
};

// Context-parallel degrees under a tensor degree: those whose 2·cp chunks divide the sequence;
// the ring form always, all-to-all where this tensor rank's query and key/value heads divide by cp.
template <class F>
std::vector<std::pair<int, std::string>> context_degrees(const options& o, const typename F::dims& m, int tp) {
  std::vector<std::pair<int, std::string>> contexts;
  const int G = o.gpus;
  for (int cp = 1; cp <= G / tp; ++cp) {
    if (o.pin_cp && cp != o.cp) continue;
    if ((G / tp) % cp || !context_problem(m, tp, cp, "ring").empty()) continue;
    contexts.emplace_back(cp, "ring");
    if (cp > 1 && context_problem(m, tp, cp, "all_to_all").empty()) contexts.emplace_back(cp, "all_to_all");
  }
  return contexts;
}

// One layout and micro-batch of the search, before its ZeRO stage, sequence parallelism and
// recomputation are chosen. microbatches: per step and data-parallel rank.
struct search_layout {
  int dp, cp, tp, pp, v;
  std::string cp_form;
  std::int64_t micro, microbatches;
  st::pipeline_schedule_kind schedule;
};

// Every ZeRO stage, sequence parallelism and recomputation of one layout: each the planner takes
// is considered, and those that fit join the result with their estimate.
template <class F>
void search_settings(const options& o, const typename F::dims& m, const st::hw::device_spec& d, const search_layout& l,
                     search_result& out) {
  const auto opt = o.optimizer == "sgd" ? st::optimizer_kind::sgd : st::optimizer_kind::adamw;
  for (int zero = 0; zero <= 3; ++zero) {
    if (o.pin_zero && zero != o.zero) continue;
    if (l.pp > 1 && zero > 1) continue;
    if (l.dp * l.cp == 1 && zero > 0) continue;  // nothing to shard over: the same plan as ZeRO-0
    for (const bool sp : {false, true}) {
      if (sp && (l.tp == 1 || (m.seq / l.cp) % l.tp)) continue;
      if (o.pin_sp && sp != o.sp) continue;
      for (const auto rc : {st::recompute_mode::none, st::recompute_mode::selective, st::recompute_mode::full}) {
        if (o.pin_recompute && rc != st::parse_recompute_mode(o.recompute)) continue;
        candidate c{l.dp, l.cp, l.tp, l.pp, l.v, zero, l.cp_form, l.micro, sp, rc, {}, {}};
        const st::plan_setup s =
            make_setup(l.dp, l.cp, l.cp_form, l.tp, l.pp, l.v, zero, sp, l.microbatches, rc, opt, l.schedule, o.ep);
        const st::batch b{.micro = l.micro, .global = o.global_batch};
        try {
          c.plan = plan_with<F>(o.precision, m, b, s);
        } catch (const st::error&) {
          continue;  // a combination the planner refuses is not a candidate
        }
        ++out.considered;
        if (!c.plan.fits(d)) continue;
        c.est = estimate_step(c.plan, s, m, b, d);
        out.fitting.push_back(c);
      }
    }
  }
}

// Every layout of the GPUs the shape allows, planned; the fitting ones in the order found.
template <class F>
search_result search_layouts(const options& o, const typename F::dims& m, const st::hw::device_spec& d) {
  const int G = o.gpus;
  const std::int64_t B = o.global_batch;
  search_result out;
  for (int tp = 1; tp <= std::min(G, d.gpus_per_node); ++tp) {
    if (G % tp || !tensor_degree_fits<F>(m, tp)) continue;
    for (const auto& [cp, form] : context_degrees<F>(o, m, tp)) {
      for (int pp = 1; pp <= G / (tp * cp); ++pp) {
        if ((G / (tp * cp)) % pp || m.layers % pp) continue;
        const int dp = G / (tp * cp * pp);
        if (B % dp) continue;
        if ((dp * cp) % o.ep) continue;  // --ep stays as given: its expert group lies within dp x cp
        for (const int v : {1, 2, 4}) {
          if (v > 1 && (pp == 1 || m.layers % (pp * v))) continue;
          if (o.pin_schedule && (v > 1) != (o.schedule == "interleaved")) continue;
          const auto schedule =
              v > 1 ? st::pipeline_schedule_kind::interleaved : st::pipeline_schedule_kind::one_f_one_b;
          for (const std::int64_t micro : {1, 2, 4, 8}) {
            if ((B / dp) % micro) continue;
            const std::int64_t M = B / (dp * micro);
            if (v > 1 && M % pp) continue;
            search_settings<F>(o, m, d, {dp, cp, tp, pp, v, form, micro, M, schedule}, out);
          }
        }
      }
    }
  }
  return out;
}

// Fastest first; equal times prefer fewer bytes, then the simpler layout.
inline void rank_fastest_first(std::vector<candidate>& fitting) {
  std::sort(fitting.begin(), fitting.end(), [](const candidate& a, const candidate& b) {
    if (a.est.time.step_s != b.est.time.step_s) return a.est.time.step_s < b.est.time.step_s;
    if (a.plan.total_bytes() != b.plan.total_bytes()) return a.plan.total_bytes() < b.plan.total_bytes();
    return std::tuple(a.pp, a.cp, a.cp_form, a.tp, a.v, a.zero, a.micro, a.sp, int(a.recompute)) <
           std::tuple(b.pp, b.cp, b.cp_form, b.tp, b.v, b.zero, b.micro, b.sp, int(b.recompute));
  });
}

template <class F>
void print_search_json(const options& o, const std::vector<candidate>& fitting, std::size_t shown) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < shown; ++i) {
    const candidate& c = fitting[i];
    out.push_back({{"model", F::name},
                   {"dp", c.dp},
                   {"cp", c.cp},
                   {"context_form", c.cp_form},
                   {"ep", o.ep},
                   {"tp", c.tp},
                   {"pp", c.pp},
                   {"virtual", c.v},
                   {"zero", c.zero},
                   {"micro_batch", c.micro},
                   {"sp", c.sp},
                   {"recompute", recompute_name(c.recompute)},
                   {"step_time_s", st::json_number(c.est.time.step_s)},
                   {"tokens_per_s", st::json_number(c.est.tokens_per_s)},
                   {"tflops_per_gpu", st::json_number(c.est.tflops_per_gpu)},
                   {"hardware_tflops_per_gpu", st::json_number(c.est.hardware_tflops_per_gpu)},
                   {"mfu", st::json_number(c.est.mfu)},
                   {"total_bytes", c.plan.total_bytes()}});
  }
  std::printf("%s\n", out.dump().c_str());
}

// What the ranking is of: the model, the GPUs, training, and the settings every layout keeps.
template <class F>
void print_search_heading(const options& o, const typename F::dims& m, const st::hw::device_spec& d,
                          const search_result& result, std::size_t shown) {
  const auto opt = o.optimizer == "sgd" ? st::optimizer_kind::sgd : st::optimizer_kind::adamw;
  std::printf("strata-plan --search: %s, global batch %lld\n", F::shape_text(m).c_str(), (long long)o.global_batch);
  std::printf("on %d x %s\n", o.gpus, device_text(d, storage_bytes_of(o.precision)).c_str());
  std::printf("%s, %s; step-time model per op, ranks placed tp, cp, dp, pp (see --help)\n",
              precision_text(o.precision).c_str(), opt == st::optimizer_kind::adamw ? "AdamW" : "SGD with momentum");
  if (o.ep > 1)
    std::printf(
        "expert parallel ep %d in every layout (within dp x cp: those where it does not divide dp x cp are not "
        "considered)\n",
        o.ep);
  std::string pins;
  const auto pin = [&](bool given, const std::string& text) {
    if (given) pins += (pins.empty() ? "" : ", ") + text;
  };
  pin(o.pin_cp, "cp " + std::to_string(o.cp));
  pin(o.pin_zero, "ZeRO-" + std::to_string(o.zero));
  pin(o.pin_sp, o.sp ? "sequence parallel" : "no sequence parallelism");
  pin(o.pin_recompute, o.recompute + " recomputation");
  pin(o.pin_schedule, "the " + o.schedule + " schedule");
  if (!pins.empty()) std::printf("every layout with %s (as given)\n", pins.c_str());
  std::printf("%lld layouts considered, %zu fit; the best %zu:\n\n", (long long)result.considered,
              result.fitting.size(), shown);
}

inline void print_search_table(const std::vector<candidate>& fitting, std::size_t shown, const st::hw::device_spec& d) {
  std::printf("%3s %4s %3s %-10s %3s %3s %3s %4s %3s %3s %-9s %9s %12s %11s %6s %9s %7s\n", "#", "dp", "cp", "form",
              "tp", "pp", "v", "zero", "mb", "sp", "recompute", "step", "tokens/s", "TFLOP/s/GPU", "MFU", "GB/rank",
              "of dev");
  for (std::size_t i = 0; i < shown; ++i) {
    const candidate& c = fitting[i];
    std::printf("%3zu %4d %3d %-10s %3d %3d %3d %4d %3lld %3s %-9s %9s %12s %11.1f %6s %9s %7s\n", i + 1, c.dp, c.cp,
                c.cp > 1 ? c.cp_form.c_str() : "-", c.tp, c.pp, c.v, c.zero, (long long)c.micro, c.sp ? "on" : "off",
                recompute_name(c.recompute), seconds_text(c.est.time.step_s).c_str(),
                grouped(std::llround(c.est.tokens_per_s)).c_str(), c.est.tflops_per_gpu, percent(c.est.mfu).c_str(),
                gb(double(c.plan.total_bytes())).c_str(),
                percent(double(c.plan.total_bytes()) / d.memory_bytes).c_str());
  }
}

// --rank-layout: where the best layout of these degrees ranks; 1 where none of them fits.
inline int print_layout_rank(const options& o, const std::vector<candidate>& fitting) {
  const int tp = o.rank_layout[0], pp = o.rank_layout[1], dp = o.rank_layout[2];
  const auto it = std::find_if(fitting.begin(), fitting.end(),
                               [&](const candidate& c) { return c.tp == tp && c.pp == pp && c.dp == dp; });
  if (it == fitting.end()) {
    std::printf("\ntp %d pp %d dp %d: no layout with these degrees fits\n", tp, pp, dp);
    return 1;
  }
  std::printf("\ntp %d pp %d dp %d ranks %td of %zu (its best: %s); the first is %.1f%% faster\n", tp, pp, dp,
              it - fitting.begin() + 1, fitting.size(), seconds_text(it->est.time.step_s).c_str(),
              100.0 * (it->est.time.step_s / fitting.front().est.time.step_s - 1));
  return 0;
}

template <class F>
int run_search(const options& o, const typename F::dims& m, const st::hw::device_spec& d) {
  search_result result = search_layouts<F>(o, m, d);
  std::vector<candidate>& fitting = result.fitting;
  rank_fastest_first(fitting);
  const std::size_t shown = std::min<std::size_t>(fitting.size(), std::size_t(o.top));

  if (fitting.empty()) {
    if (o.json) std::printf("[]\n");
    std::fprintf(stderr,
                 "strata-plan: error: none of the %lld layouts of %d x %s fits its memory (%g GB per GPU); "
                 "try more GPUs or a device with more memory\n",
                 (long long)result.considered, o.gpus, std::string(d.name).c_str(), d.memory_bytes / 1e9);
    return 1;
  }
  if (o.json) {
    print_search_json<F>(o, fitting, shown);
    return 0;
  }
  print_search_heading<F>(o, m, d, result, shown);
  print_search_table(fitting, shown, d);
  return o.rank_layout.empty() ? 0 : print_layout_rank(o, fitting);
}

}  // namespace strata_plan
