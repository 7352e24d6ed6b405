// strata/comm/mpi_device_communicator.cuh - the MPI engine on device buffers, staged through pinned memory.
//
// Compiled by nvcc only (a .cuh). NCCL needs one GPU per rank; this engine lets several ranks
// share one GPU (tests, small machines) or run where NCCL is missing: each call copies its device
// inputs into pinned host buffers (cudaMallocHost, pooled) on the communicator's stream, runs the
// MPI engine's call on them, and copies the outputs back when it completes. Host pointers
// (anything cudaPointerGetAttributes does not call device memory, including managed memory)
// go straight to the MPI engine. Semantics, timeouts and counting are the MPI engine's:
// bf16/fp16 reductions accumulate in fp32 on the host; this communicator counts the calls made
// through it (under the MPI communicator's group name), the wrapped one counts nothing for them.
//
//   strata::mpi_device_communicator dp(mesh.dp(), stream);   // wraps, does not own, mesh.dp()
//   dp.all_reduce(std::span(d_grads, n), strata::reduce_op::avg);
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "strata/comm/collectives.hpp"
#include "strata/comm/communicator.hpp"
#include "strata/comm/mpi_communicator.hpp"
#include "strata/comm/timeout.hpp"

namespace strata {

namespace detail {

// Pinned host blocks, reused: cudaMallocHost is far too slow to call per collective.
class pinned_pool {
 public:
  pinned_pool() = default;
  pinned_pool(const pinned_pool&) = delete;
  pinned_pool& operator=(const pinned_pool&) = delete;
  ~pinned_pool() {
    for (auto& b : free_) cudaFreeHost(b.first);
  }
  // A block of at least `bytes` (the smallest free one that fits, else a new one).
  std::pair<void*, std::size_t> acquire(std::size_t bytes) {
    std::size_t best = free_.size();
    for (std::size_t i = 0; i < free_.size(); ++i)
      if (free_[i].second >= bytes && (best == free_.size() || free_[i].second < free_[best].second)) best = i;
    if (best < free_.size()) {
      auto b = free_[best];
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
      return b;
    }
    void* p = nullptr;
    const std::size_t size = bytes > 0 ? bytes : 1;
    const cudaError_t e = cudaMallocHost(&p, size);
    if (e != cudaSuccess) fail("mpi_device_communicator: cudaMallocHost(", size, ") failed: ", cudaGetErrorString(e));
    return {p, size};
  }
  void release(std::pair<void*, std::size_t> b) { free_.push_back(b); }

 private:
  std::vector<std::pair<void*, std::size_t>> free_;
};

inline bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // an unregistered host pointer on old runtimes: clear the error
    return false;
  }
  return a.type == cudaMemoryTypeDevice;
}

// A device buffer and its pinned host copy.
struct staged_buffer {
  void* device = nullptr;
  void* host = nullptr;
  std::size_t bytes = 0;
  std::pair<void*, std::size_t> block{};
};

// The MPI call on the staged copies; on completion the outputs go back to the device.
class staged_operation final : public comm_handle::operation {
 public:
  staged_operation(comm_handle inner, std::vector<staged_buffer> outputs, std::vector<staged_buffer> inputs,
                   cudaStream_t stream, std::shared_ptr<pinned_pool> pool)
      : inner_(std::move(inner)),
        outputs_(std::move(outputs)),
        inputs_(std::move(inputs)),
        stream_(stream),
        pool_(std::move(pool)) {}
  ~staged_operation() override {
    for (auto& b : outputs_) pool_->release(b.block);
    for (auto& b : inputs_) pool_->release(b.block);
  }
  bool test() override {
    if (!inner_.test()) return false;
    copy_back();
    return true;
  }
  void wait() override {
    inner_.wait();
    copy_back();
  }

 private:
  void copy_back() {
    if (copied_) return;
    copied_ = true;
    for (auto& b : outputs_) {
      const cudaError_t e = cudaMemcpyAsync(b.device, b.host, b.bytes, cudaMemcpyHostToDevice, stream_);
      if (e != cudaSuccess) fail("mpi_device_communicator: copy to the device failed: ", cudaGetErrorString(e));
    }
    if (!outputs_.empty()) cudaStreamSynchronize(stream_);
  }

  comm_handle inner_;
  std::vector<staged_buffer> outputs_, inputs_;
  cudaStream_t stream_;
  std::shared_ptr<pinned_pool> pool_;
  bool copied_ = false;
};

}  // namespace detail

class mpi_device_communicator : public collectives<mpi_device_communicator> {
 public:
  // Wraps `host` (which must outlive this) for device buffers used on `stream`.
  mpi_device_communicator(mpi_communicator& host, cudaStream_t stream)
      : collectives(std::string(host.name())),
        host_(&host),
        stream_(stream),
        pool_(std::make_shared<detail::pinned_pool>()) {}

  int rank() const { return host_->rank(); }
  int size() const { return host_->size(); }
  bool valid() const { return host_->valid(); }
  cudaStream_t stream() const { return stream_; }
  mpi_communicator& host() { return *host_; }

  // ---- engine interface (collectives.hpp) ------------------------------------------------------

  comm_handle post_all_reduce(void* data, std::size_t count, comm_dtype dt, reduce_op op) {
    staging s(*this);
    void* h = s.inout(data, count * dtype_bytes(dt));
    s.sync();
    return s.done(host_->post_all_reduce(h, count, dt, op));
  }

