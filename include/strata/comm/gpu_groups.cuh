// strata/comm/gpu_groups.cuh - a run's groups on GPUs (run_groups for cuda policies), the engine
// choice and each rank's GPU.
//
// Compiled by nvcc only; include it before instantiating strata::training under a cuda policy.
//
//   gpu::use_local_device(world);                    // before anything touches the GPU
//   st::training<my_model<cuda_policy>> run(world, shape, {.memory = &st::gpu::device_memory()});
// (gpu::device_memory() is the kernels' runtime, kernels/cuda/runtime.cuh; the groups need only
// the compute stream, core/cuda_stream.cuh.)
//
// Each rank takes the GPU numbered local rank modulo the node's device count. The device
// engine (gpu_communicator.cuh) is chosen once for the whole launch:
//   STRATA_COMM=nccl   NCCL; refused on every rank when two ranks of a node would share a GPU
//                      (NCCL needs one GPU per rank);
//   STRATA_COMM=mpi    MPI staged through pinned host memory;
//   unset or auto      NCCL when every rank has a GPU of its own, otherwise MPI staging.
// The ranks agree on the choice before any group is built, so a node short of GPUs cannot leave
// the others waiting in NCCL.
//
// Which group uses what:
//   tp, embedding  the engine, on the compute stream: a tensor-parallel all-reduce sits between
//                  two kernels of one layer, so it runs in the stream's order;
//   cp             the engine, on a stream of its own: the ring's next key/value block moves
//                  while the current one is attended to (each transfer ordered after the kernels
//                  enqueued before it; layers/context_attention.hpp waits before reading);
//   dp             the engine, on a stream of its own: bucket reductions overlap backward (each
//                  ordered after the kernels that wrote its bucket);
//   pp             MPI staging, on the compute stream, whatever the engine: the schedule posts
//                  receives ahead and matches messages by tag, which NCCL's in-order,
//                  tag-less send/recv on one stream cannot follow without deadlocking.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "strata/comm/counters.hpp"
#include "strata/comm/gpu_communicator.cuh"
#include "strata/comm/group_ref.hpp"
#include "strata/comm/launch.hpp"
#include "strata/comm/mesh.hpp"
#include "strata/comm/run_groups.hpp"
#include "strata/core/cuda_stream.cuh"
#include "strata/core/error.hpp"
#include "strata/policy/device.hpp"
#include "strata/policy/support.hpp"

namespace strata {

namespace gpu {

// Makes GPU (local rank mod device count) current for this rank and returns its number. When
// some rank sees no GPU, every rank fails with the same words (collective over w).
inline int use_local_device(world& w) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  double without = count > 0 ? 0.0 : 1.0;
  w.comm().all_reduce(std::span<double>(&without, 1), reduce_op::sum);
  STRATA_CHECK(without == 0.0, "no CUDA device: ", int(without), " of the launch's ", w.size(),
               " ranks found none (cudaGetDeviceCount)");
  const int device = w.local_rank() % count;
  STRATA_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

// How many ranks of this rank's node share one GPU, at most (1: every rank has its own).
// Collective over `world_comm`; after use_local_device. The ranks compare their current devices'
// PCI bus ids, not counts: a rank that sees one GPU of eight (Slurm's --gpus-per-task, or
// CUDA_VISIBLE_DEVICES set per rank) still has a GPU of its own.
inline int ranks_per_device(mpi_communicator& world_comm) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(world_comm.native(), MPI_COMM_TYPE_SHARED, world_comm.rank(), MPI_INFO_NULL, &node);
  int local = 1;
  MPI_Comm_size(node, &local);
  constexpr int id_bytes = 32;  // "dddd:bb:dd.f" and room to spare
  std::array<char, id_bytes> id{};
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetPCIBusId(id.data(), id_bytes, device) != cudaSuccess) {
    cudaGetLastError();
    std::snprintf(id.data(), id_bytes, "device %d", device);  // no bus id: the device number stands in
  }
  std::vector<char> all(std::size_t(local) * id_bytes);
  MPI_Allgather(id.data(), id_bytes, MPI_CHAR, all.data(), id_bytes, MPI_CHAR, node);
  MPI_Comm_free(&node);
  std::map<std::string, int> sharing;
  int most = 1;
  for (int r = 0; r < local; ++r) {
    const char* at = all.data() + std::size_t(r) * id_bytes;
    most = std::max(most, ++sharing[std::string(at, strnlen(at, id_bytes))]);
  }
  return most;
}

}  // namespace gpu

