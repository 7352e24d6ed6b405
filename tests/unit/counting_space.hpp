// A memory space that is host memory underneath but claims not to be, and counts what goes
// through it: code that must allocate, free and move every byte through its ledger's space (as
// on a GPU, gpu::device_memory()) can be checked on the CPU.
#pragma once
#include <cstring>
#include <set>

#include <strata/core/memory.hpp>

namespace strata_test {

struct space_counts {
  long allocations = 0, frees = 0, uploads = 0, downloads = 0, within = 0;
  std::set<void*> live;
};
inline space_counts counts;

inline const strata::memory_space& counting_space() {
  namespace st = strata;
  static const st::memory_space space{
      "counting", false,
      [](std::size_t bytes) {
        void* p = st::host_memory().allocate(bytes);
        counts.live.insert(p);
        ++counts.allocations;
        return p;
      },
      [](void* p) {
        counts.live.erase(p);
        ++counts.frees;
        st::host_memory().deallocate(p);
      },
      [](void* p, std::size_t bytes) { st::host_memory().zero(p, bytes); },
      [](void* dst, const void* src, std::size_t bytes, st::copy_direction d) {
        ++(d == st::copy_direction::host_to_space   ? counts.uploads
           : d == st::copy_direction::space_to_host ? counts.downloads
                                                    : counts.within);
        std::memcpy(dst, src, bytes);
      }};
  return space;
}

}  // namespace strata_test
