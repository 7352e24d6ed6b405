// strata/train/training.hpp - one training run assembled from a model declaration and its policy.
//
//   using Policy = st::policy<st::host, st::parallel<st::data<st::dynamic, st::zero<1>>, st::tensor<2>>, st::fp32>;
//   auto world = st::launch(argc, argv);
//   st::training<my_model<Policy>> run(world, config, {.optimizer = {.lr = 3e-4}});
//   for (...) run.step(data.next_batch(batch, seq));
//
// What it wires, in order, the same on every rank:
//   1. the layout: the policy's layout resolved against the world size and the launch's values
//      (options.layout) - a static value the launch contradicts stops every rank here, naming
//      both (policy/layout.hpp);
//   2. the process mesh: one group per axis (dp, cp, tp, pp), the gradient group dp × cp and the
//      embedding group (comm/mesh.hpp), and the communicators over them that reach the run's
//      memory (comm/run_groups.hpp: MPI on the host, NCCL or staged MPI on GPUs);
//   3. the model, or this rank's pipeline stage of it, split over its tensor group and fed its
//      context chunks of each sequence (parallel/sequential_model.hpp), after checking the
//      layout against the model's tensor extents (and, for a static layout and a static shape,
//      at compile time: layers/tensor_checks.hpp);
//   4. the gradient synchronizer: data parallelism with the layout's ZeRO stage over the gradient
//      group (dp × cp: the parameters are replicated over both) - a rank's share of the experts
//      over the expert-data group under expert parallelism - knowing the tp and pp groups for
//      the global gradient norm;
//   5. the optimizer, built from the synchronizer (it updates exactly this rank's segments);
//   6. the trainer.
// The pieces stay reachable (model(), synchronizer(), optimizer(), mesh()) for what a run adds:
// metrics, checkpoints (checkpointer(), save(), resume()), exports (serial_weights()).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/comm/group_ref.hpp"
#include "strata/comm/launch.hpp"
#include "strata/comm/mesh.hpp"
#include "strata/comm/mpi_communicator.hpp"
#include "strata/comm/run_groups.hpp"
#include "strata/core/memory.hpp"
#include "strata/layers/sequential.hpp"
#include "strata/optim/adamw.hpp"
#include "strata/parallel/data_parallel.hpp"
#include "strata/parallel/gather.hpp"
#include "strata/parallel/sequential_model.hpp"
#include "strata/layers/tensor_checks.hpp"
#include "strata/plan/plan.hpp"
#include "strata/policy/layout.hpp"
#include "strata/policy/support.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/train/token_data.hpp"
#include "strata/train/trainer.hpp"

namespace strata {

struct training_options {
  layout_overrides layout{};                             // what the policy leaves to the launch
  std::vector<std::int64_t> blocks_per_virtual_stage{};  // empty: the blocks split evenly
  recompute_mode recompute = recompute_mode::none;       // for the blocks
  strata::seed seed{};
  adamw_options optimizer{};
  trainer_options trainer{};
  std::int64_t bucket_elems = 1 << 20;  // gradient bucket size, in elements
  // The serial model's weights to start from, in serial_parameters() order (e.g. read from a
  // file); empty: the initializer's. Each rank keeps its pieces before the optimizer copies them.
  std::vector<double> initial_weights{};
  // Where parameters, gradients, optimizer state and activations live; null: host memory. A
  // space that is not host memory sees every byte allocated, freed and moved through it (tests
  // run every layout in one that counts what crosses it, as a GPU's would).
  const memory_space* memory = nullptr;
};

template <class Model>
class training {
 public:
  // The model checks the declaration and its layout first: a mistake in either stops here.
  using model_type = sequential_model<Model>;
  using declaration = typename model_type::declaration;
  using policy = typename model_type::policy;
  using T = typename model_type::T;
  using config = typename model_type::config;
  using groups_type = run_groups<typename policy::device>;
  using sync_type = data_parallel<policy, typename groups_type::dp_comm>;
  using optimizer_type = adamw<policy>;
  using trainer_type = strata::trainer<model_type, optimizer_type, sync_type>;

