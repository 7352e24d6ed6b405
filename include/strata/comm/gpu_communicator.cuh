// strata/comm/gpu_communicator.cuh - one process group for a run on GPUs: device buffers through
// NCCL or staged MPI, host values through MPI, ordered after the compute stream.
//
// Compiled by nvcc only. What a run's layers and synchronizer exchange is mostly device memory
// (activations, gradient buckets, weights), but also a few host values (a gradient norm's partial
// sums, a loss): each call looks at where its buffer lives and sends device buffers through the
// group's device engine and host buffers through the MPI communicator underneath. The engine is
//   nccl        nccl_communicator.cuh: one GPU per rank;
//   mpi_staged  mpi_device_communicator.cuh: through pinned host memory, for ranks that share a
//               GPU, or where NCCL cannot run.
// The engine works on its own stream (`comm_stream`). When that is not the compute stream (the
// data-parallel group, so its reductions overlap backward), every device call first makes the
// comm stream wait for what the compute stream has enqueued so far: a bucket is reduced only after
// the kernels that wrote it. The other direction needs no event: a handle's wait() returns once
// the host has seen the call finish, and the compute stream's later kernels are enqueued after.
//
// Calls are counted here, under the MPI group's name; the engines underneath count nothing.
//
//   strata::gpu_communicator dp(mesh.dp(), strata::gpu_comm_engine::nccl, comm, gpu::current_stream());
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "strata/comm/collectives.hpp"
#include "strata/comm/communicator.hpp"
#include "strata/comm/mpi_communicator.hpp"
#include "strata/comm/mpi_device_communicator.cuh"
#include "strata/comm/nccl_communicator.cuh"
#include "strata/core/error.hpp"

namespace strata {

enum class gpu_comm_engine { nccl, mpi_staged };

constexpr std::string_view gpu_comm_engine_name(gpu_comm_engine e) {
  return e == gpu_comm_engine::nccl ? "nccl" : "mpi";
}

class gpu_communicator : public collectives<gpu_communicator> {
 public:
  // Collective over `host` (which must outlive this): builds the engine over the same ranks.
  gpu_communicator(mpi_communicator& host, gpu_comm_engine engine, cudaStream_t comm_stream,
                   cudaStream_t compute_stream)
      : collectives(std::string(host.name())),
        host_(&host),
        engine_(engine),
        stream_(comm_stream),
        compute_(compute_stream) {
    if (engine == gpu_comm_engine::nccl) nccl_.emplace(host, comm_stream);
    else staged_.emplace(host, comm_stream);
    if (stream_ != compute_) {
      const cudaError_t e = cudaEventCreateWithFlags(&written_, cudaEventDisableTiming);
      if (e != cudaSuccess) fail("gpu_communicator ", host.name(), ": cudaEventCreate failed: ", cudaGetErrorString(e));
    }
  }
  gpu_communicator(const gpu_communicator&) = delete;
  gpu_communicator& operator=(const gpu_communicator&) = delete;
  ~gpu_communicator() {
    if (written_) cudaEventDestroy(written_);
  }

  int rank() const { return host_->rank(); }
  int size() const { return host_->size(); }
  bool valid() const { return host_->valid(); }
  gpu_comm_engine engine() const { return engine_; }
  cudaStream_t stream() const { return stream_; }
  mpi_communicator& host() { return *host_; }

  // ---- engine interface (collectives.hpp) ------------------------------------------------------

  comm_handle post_all_reduce(void* data, std::size_t count, comm_dtype dt, reduce_op op) {
    if (!on_device(data)) return host_->post_all_reduce(data, count, dt, op);
    return device([&](auto& e) { return e.post_all_reduce(data, count, dt, op); });
  }
  comm_handle post_reduce_scatter(const void* in, void* out, std::size_t block, std::span<const std::size_t> counts,
                                  comm_dtype dt, reduce_op op) {
    if (!on_device(in)) return host_->post_reduce_scatter(in, out, block, counts, dt, op);
    return device([&](auto& e) { return e.post_reduce_scatter(in, out, block, counts, dt, op); });
  }
  comm_handle post_all_gather(const void* in, void* out, std::size_t block, std::span<const std::size_t> counts,
                              comm_dtype dt) {
    if (!on_device(out)) return host_->post_all_gather(in, out, block, counts, dt);
    return device([&](auto& e) { return e.post_all_gather(in, out, block, counts, dt); });
  }
  comm_handle post_broadcast(void* data, std::size_t count, comm_dtype dt, int root) {
    if (!on_device(data)) return host_->post_broadcast(data, count, dt, root);
    return device([&](auto& e) { return e.post_broadcast(data, count, dt, root); });
  }
  comm_handle post_all_to_all(const void* in, void* out, std::size_t block, std::span<const std::size_t> send_counts,
                              std::span<const std::size_t> recv_counts, comm_dtype dt) {
    if (!on_device(out)) return host_->post_all_to_all(in, out, block, send_counts, recv_counts, dt);
    return device([&](auto& e) { return e.post_all_to_all(in, out, block, send_counts, recv_counts, dt); });
  }
  // One list goes to one side: every buffer of it on the device, or every one on the host.
  comm_handle post_p2p(std::span<const p2p_op> ops) {
    int device_ops = 0, active = 0;
    for (const p2p_op& p : ops)
      if (p.peer != no_peer) {
        ++active;
        device_ops += on_device(p.data) ? 1 : 0;
      }
    if (device_ops == 0) return host_->post_p2p(ops);
    STRATA_CHECK(device_ops == active, "gpu_communicator ", name(), ": one p2p list mixes ", device_ops,
                 " device buffers with ", active - device_ops, " host buffers");
    return device([&](auto& e) { return e.post_p2p(ops); });
  }
  comm_handle post_barrier() { return host_->post_barrier(); }

 private:
  static bool on_device(const void* p) { return detail::is_device_pointer(p); }

  // The engine's call, after the compute stream's work so far.
  template <class F>
  comm_handle device(F&& post) {
    if (written_) {
      check(cudaEventRecord(written_, compute_), "cudaEventRecord");
      check(cudaStreamWaitEvent(stream_, written_, 0), "cudaStreamWaitEvent");
    }
    return nccl_ ? post(*nccl_) : post(*staged_);
  }
  void check(cudaError_t e, const char* what) const {
    if (e != cudaSuccess) fail("gpu_communicator ", name(), ": ", what, " failed: ", cudaGetErrorString(e));
  }

  mpi_communicator* host_;
  gpu_comm_engine engine_;
  cudaStream_t stream_, compute_;
  cudaEvent_t written_ = nullptr;
  std::optional<nccl_communicator> nccl_;
  std::optional<mpi_device_communicator> staged_;
};

static_assert(communicator<gpu_communicator>);

}  // namespace strata
