// strata/core/emulated_memory.hpp - a stand-in for a GPU's memory on the CPU: host memory that
// says it is not, and counts every byte that crosses it.
//
// A run given this space (training_options::memory, or gpt2_train --device emulated) must
// allocate, free and move every buffer through the space's functions, as it must on a GPU
// (gpu::device_memory()); host kernels still work on it, since it is host memory underneath. The
// counts show what a step moves between the host and the "device": a run on a GPU should move only
// its batches in, its losses and its step state out. Not a sandbox: code that reads such a buffer
// directly on the host is not caught (it would be on a GPU).
#pragma once
#include <cstddef>
#include <cstring>
#include <set>

#include "strata/core/memory.hpp"

namespace strata {

// What has crossed the emulated space since the process started (or the last reset()).
struct emulated_memory_counts {
  long allocations = 0, frees = 0;
  long uploads = 0, downloads = 0, within = 0;  // copies host -> space, space -> host, inside it
  std::size_t upload_bytes = 0, download_bytes = 0;
  std::set<void*> live;  // blocks allocated and not yet freed

  void reset_copies() { uploads = downloads = within = 0, upload_bytes = download_bytes = 0; }
};

// The counts of the one emulated space (one per process; allocation happens on the thread that
// drives the step, as for every ledger).
inline emulated_memory_counts& emulated_memory_stats() {
  static emulated_memory_counts counts;
  return counts;
}

inline const memory_space& emulated_device_memory() {
  static const memory_space space{"emulated", false,
                                  [](std::size_t bytes) {
                                    void* p = host_memory().allocate(bytes);
                                    auto& c = emulated_memory_stats();
                                    c.live.insert(p);
                                    ++c.allocations;
                                    return p;
                                  },
                                  [](void* p) {
                                    auto& c = emulated_memory_stats();
                                    c.live.erase(p);
                                    ++c.frees;
                                    host_memory().deallocate(p);
                                  },
                                  [](void* p, std::size_t bytes) { host_memory().zero(p, bytes); },
                                  [](void* dst, const void* src, std::size_t bytes, copy_direction d) {
                                    auto& c = emulated_memory_stats();
                                    if (d == copy_direction::host_to_space) {
                                      ++c.uploads;
                                      c.upload_bytes += bytes;
                                    } else if (d == copy_direction::space_to_host) {
                                      ++c.downloads;
                                      c.download_bytes += bytes;
                                    } else {
                                      ++c.within;
                                    }
                                    std::memcpy(dst, src, bytes);
                                  },
                                  // Unlike a GPU's, "uninitialised" memory here is all one bits: NaN in every floating
                                  // type, so a kernel that reads an element of its output before writing it (one that
                                  // assumes zeros) turns the runs on this space, and the tests comparing them, to NaN.
                                  [](std::size_t bytes) {
                                    void* p = host_memory().allocate_uninitialized(bytes);
                                    std::memset(p, 0xFF, bytes);
                                    auto& c = emulated_memory_stats();
                                    c.live.insert(p);
                                    ++c.allocations;
                                    return p;
                                  }};
  return space;
}

}  // namespace strata
