// strata/train/fault.hpp - crashes and full disks on purpose, to test that a run survives real ones.
//
// STRATA_FAULT names one fault. The process meets it and dies by SIGKILL, as a machine taken
// away would leave it (no destructor, no flush, no MPI_Finalize):
//   kill-at-step:N       before training step N (1-based) begins
//   kill-during-save:N   while writing its shard of the step-N checkpoint, half of it on disk
// or meets a full or slow disk and lives on:
//   disk-full-during-save:N   its write of its step-N shard fails half-way with ENOSPC, through
//                             the same path as a real full disk (write_file_durably)
//   slow-save:MS              each write of its shard takes MS milliseconds longer (widens the
//                             window in which a second writer could interfere)
// optionally followed by "@R": only world rank R meets it (default: the last rank). Anything else in
// the variable is an error that quotes it, so a typo never turns a crash test into a clean run.
#pragma once
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "strata/core/error.hpp"

namespace strata {

struct fault_injection {
  int kill_at_step = -1;
  int kill_during_save = -1;
  int disk_full_during_save = -1;
  int slow_save_ms = -1;
  int rank = -1;  // -1: the last rank

  bool armed() const {
    return kill_at_step >= 0 || kill_during_save >= 0 || disk_full_during_save >= 0 || slow_save_ms >= 0;
  }
  bool targets(int my_rank, int world_size) const { return my_rank == (rank >= 0 ? rank : world_size - 1); }

  static fault_injection parse(const std::string& text) {
    fault_injection f;
    if (text.empty()) return f;
    const auto colon = text.find(':');
    const auto at = text.find('@');
    const std::string kind = text.substr(0, colon);
    const std::string step = colon == std::string::npos
                                 ? ""
                                 : text.substr(colon + 1, at == std::string::npos ? std::string::npos : at - colon - 1);
    const auto number = [&](const std::string& s) {
      char* end = nullptr;
      const long v = s.empty() ? -1 : std::strtol(s.c_str(), &end, 10);
      STRATA_CHECK(!s.empty() && *end == '\0' && v >= 0, "STRATA_FAULT='", text,
                   "': expected kill-at-step:N, kill-during-save:N, disk-full-during-save:N or slow-save:MS, "
                   "optionally @RANK");
      return static_cast<int>(v);
    };
    if (kind == "kill-at-step") f.kill_at_step = number(step);
    else if (kind == "kill-during-save") f.kill_during_save = number(step);
    else if (kind == "disk-full-during-save") f.disk_full_during_save = number(step);
    else if (kind == "slow-save") f.slow_save_ms = number(step);
    else number("");  // the message above
    if (at != std::string::npos) f.rank = number(text.substr(at + 1));
    return f;
  }
  static fault_injection from_env() {
    const char* v = std::getenv("STRATA_FAULT");
    return parse(v ? v : "");
  }

  [[noreturn]] static void die(const char* what) {
    std::fprintf(stderr, "STRATA_FAULT: killing this rank %s\n", what);
    std::fflush(nullptr);
    std::raise(SIGKILL);
    std::abort();  // not reached
  }
};

}  // namespace strata