// The launch's device engine, from STRATA_COMM and whether any node's ranks share a GPU
// (collective over `world_comm`).
inline gpu_comm_engine choose_gpu_comm_engine(mpi_communicator& world_comm) {
  const int sharing = gpu::ranks_per_device(world_comm);
  const char* env = std::getenv("STRATA_COMM");
  const std::string want = env ? env : "auto";
  STRATA_CHECK(want == "auto" || want == "nccl" || want == "mpi", "STRATA_COMM=", want,
               " is not an engine (nccl, mpi or auto)");
  double most = double(sharing);
  world_comm.all_reduce(std::span<double>(&most, 1), reduce_op::max);
  STRATA_CHECK(want != "nccl" || most <= 1.0, "STRATA_COMM=nccl: ", int(most),
               " ranks share one GPU on a node of "
               "this launch; NCCL needs one GPU per rank (STRATA_COMM=mpi stages through host memory instead)");
  if (want == "mpi" || (want == "auto" && most > 1.0)) return gpu_comm_engine::mpi_staged;
  return gpu_comm_engine::nccl;
}

template <class Device>
requires std::is_base_of_v<cuda, Device>
class run_groups<Device> {
 public:
  using dp_comm = gpu_communicator;

  // Collective over the mesh's world: the engine is agreed, then each group's communicator built.
  explicit run_groups(process_mesh& mesh)
      : mesh_(&mesh),
        engine_(choose_gpu_comm_engine(mesh.world())),
        compute_(gpu::current_stream()),
        tp_(mesh.tp(), engine_, compute_, compute_),
        cp_(mesh.cp(), engine_, cp_stream_, compute_),
        dp_(mesh.gradients(), engine_, dp_stream_, compute_),
        pp_(mesh.pp(), gpu_comm_engine::mpi_staged, compute_, compute_) {
    if (mesh.embedding()) embedding_.emplace(*mesh.embedding(), engine_, compute_, compute_);
    check_supported(combination{.device = device_kind::cuda}.with(expert_parallel, mesh.layout().ep), "the GPU groups");
  }
  run_groups(const run_groups&) = delete;
  run_groups& operator=(const run_groups&) = delete;

  gpu_communicator& dp() { return dp_; }
  group_ref tp() { return group_ref(tp_); }
  group_ref cp() { return group_ref(cp_); }
  group_ref pp() { return group_ref(pp_); }
  group_ref embedding() { return embedding_ ? group_ref(*embedding_) : group_ref(); }
  bool has_embedding() const { return embedding_.has_value(); }
  // Without expert parallelism (refused above): a group of one, and the gradient group.
  group_ref ep() { return group_ref(); }
  gpu_communicator& expert_dp() { return dp_; }

  std::string counters_json() const {
    return comm_json({&mesh_->world().counters(), &dp_.counters(), mesh_->layout().cp > 1 ? &cp_.counters() : nullptr,
                      &tp_.counters(), &pp_.counters(), embedding_ ? &embedding_->counters() : nullptr});
  }
  void reset_counters() {
    mesh_->world().reset_counters();
    dp_.reset_counters();
    cp_.reset_counters();
    tp_.reset_counters();
    pp_.reset_counters();
    if (embedding_) embedding_->reset_counters();
  }
  gpu_comm_engine engine_kind() const { return engine_; }
  const char* engine() const { return engine_ == gpu_comm_engine::nccl ? "nccl" : "mpi"; }

 private:
  process_mesh* mesh_;
  gpu_comm_engine engine_;
  cudaStream_t compute_;
  gpu::stream cp_stream_, dp_stream_;
  gpu_communicator tp_, cp_, dp_, pp_;  // dp_: over the gradient group (dp × cp)
  std::optional<gpu_communicator> embedding_;
};

}  // namespace strata
