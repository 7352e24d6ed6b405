// strata/comm/run_groups.hpp - the communicators an assembled run's layers and synchronizer talk
// through, chosen by the policy's device.
//
// A run (train/training.hpp) keeps its process mesh in MPI; what the layers and the gradient
// synchronizer exchange lives in the run's memory, so their groups must reach that memory:
//   st::host    the mesh's MPI communicators themselves (host memory; also the emulated device
//               memory of core/emulated_memory.hpp, which is host memory underneath);
//   st::cuda    comm/gpu_groups.cuh: NCCL, or MPI staged through pinned host memory, on CUDA
//               streams (include it, with nvcc, before instantiating a run under a cuda policy).
// Each gives: dp() (the synchronizer's communicator over the gradient group, dp × cp; its type
// is dp_comm), expert_dp() (the same type, over the ranks holding the same experts), tp(), cp(),
// pp(), ep(), embedding() as group_refs for the layers, and the counters of what those calls moved.
#pragma once
#include <string>
#include <type_traits>

#include "strata/comm/group_ref.hpp"
#include "strata/comm/mesh.hpp"
#include "strata/comm/mpi_communicator.hpp"
#include "strata/policy/device.hpp"

namespace strata {

template <class Device>
class run_groups {
  static_assert(!std::is_base_of_v<cuda, Device>,
                "strata: a run under a cuda policy talks through device communicators: include "
                "<strata/comm/gpu_groups.cuh> (compiled by nvcc) before instantiating strata::training");
  static_assert(std::is_base_of_v<host, Device>,
                "strata::run_groups: not a device (expected strata::host or strata::cuda)");

 public:
  using dp_comm = mpi_communicator;

  explicit run_groups(process_mesh& mesh) : mesh_(&mesh) {}

  mpi_communicator& dp() { return mesh_->gradients(); }
  group_ref tp() { return group_ref(mesh_->tp()); }
  group_ref cp() { return group_ref(mesh_->cp()); }
  group_ref pp() { return group_ref(mesh_->pp()); }
  // The first and last stages' group for a tied embedding; empty (a group of one) elsewhere.
  group_ref embedding() { return mesh_->embedding() ? group_ref(*mesh_->embedding()) : group_ref(); }
  bool has_embedding() const { return mesh_->embedding() != nullptr; }
  // The expert group (a group of one without expert parallelism), and the expert-data group.
  group_ref ep() { return mesh_->experts() ? group_ref(*mesh_->experts()) : group_ref(); }
  mpi_communicator& expert_dp() { return mesh_->expert_data(); }

  // The metrics' `comm` object: what each group moved since the last reset.
  std::string counters_json() const { return mesh_->counters_json(); }
  void reset_counters() { mesh_->reset_counters(); }
  // The engine behind the groups, for logs.
  static constexpr const char* engine() { return "mpi"; }

 private:
  process_mesh* mesh_;
};

}  // namespace strata
