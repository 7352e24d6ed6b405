// strata/comm/timeout.hpp - deadlines for collectives, and the one line a stalled rank prints.
//
// No strata collective waits forever. Every blocking call is a nonblocking post plus a polling
// wait with a deadline; when the deadline passes the rank prints one line to stderr and ends the
// whole job (MPI_Abort, after ncclCommAbort for NCCL):
//
//   strata: rank 3 timed out after 2.0 s in all_reduce on group dp (4096 bytes); aborting the job
//
// The rank is the world rank; the bytes are the call's buffer (an all-gather's output, a
// reduce-scatter's input, all messages of a send/recv group). The deadline is measured from the
// start of the wait, so an async call posted early and waited on after a long computation is not
// charged for the computation. A peer that never arrives (it skipped the call, hangs, exited or
// crashed under a launcher that does not kill the job) therefore ends the job within the timeout.
//
// The timeout comes from comm_options, by default from the environment:
//   STRATA_COMM_TIMEOUT=<seconds>   (a decimal number; 0 waits forever; default 300)
#pragma once
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <thread>

#include "strata/core/error.hpp"

namespace strata {

inline constexpr double default_comm_timeout_s = 300.0;

// Parses a STRATA_COMM_TIMEOUT value: seconds, >= 0 (0: no deadline).
inline double parse_comm_timeout(std::string_view text) {
  std::string s(text);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  STRATA_CHECK(!s.empty() && end == s.c_str() + s.size() && errno == 0 && std::isfinite(v) && v >= 0,
               "STRATA_COMM_TIMEOUT='", s, "' is not a number of seconds >= 0 (0 waits forever)");
  return v;
}

struct comm_options {
  // Seconds a rank may wait in one call before it reports the stall and ends the job; 0: forever.
  double timeout_s = default_comm_timeout_s;
  // The most elements one MPI message or collective call carries (MPI counts are int); longer
  // buffers go as several calls. Tests lower it to exercise the splitting.
  std::size_t chunk_elements = static_cast<std::size_t>(std::numeric_limits<int>::max());

  // The defaults, with STRATA_COMM_TIMEOUT applied when it is set.
  static comm_options from_env() {
    comm_options o;
    if (const char* t = std::getenv("STRATA_COMM_TIMEOUT"); t != nullptr) o.timeout_s = parse_comm_timeout(t);
    return o;
  }
};

namespace detail {

// Writes one line to stderr in one call, so lines from several ranks do not interleave.
inline void print_line(const std::string& line) {
  std::string s = line;
  s += '\n';
  std::fwrite(s.data(), 1, s.size(), stderr);
  std::fflush(stderr);
}

inline std::string stall_line(int world_rank, double timeout_s, std::string_view op, std::string_view group,
                              std::uint64_t bytes) {
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", timeout_s);
  return concat("strata: rank ", world_rank, " timed out after ", secs, " s in ", op, " on group ", group, " (", bytes,
                " bytes); aborting the job");
}

inline std::string failure_line(int world_rank, std::string_view op, std::string_view group, std::uint64_t bytes,
                                std::string_view what) {
  return concat("strata: rank ", world_rank, " failed in ", op, " on group ", group, " (", bytes, " bytes): ", what,
                "; aborting the job");
}

// Calls done() until it returns true (then returns true) or until timeout_s seconds have passed
// (then returns false); timeout_s <= 0 waits forever. done() is where the engine makes progress
// (MPI progresses nonblocking collectives only inside MPI calls), so it is called back to back
// for the first 100 ms, yielding the core between calls (ranks are often oversubscribed); after
// that the wait is long anyway (a peer is late, or stalled) and it naps 100 us between calls.
template <class Done>
bool poll_with_deadline(Done&& done, double timeout_s) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const bool bounded = timeout_s > 0;
  const auto limit = std::chrono::duration<double>(timeout_s);
  constexpr auto busy = std::chrono::milliseconds(100);
  for (std::uint64_t spin = 0;; ++spin) {
    if (done()) return true;
    if (spin < 64) continue;
    const auto waited = clock::now() - start;
    if (bounded && waited > limit) return done();
    if (waited < busy) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

}  // namespace detail
}  // namespace strata
