// strata/core/profile.hpp - where a training step's time goes, by op: each layer's forward and
// backward, the loss, the optimizer, the gradient norm and the collectives, as wall time on the
// thread that drives the model.
//
//   st::profiler::enable();               // off by default: a scope then costs one branch
//   ... steps ...
//   st::profiler::report(std::cout, wall_seconds, steps);
//
// A scope (STRATA_PROFILE("linear.forward")) adds the time from its construction to its end to
// its name. Scopes nest: each one's own time is its time less its children's, so the table's
// rows add up to the time covered, and "outside any op" is the wall time less that (the
// framework between ops: buffers, bookkeeping, serial stretches). Names are string literals; ops
// of one kind share a row whatever layer runs them.
//
// The clock is the wall clock, or with enable(profiler::clock::process_cpu) the process's CPU time
// (every thread's): on a machine other work shares, a one-thread profile by CPU time counts only
// what the step itself computed. With enable(profiler::clock::wall_and_cpu) a scope reads both,
// and the table adds each op's cores in use (its CPU time over its wall time) and its idle
// core-time (threads x wall less CPU): where a step leaves cores waiting. Threads that spin
// while they wait count as busy, so read those columns under OMP_WAIT_POLICY=passive. The clock
// is the host's: under a cuda policy a scope times the launch, not the kernel, so the table
// describes the host path; a GPU profile belongs to nsys. Scopes run on the thread that drives
// the model (the kernels' OpenMP teams start and end inside them).
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <cstdio>
#include <ostream>
#include <string_view>
#include <vector>

namespace strata {

class profiler {
 public:
  struct row {
    const char* name;
    double self_seconds = 0;      // excluding nested scopes, on the profile's clock
    double self_cpu_seconds = 0;  // the same on the process CPU clock (clock::wall_and_cpu only)
    std::int64_t calls = 0;
  };

  enum class clock { wall, process_cpu, wall_and_cpu };
  // Turning profiling off keeps the clock it ran on, for now() and report().
  static void enable(bool on = true, clock c = clock::wall) {
    state().enabled = on;
    if (!on) return;
    state().cpu = c == clock::process_cpu;
    state().both = c == clock::wall_and_cpu;
  }
  static void enable(clock c) { enable(true, c); }
  // Seconds on the clock scopes use now (for the caller's own total; the wall clock under
  // wall_and_cpu).
  static double now() { return state().cpu ? cpu_now() : wall_now(); }
  static double wall_now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  static double cpu_now() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
  static bool enabled() { return state().enabled; }
  static void reset() {
    state().rows.clear();
    state().child_seconds = state().child_cpu_seconds = 0;
  }
  static std::vector<row> rows() {
    auto r = state().rows;
    std::sort(r.begin(), r.end(), [](const row& a, const row& b) { return a.self_seconds > b.self_seconds; });
    return r;
  }
  // Seconds inside any scope (on the profile's clock, or the CPU clock's).
  static double covered_seconds() {
    double s = 0;
    for (const auto& r : state().rows) s += r.self_seconds;
    return s;
  }
  static double covered_cpu_seconds() {
    double s = 0;
    for (const auto& r : state().rows) s += r.self_cpu_seconds;
    return s;
  }

  // The table: per op, ms per step and its share of `wall_seconds` (the steps' total), then the
  // time outside any op. With cpu_seconds (the steps' process CPU time, under wall_and_cpu) and
  // threads, two more columns: cores in use and idle core-ms per step.
  static void report(std::ostream& out, double wall_seconds, std::int64_t steps, double cpu_seconds = -1,
                     int threads = 1) {
    const double per = steps > 0 ? 1000.0 / double(steps) : 0.0;
    const bool cores = cpu_seconds >= 0 && state().both;
    char line[200];
    std::snprintf(line, sizeof line, "%-28s %10s %10s %8s", "op", "calls/step", "ms/step", "share");
    out << line << (cores ? "      cores  idle core-ms/step\n" : "\n");
    const auto print = [&](const char* name, double seconds, double cpu, double calls) {
      std::snprintf(line, sizeof line, "%-28s %10.1f %10.3f %7.1f%%", name, calls, seconds * per,
                    wall_seconds > 0 ? 100.0 * seconds / wall_seconds : 0.0);
      out << line;
      if (cores) {
        std::snprintf(line, sizeof line, " %10.2f %18.3f", seconds > 0 ? cpu / seconds : 0.0,
                      std::max(0.0, double(threads) * seconds - cpu) * per);
        out << line;
      }
      out << "\n";
    };
    for (const auto& r : rows())
      print(r.name, r.self_seconds, r.self_cpu_seconds, steps > 0 ? double(r.calls) / double(steps) : 0.0);
    print("(outside any op)", std::max(0.0, wall_seconds - covered_seconds()),
          std::max(0.0, cpu_seconds - covered_cpu_seconds()), 0.0);
    print("step", wall_seconds, cpu_seconds, 0.0);
  }

  // A timed region; use STRATA_PROFILE(name).
  class scope {
   public:
    explicit scope(const char* name) {
      auto& s = state();
      if (!s.enabled) return;
      name_ = name;
      start_ = now();
      if (s.both) start_cpu_ = cpu_now();
      parent_child_ = s.child_seconds;
      parent_child_cpu_ = s.child_cpu_seconds;
      s.child_seconds = s.child_cpu_seconds = 0;
    }
    ~scope() {
      if (!name_) return;
      auto& s = state();
      const double total = now() - start_, total_cpu = s.both ? cpu_now() - start_cpu_ : 0.0;
      row& r = s.find(name_);
      r.self_seconds += total - s.child_seconds;
      r.self_cpu_seconds += total_cpu - s.child_cpu_seconds;
      ++r.calls;
      s.child_seconds = parent_child_ + total;  // the parent sees this scope as a child
      s.child_cpu_seconds = parent_child_cpu_ + total_cpu;
    }
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;

   private:
    const char* name_ = nullptr;
    double start_ = 0, start_cpu_ = 0;
    double parent_child_ = 0, parent_child_cpu_ = 0;
  };

 private:
  struct data {
    bool enabled = false, cpu = false, both = false;
    double child_seconds = 0, child_cpu_seconds = 0;  // nested scopes' time, in the innermost open scope
    std::vector<row> rows;
    row& find(const char* name) {
      for (auto& r : rows)
        if (r.name == name || std::string_view(r.name) == name) return r;
      rows.push_back(row{name});
      return rows.back();
    }
  };
  static data& state() {
    static data d;
    return d;
  }
};

}  // namespace strata

#define STRATA_PROFILE_CAT2(a, b) a##b
#define STRATA_PROFILE_CAT(a, b) STRATA_PROFILE_CAT2(a, b)
// Times the rest of the enclosing block under `name` (a string literal) when profiling is on.
#define STRATA_PROFILE(name) ::strata::profiler::scope STRATA_PROFILE_CAT(strata_profile_, __LINE__)(name)