  training(world& w, const config& c, training_options o = {}) : training(w.comm(), c, std::move(o)) {}
  training(world& w, training_options o = {}) requires has_static_shape<Model>
      : training(w.comm(), Model::shape, std::move(o)) {}
  // Collective over `world_comm`, which must outlive the run.
  training(mpi_communicator& world_comm, const config& c, training_options o = {})
      : options_(checked(std::move(o))),
        ledger_(options_.memory ? *options_.memory : host_memory()),
        mesh_(world_comm, resolve_layout<typename policy::layout>(world_comm.size(), options_.layout)),
        groups_(mesh_),
        model_(ledger_, checked(c, mesh_.layout()), options_.seed, placement()),
        sync_(with_initial_weights(model_), groups_.dp(), groups_.expert_dp(),
              {.zero_stage = mesh_.layout().zero_stage,
               .bucket_elems = options_.bucket_elems,
               .tensor_group = groups_.tp(),
               .pipeline_group = groups_.pp(),
               .context_degree = mesh_.layout().cp}),
        optimizer_(sync_, options_.optimizer),
        trainer_(model_, optimizer_, options_.trainer, sync_) {
    check_combination(world_comm);
  }
  training(const training&) = delete;
  training& operator=(const training&) = delete;

  // One optimizer step over the global batch (every rank passes the same one).
  step_result step(const token_batch& global_batch) { return trainer_.step(global_batch); }

  const layout_config& layout() const { return mesh_.layout(); }
  process_mesh& mesh() { return mesh_; }
  // The communicators the layers and the synchronizer use (the mesh's own on the host).
  groups_type& groups() { return groups_; }
  model_type& model() { return model_; }
  sync_type& synchronizer() { return sync_; }
  optimizer_type& optimizer() { return optimizer_; }
  trainer_type& trainer() { return trainer_; }
  memory_ledger& ledger() { return ledger_; }
  const training_options& options() const { return options_; }
  const config& shape() const { return model_.shape(); }

  // What each rank holds, computes and communicates for `batch` under this layout
  // (plan/plan.hpp), from the model's own layer costs.
  plan_result plan(const strata::batch& b) const {
    plan_setup s;
    s.layout = mesh_.layout();
    s.recompute = options_.recompute;
    s.schedule = parse_pipeline_schedule(mesh_.layout().schedule);
    return plan_model<Model>(model_.shape(), b, s);
  }

  // The serial model's weights, gathered from every piece and stage, in serial_parameters()
  // order (collective).
  std::vector<double> serial_weights() {
    const auto local = sync_.full_weights();
    group_ref tp(mesh_.tp()), pp(mesh_.pp());
    return gather_model_weights(model_.parameters(), std::span<const T>(local), serial_parameters(), tp, pp,
                                groups_.ep());
  }
  std::vector<std::pair<std::string, std::int64_t>> serial_parameters() const {
    return model_type::serial_parameters(model_.shape());
  }

  // ---- checkpoints ----

  // A checkpointer for this run's layout and model (collective; checks the directory now). The
  // run's identity - model, precision, seed - guards the directory: resume() refuses another
  // run's, and so does a run that starts over there (checkpointer::start_new_run()).
  checkpointer make_checkpointer(checkpoint_options o) {
    return checkpointer(std::move(o), group_ref(mesh_.world()), layout_json(), model_json(), options_.seed.value);
  }
  train_state_ref<policy> state() {
    return {model_.parameters(),
            optimizer_,
            {.dp_rank = mesh_.position().gradient_rank,
             .tp_rank = mesh_.tp().rank(),
             .zero_stage = sync_.zero_stage(),
             .expert_data_rank = mesh_.position().expert_data_rank}};
  }
  // Saves the state after steps() steps; returns the checkpoint's directory.
  std::string save(checkpointer& c, std::uint64_t data_position = 0) {
    return c.save(train_progress{.step = trainer_.steps(),
                                 .optimizer_steps = optimizer_.steps_taken(),
                                 .scaler = trainer_.scaler().snapshot(),
                                 .seed = options_.seed.value,
                                 .data_position = data_position},
                  state());
  }
  // Loads the newest checkpoint that verifies, whatever layout saved it, and continues from its
  // step; nullopt when there is none yet. A checkpoint of another seed is refused (its data order
  // differs).
  std::optional<loaded_checkpoint> resume(checkpointer& c) {
    auto loaded = c.resume(state());
    if (!loaded) return loaded;
    STRATA_CHECK(loaded->progress.seed == options_.seed.value, "the checkpoint in '", loaded->path,
                 "' was trained with seed ", loaded->progress.seed, "; this run has seed ", options_.seed.value,
                 " (the data order would change)");
    trainer_.resume_at(loaded->progress.step, loaded->progress.scaler);
    return loaded;
  }
  int steps() const { return trainer_.steps(); }