  comm_handle post_reduce_scatter(const void* in, void* out, std::size_t block, std::span<const std::size_t> counts,
                                  comm_dtype dt, reduce_op op) {
    const std::size_t esz = dtype_bytes(dt);
    const bool equal = counts.empty();
    const std::size_t total = equal ? block * std::size_t(size()) : sum(counts);
    const std::size_t own = equal ? block : counts[std::size_t(rank())];
    staging s(*this);
    const void* hi = s.in(in, total * esz);
    void* ho = s.out(out, own * esz);
    s.sync();
    return s.done(host_->post_reduce_scatter(hi, ho, block, counts, dt, op));
  }

  comm_handle post_all_gather(const void* in, void* out, std::size_t block, std::span<const std::size_t> counts,
                              comm_dtype dt) {
    const std::size_t esz = dtype_bytes(dt);
    const bool equal = counts.empty();
    const std::size_t total = equal ? block * std::size_t(size()) : sum(counts);
    const std::size_t own = equal ? block : counts[std::size_t(rank())];
    staging s(*this);
    const void* hi = s.in(in, own * esz);
    void* ho = s.out(out, total * esz);
    s.sync();
    return s.done(host_->post_all_gather(hi, ho, block, counts, dt));
  }

  comm_handle post_broadcast(void* data, std::size_t count, comm_dtype dt, int root) {
    staging s(*this);
    void* h = s.inout(data, count * dtype_bytes(dt));
    s.sync();
    return s.done(host_->post_broadcast(h, count, dt, root));
  }

  comm_handle post_all_to_all(const void* in, void* out, std::size_t block, std::span<const std::size_t> send_counts,
                              std::span<const std::size_t> recv_counts, comm_dtype dt) {
    const std::size_t esz = dtype_bytes(dt);
    const bool equal = send_counts.empty();
    const std::size_t in_total = equal ? block * std::size_t(size()) : sum(send_counts);
    const std::size_t out_total = equal ? in_total : sum(recv_counts);
    staging s(*this);
    const void* hi = s.in(in, in_total * esz);
    void* ho = s.out(out, out_total * esz);
    s.sync();
    return s.done(host_->post_all_to_all(hi, ho, block, send_counts, recv_counts, dt));
  }

  comm_handle post_p2p(std::span<const p2p_op> ops) {
    staging s(*this);
    std::vector<p2p_op> host_ops(ops.begin(), ops.end());
    for (p2p_op& p : host_ops) {
      if (p.peer == no_peer) continue;
      p.data = p.dir == p2p_op::direction::send ? const_cast<void*>(s.in(p.data, p.bytes())) : s.out(p.data, p.bytes());
    }
    s.sync();
    return s.done(host_->post_p2p(host_ops));
  }

  comm_handle post_barrier() { return host_->post_barrier(); }

 private:
  // Collects one call's staged buffers.
  class staging {
   public:
    explicit staging(mpi_device_communicator& c) : c_(c) {}
    staging(const staging&) = delete;
    staging& operator=(const staging&) = delete;
    ~staging() {  // blocks not handed to an operation (an exception on the way) go back
      for (auto& b : inputs_) c_.pool_->release(b.block);
      for (auto& b : outputs_) c_.pool_->release(b.block);
    }
    const void* in(const void* p, std::size_t bytes) {
      if (!detail::is_device_pointer(p)) return p;
      auto b = make(const_cast<void*>(p), bytes);
      copy(b.host, p, bytes, cudaMemcpyDeviceToHost);
      inputs_.push_back(b);
      return b.host;
    }
    void* out(void* p, std::size_t bytes) {
      if (!detail::is_device_pointer(p)) return p;
      auto b = make(p, bytes);
      outputs_.push_back(b);
      return b.host;
    }
    void* inout(void* p, std::size_t bytes) {
      if (!detail::is_device_pointer(p)) return p;
      auto b = make(p, bytes);
      copy(b.host, p, bytes, cudaMemcpyDeviceToHost);
      outputs_.push_back(b);
      return b.host;
    }
    void sync() {
      if (copied_) cudaStreamSynchronize(c_.stream_);
    }
    comm_handle done(comm_handle inner) {
      if (inputs_.empty() && outputs_.empty()) return inner;
      auto op = std::make_unique<detail::staged_operation>(std::move(inner), std::move(outputs_), std::move(inputs_),
                                                           c_.stream_, c_.pool_);
      inputs_.clear();
      outputs_.clear();
      return comm_handle(std::move(op));
    }

   private:
    detail::staged_buffer make(void* device, std::size_t bytes) {
      detail::staged_buffer b;
      b.device = device;
      b.bytes = bytes;
      b.block = c_.pool_->acquire(bytes);
      b.host = b.block.first;
      return b;
    }
    void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
      if (bytes == 0) return;
      const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, c_.stream_);
      if (e != cudaSuccess) fail("mpi_device_communicator: copy from the device failed: ", cudaGetErrorString(e));
      copied_ = true;
    }
    mpi_device_communicator& c_;
    std::vector<detail::staged_buffer> inputs_, outputs_;
    bool copied_ = false;
  };

  static std::size_t sum(std::span<const std::size_t> c) { return std::accumulate(c.begin(), c.end(), std::size_t{0}); }

  mpi_communicator* host_;
  cudaStream_t stream_;
  std::shared_ptr<detail::pinned_pool> pool_;
};

static_assert(communicator<mpi_device_communicator>);

}  // namespace strata
