// strata/comm/mesh.hpp - the process mesh: the groups of a layout's axes, in MPI.
//
//   auto world = strata::launch(argc, argv);
//   return world.run([&] {
//     strata::process_mesh mesh(world, strata::resolve_layout<Layout>(world.size(), overrides));
//     mesh.gradients().all_reduce(grads, strata::reduce_op::avg);
//     mesh.pp().p2p({strata::send_to(mesh.next_stage(), acts), strata::recv_from(mesh.next_stage(), grads)});
//     if (mesh.embedding()) mesh.embedding()->all_reduce(wte_grad);   // tied embedding
//   });
//
// Ranks are placed as mesh_position.hpp describes (tp fastest, then cp, dp, pp). Construction is
// collective over the world: it splits the world communicator into one group per axis of
// policy/mesh_axes.hpp (named "tp", "cp", "dp", "pp"), the gradient group over the axes that
// replicate parameters ("dp_cp"; the dp group itself when cp = 1) and the embedding group of
// first and last stages ("embedding"; empty on middle stages); under expert parallelism the
// expert group ("ep") and the expert-data group ("edp") inside the gradient group. The mesh owns those
// communicators and is passed to whoever needs a group; nothing is global.
//
// When the degrees do not multiply to the world size, the constructor throws strata::error with
//   layout dp=2 x tp=2 x pp=1 = 4 ranks does not match the world size 3
// on every rank, before any communication, so no rank waits for another; world::run turns that
// into the same one line on every rank and exit code 1.
#pragma once
#include <optional>
#include <string>

#include "strata/comm/counters.hpp"
#include "strata/comm/launch.hpp"
#include "strata/comm/mesh_position.hpp"
#include "strata/comm/mpi_communicator.hpp"
#include "strata/policy/layout.hpp"

namespace strata {

class process_mesh {
 public:
  // Collective over `world_comm`, which must outlive the mesh.
  process_mesh(mpi_communicator& world_comm, const layout_config& cfg)
      : world_(&world_comm), layout_(cfg), pos_(mesh_position_of(cfg, world_comm.size(), world_comm.rank())) {
    tp_ = world_comm.split(pos_.tp_color, pos_.tp_rank, "tp");
    cp_ = world_comm.split(pos_.cp_color, pos_.cp_rank, "cp");
    dp_ = world_comm.split(pos_.dp_color, pos_.dp_rank, "dp");
    pp_ = world_comm.split(pos_.pp_color, pos_.pp_rank, "pp");
    if (cfg.cp > 1) gradients_.emplace(world_comm.split(pos_.gradient_color, pos_.gradient_rank, "dp_cp"));
    if (cfg.ep > 1) {
      experts_.emplace(world_comm.split(pos_.expert_color, pos_.ep_rank, "ep"));
      expert_data_.emplace(world_comm.split(pos_.expert_data_color, pos_.expert_data_rank, "edp"));
    }
    mpi_communicator emb = world_comm.split(pos_.embedding_color, pos_.pp_rank, "embedding");
    if (emb.valid()) embedding_.emplace(std::move(emb));
  }
  process_mesh(::strata::world& w, const layout_config& cfg) : process_mesh(w.comm(), cfg) {}

  process_mesh(const process_mesh&) = delete;
  process_mesh& operator=(const process_mesh&) = delete;
  process_mesh(process_mesh&&) = default;
  process_mesh& operator=(process_mesh&&) = default;

  const layout_config& layout() const { return layout_; }
  const mesh_position& position() const { return pos_; }

  mpi_communicator& world() { return *world_; }
  mpi_communicator& dp() { return dp_; }
  mpi_communicator& cp() { return cp_; }
  mpi_communicator& tp() { return tp_; }
  mpi_communicator& pp() { return pp_; }
  // Over the axes that replicate parameters (dp × cp): where gradients are reduced.
  mpi_communicator& gradients() { return gradients_ ? *gradients_ : dp_; }
  // The ranks that share out the experts (nullptr without expert parallelism), and those that
  // hold the same experts, where their gradients are reduced (the gradient group when ep = 1).
  mpi_communicator* experts() { return experts_ ? &*experts_ : nullptr; }
  mpi_communicator& expert_data() { return expert_data_ ? *expert_data_ : gradients(); }
  // The first and last stages of this rank's pipeline; nullptr on a middle stage.
  mpi_communicator* embedding() { return embedding_ ? &*embedding_ : nullptr; }
  const mpi_communicator& world() const { return *world_; }
  const mpi_communicator& dp() const { return dp_; }
  const mpi_communicator& cp() const { return cp_; }
  const mpi_communicator& tp() const { return tp_; }
  const mpi_communicator& gradients() const { return gradients_ ? *gradients_ : dp_; }
  const mpi_communicator& pp() const { return pp_; }
  const mpi_communicator* embedding() const { return embedding_ ? &*embedding_ : nullptr; }

  // Pipeline neighbours as ranks of pp() (no_peer at the ends, so they can go straight into p2p).
  int prev_stage() const { return pos_.prev_stage; }
  int next_stage() const { return pos_.next_stage; }

  // The metrics' `comm` object for this rank: {"world":{...},"dp":{...},"tp":{...},"pp":{...},
  // "embedding":{...}}, with "cp" and "dp_cp" under context parallelism and "ep" and "edp" under
  // expert parallelism (embedding only where this rank is in it).
  std::string counters_json() const {
    const bool context = layout_.cp > 1;
    return comm_json({&world_->counters(), &dp_.counters(), context ? &cp_.counters() : nullptr,
                      gradients_ ? &gradients_->counters() : nullptr, &tp_.counters(), &pp_.counters(),
                      embedding_ ? &embedding_->counters() : nullptr, experts_ ? &experts_->counters() : nullptr,
                      expert_data_ ? &expert_data_->counters() : nullptr});
  }
  void reset_counters() {
    world_->reset_counters();
    dp_.reset_counters();
    cp_.reset_counters();
    if (gradients_) gradients_->reset_counters();
    tp_.reset_counters();
    pp_.reset_counters();
    if (embedding_) embedding_->reset_counters();
    if (experts_) experts_->reset_counters();
    if (expert_data_) expert_data_->reset_counters();
  }

 private:
  mpi_communicator* world_;
  layout_config layout_;
  mesh_position pos_;
  mpi_communicator tp_, cp_, dp_, pp_;
  std::optional<mpi_communicator> gradients_;  // only when cp > 1: dp_ otherwise
  std::optional<mpi_communicator> embedding_;
  std::optional<mpi_communicator> experts_, expert_data_;  // only when ep > 1
};

}  // namespace strata