  nlohmann::json layout_json() const {
    const auto& l = mesh_.layout();
    return {{"world", l.ranks()},
            {"dp", l.dp},
            {"cp", l.cp},
            {"context_form", l.context_form},
            {"tp", l.tp},
            {"pp", l.pp},
            {"ep", l.ep},
            {"zero", l.zero_stage},
            {"sp", l.sequence_parallel == 1},
            {"schedule", l.schedule},
            {"virtual", l.virtual_chunks}};
  }
  // The model's own description when it gives one (Model::describe(config): anything JSON can
  // hold, e.g. a std::map of its shape's numbers); otherwise its serial parameter count and
  // tensors. A checkpoint of another model is refused, naming the field that differs.
  nlohmann::json model_json() const {
    if constexpr (requires(const config& c) { nlohmann::json(Model::describe(c)); }) {
      return nlohmann::json(Model::describe(model_.shape()));
    } else {
      std::int64_t total = 0;
      const auto params = serial_parameters();
      for (const auto& [name, count] : params) total += count;
      return {{"parameters", total}, {"tensors", params.size()}};
    }
  }

 private:
  // One learning rate: the schedule sets each step's rate. Left at its default, the schedule is
  // the optimizer's lr, constant; given, its peak must be the optimizer's lr (a different one
  // would be silently ignored).
  static training_options checked(training_options o) {
    if (o.trainer.schedule == warmup_cosine{}) o.trainer.schedule = {o.optimizer.lr, o.optimizer.lr, 0, 1};
    STRATA_CHECK(o.optimizer.lr == o.trainer.schedule.max_lr, "training: the optimizer's lr (", o.optimizer.lr,
                 ") differs from the schedule's peak (trainer.schedule.max_lr = ", o.trainer.schedule.max_lr,
                 "); the schedule sets each step's rate: give both the same peak");
    return o;
  }
  static const config& checked(const config& c, const layout_config& l) {
    check_tensor_extents<Model>(c, l.tp);
    return c;
  }
  // The model's parameters, set to options.initial_weights when given: before the synchronizer
  // (ZeRO-3 keeps its shard of them) and the optimizer (its master copy) are built.
  parameter_store<T>& with_initial_weights(model_type& m) {
    auto& p = m.parameters();
    if (!options_.initial_weights.empty()) {
      scatter_model_weights(p, std::span<T>(p.weights_data(), std::size_t(p.size())), serial_parameters(),
                            options_.initial_weights);
      options_.initial_weights = {};
    }
    return p;
  }
  // The run against the table of supported combinations (policy/support.hpp), with the layer
  // kinds the model holds on any rank; and expert parallelism needs experts: a model without a
  // mixture-of-experts layer would run every rank alike under ep and waste the layout. Agreed
  // over the world, so every rank says it.
  void check_combination(mpi_communicator& world_comm) {
    double experts = 0;
    for (const auto& e : model_.parameters().entries()) experts += e.expert ? 1 : 0;
    world_comm.all_reduce(std::span<double>(&experts, 1), reduce_op::sum);
    const int ep = mesh_.layout().ep;
    STRATA_CHECK(ep == 1 || experts > 0, "layout ep=", ep,
                 ": the model has no mixture-of-experts layer whose experts expert parallelism could share out");
    auto run = combination_of<policy>(mesh_.layout());
    if (experts > 0) run.with(layer_kind::experts);
    check_supported(run, "training");
  }
  model_placement placement() {
    const auto& l = mesh_.layout();
    model_placement p;
    p.tensor = tensor_parallel(groups_.tp(), l.sequence_parallel == 1);
    p.context =
        context_parallel(groups_.cp(), l.context_form == "all_to_all" ? context_form::all_to_all : context_form::ring);
    p.experts = groups_.ep();
    p.recompute = options_.recompute;
    p.pipeline.shape = {parse_pipeline_schedule(l.schedule), l.pp, l.microbatches, l.virtual_chunks};
    p.pipeline.stage = mesh_.position().pp_rank;
    p.pipeline.blocks_per_virtual_stage = options_.blocks_per_virtual_stage;
    p.pipeline_group = groups_.pp();
    if (groups_.has_embedding()) p.embedding_group = groups_.embedding();
    return p;
  }

  training_options options_;
  memory_ledger ledger_;
  process_mesh mesh_;
  groups_type groups_;
  model_type model_;
  sync_type sync_;
  optimizer_type optimizer_;
  trainer_type trainer_;
};

}  // namespace strata
