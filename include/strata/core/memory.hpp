// strata/core/memory.hpp - the accounted allocator.
//
// Every byte strata holds is charged to a category, so a test (and later the planner) can
// check what a rank really holds against the analytic figures: 4Ψ of fp32 weights, 8Ψ of
// AdamW moments, and so on. A ledger is passed explicitly to whoever allocates; there is no
// global one, so two models in one process keep separate books.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"

namespace strata {

enum class memory_category : int {
  parameters,
  gradients,
  master_weights,
  optimizer_state,
  activations,
  workspace,
  communication,
};
inline constexpr int memory_category_count = 7;

constexpr std::string_view category_name(memory_category c) {
  switch (c) {
    case memory_category::parameters: return "parameters";
    case memory_category::gradients: return "gradients";
    case memory_category::master_weights: return "master_weights";
    case memory_category::optimizer_state: return "optimizer_state";
    case memory_category::activations: return "activations";
    case memory_category::workspace: return "workspace";
    case memory_category::communication: return "communication";
  }
  return "unknown";
}

// Where a ledger's buffers live. Host memory unless the ledger is given another space: with
// a GPU's (kernels/cuda/runtime.cuh: gpu::device_memory()), every buffer charged to the ledger -
// parameters, gradients, optimizer state, activations - is device memory, so layers written once
// allocate on whichever device their kernels run. Code that touches elements on the host goes
// through buffer::upload/download (a memcpy on the host).
enum class copy_direction { host_to_space, space_to_host, within_space };

struct memory_space {
  const char* name;
  bool host_accessible;                  // elements may be read and written by host code directly
  void* (*allocate)(std::size_t bytes);  // zeroed; throws on failure
  void (*deallocate)(void* p);
  void (*zero)(void* p, std::size_t bytes);
  void (*copy)(void* dst, const void* src, std::size_t bytes, copy_direction direction);
  // Not zeroed, for a buffer whose every element is written before it is read (a kernel's
  // output); throws on failure. Null: allocate serves (a space of one's own need not have it).
  void* (*allocate_uninitialized)(std::size_t bytes) = nullptr;
};

namespace host_blocks {
// Large host blocks are kept for reuse rather than given back to the system: a training step
// frees and allocates the same activation sizes every step, and a fresh block from the system
// (glibc maps blocks above its threshold afresh) costs a page fault per 4 KiB on first touch, 3%
// of a step measured. A block of at least `min_cached` bytes goes to a free list of its size
// when released and serves the next request of that size; the lists hold at most `max_cached`
// bytes in all, so a run keeps about its peak, as it would have without them.
inline constexpr std::size_t min_cached = std::size_t(256) << 10, max_cached = std::size_t(4) << 30;
inline constexpr std::size_t header = 64;  // before each block: its size, keeping 64-byte alignment

struct cache {
  std::mutex mutex;
  std::unordered_map<std::size_t, std::vector<void*>> free;
  std::size_t held = 0;
};
// Never destroyed: a buffer in a static object may be released after every other static is gone.
inline cache& blocks() {
  static cache* c = new cache;
  return *c;
}

inline void* allocate(std::size_t bytes, bool zeroed = true) {
  const std::size_t size = (bytes + 63) / 64 * 64;
  void* base = nullptr;
  if (size >= min_cached) {
    auto& c = blocks();
    const std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.free.find(size);
    if (it != c.free.end() && !it->second.empty()) {
      base = it->second.back();
      it->second.pop_back();
      c.held -= size;
    }
  }
  if (!base) base = std::aligned_alloc(64, size + header);
  if (!base) throw std::bad_alloc();
  std::memcpy(base, &size, sizeof size);
  void* p = static_cast<char*>(base) + header;
  if (zeroed) std::memset(p, 0, bytes);
  return p;
}

inline void deallocate(void* p) {
  if (!p) return;
  void* base = static_cast<char*>(p) - header;
  std::size_t size;
  std::memcpy(&size, base, sizeof size);
  if (size >= min_cached) {
    auto& c = blocks();
    const std::lock_guard<std::mutex> lock(c.mutex);
    if (c.held + size <= max_cached) {
      c.free[size].push_back(base);
      c.held += size;
      return;
    }
  }
  std::free(base);
}
}  // namespace host_blocks

// 64-byte aligned host memory (large blocks reused: host_blocks).
inline const memory_space& host_memory() {
  static const memory_space space{
      "host",
      true,
      [](std::size_t bytes) -> void* { return host_blocks::allocate(bytes); },
      [](void* p) { host_blocks::deallocate(p); },
      [](void* p, std::size_t bytes) { std::memset(p, 0, bytes); },
      [](void* dst, const void* src, std::size_t bytes, copy_direction) { std::memcpy(dst, src, bytes); },
      [](std::size_t bytes) -> void* { return host_blocks::allocate(bytes, false); }};
  return space;
}

// Current and peak bytes per category. Not thread-safe: allocation happens on the thread
// that drives the step, never inside OpenMP regions.
class memory_ledger {
 public:
  memory_ledger() = default;
  explicit memory_ledger(const memory_space& space) : space_(&space) {}

  const memory_space& space() const { return *space_; }

  void charge(memory_category c, std::size_t bytes) {
    auto i = index(c);
    current_[i] += bytes;
    if (current_[i] > peak_[i]) peak_[i] = current_[i];
    total_current_ += bytes;
    if (total_current_ > total_peak_) total_peak_ = total_current_;
  }
  void release(memory_category c, std::size_t bytes) {
    auto i = index(c);
    STRATA_CHECK(current_[i] >= bytes, "memory_ledger: releasing ", bytes, " bytes of ", category_name(c), " but only ",
                 current_[i], " are held");
    current_[i] -= bytes;
    total_current_ -= bytes;
  }
  std::size_t current(memory_category c) const { return current_[index(c)]; }
  std::size_t peak(memory_category c) const { return peak_[index(c)]; }
  std::size_t total_current() const { return total_current_; }
  std::size_t total_peak() const { return total_peak_; }
  // Starts a new peak window (e.g. per step) from what is held now.
  void reset_peaks() {
    peak_ = current_;
    total_peak_ = total_current_;
  }

 private:
  static std::size_t index(memory_category c) { return static_cast<std::size_t>(c); }
  const memory_space* space_ = &host_memory();
  std::array<std::size_t, memory_category_count> current_{};
  std::array<std::size_t, memory_category_count> peak_{};
  std::size_t total_current_ = 0, total_peak_ = 0;
};

// Asks a buffer not to zero its elements: every one is written before it is read.
struct uninitialized_t {
  explicit uninitialized_t() = default;
};
inline constexpr uninitialized_t uninitialized{};

// An owning, accounted array of T in its ledger's memory space (64-byte aligned on the host).
// Moves transfer the charge; the destructor returns it. Zero-initialised so a fresh gradient
// buffer is a valid sum, unless made with `uninitialized` for a kernel's output that the kernel
// writes whole (zeroing first costs a pass over memory the kernel then overwrites).
template <class T>
class buffer {
 public:
  buffer() = default;
  buffer(memory_ledger& ledger, memory_category category, std::size_t count)
      : ledger_(&ledger), category_(category), count_(count) {
    if (count_ == 0) return;
    data_ = static_cast<T*>(ledger.space().allocate(count_ * sizeof(T)));
    ledger_->charge(category_, count_ * sizeof(T));
  }
  buffer(memory_ledger& ledger, memory_category category, std::size_t count, uninitialized_t)
      : ledger_(&ledger), category_(category), count_(count) {
    if (count_ == 0) return;
    const memory_space& s = ledger.space();
    data_ = static_cast<T*>(s.allocate_uninitialized ? s.allocate_uninitialized(count_ * sizeof(T))
                                                     : s.allocate(count_ * sizeof(T)));
    ledger_->charge(category_, count_ * sizeof(T));
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  buffer(buffer&& o) noexcept { swap(o); }
  buffer& operator=(buffer&& o) noexcept {
    if (this != &o) {
      buffer tmp(std::move(o));
      swap(tmp);
    }
    return *this;
  }
  ~buffer() {
    if (data_) {
      ledger_->release(category_, count_ * sizeof(T));
      ledger_->space().deallocate(data_);
    }
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }
  bool empty() const { return count_ == 0; }
  memory_category category() const { return category_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  void zero() {
    if (data_) ledger_->space().zero(data_, count_ * sizeof(T));
  }
  const memory_space& space() const { return ledger_ ? ledger_->space() : host_memory(); }
  // Elements [at, at + n) from host memory, to host memory, or from elsewhere in this space.
  void upload(const T* host, std::size_t n, std::size_t at = 0) { copy(host, n, at, copy_direction::host_to_space); }
  void download(T* host, std::size_t n, std::size_t at = 0) const {
    check_range(n, at);
    if (n) space().copy(host, data_ + at, n * sizeof(T), copy_direction::space_to_host);
  }
  void copy_within(const T* same_space, std::size_t n, std::size_t at = 0) {
    copy(same_space, n, at, copy_direction::within_space);
  }

 private:
  void swap(buffer& o) noexcept {
    std::swap(ledger_, o.ledger_);
    std::swap(category_, o.category_);
    std::swap(data_, o.data_);
    std::swap(count_, o.count_);
  }
  void check_range(std::size_t n, std::size_t at) const {
    STRATA_CHECK(at + n <= count_, "buffer: elements [", at, ", ", at + n, ") past its ", count_);
  }
  void copy(const T* from, std::size_t n, std::size_t at, copy_direction d) {
    check_range(n, at);
    if (n) space().copy(data_ + at, from, n * sizeof(T), d);
  }

  memory_ledger* ledger_ = nullptr;
  memory_category category_ = memory_category::workspace;
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

// Grows on demand and never shrinks: scratch space reused across calls (e.g. the fp32 copies
// a bf16 GEMM needs). Charged as workspace.
class workspace {
 public:
  explicit workspace(memory_ledger& ledger) : ledger_(&ledger) {}
  // Returns at least `count` floats; valid until the next call with a larger count.
  float* floats(std::size_t count, int slot = 0) {
    auto& b = slots_[static_cast<std::size_t>(slot)];
    if (b.size() < count) b = buffer<float>(*ledger_, memory_category::workspace, count);
    return b.data();
  }

 private:
  memory_ledger* ledger_;
  std::array<buffer<float>, 4> slots_{};
};

}  // namespace strata
