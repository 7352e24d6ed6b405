// strata/train/trainer.hpp - one optimizer step over a global batch.
//
// A step: zero the gradients; for each micro-batch run forward (the loss gradient scaled by
// loss_scale / micro-batches) and backward, so the gradients sum to those of the mean loss
// over the global batch; take the global gradient norm; with fp16, skip the step and back the
// loss scale off if anything overflowed; clip; let the optimizer update with the schedule's
// learning rate.
//
// Data parallelism plugs in as a gradient synchronizer (parallel/data_parallel.hpp): it picks
// this rank's rows of the global batch, reduces the gradients around each backward (ZeRO 0/1:
// only the last micro-batch's; ZeRO-2: every one, since it keeps no full gradient), gives the
// global gradient norm, and shares the updated weights. Without one, nothing is shared.
//
// The model is any type with
//   double forward(tensor_view<const int32_t> inputs, tensor_view<const int32_t> targets, double grad_scale);
//   void backward();
//   parameter_store<T>& parameters();
#pragma once
#include <chrono>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/kernels/host/reduce.hpp"
#include "strata/optim/adamw.hpp"
#include "strata/optim/grad_clip.hpp"
#include "strata/optim/loss_scaler.hpp"
#include "strata/optim/lr_schedule.hpp"
#include "strata/train/token_data.hpp"

namespace strata {

struct trainer_options {
  std::int64_t micro_batch = 0;  // sequences per forward/backward; 0: the whole batch at once
  warmup_cosine schedule{};
  double grad_clip = 1.0;        // max global norm; <= 0 turns clipping off
  double initial_loss_scale = 65536.0;
  int loss_scale_growth_interval = 2000;
};

struct step_result {
  int step = 0;
  double loss = 0, lr = 0, grad_norm = 0, loss_scale = 1;
  bool applied = true;  // false when an fp16 overflow skipped the update
  double seconds = 0;
  std::int64_t tokens = 0;
};

// The synchronizer of a single rank: the whole batch, nothing to reduce or share.
template <class Model>
struct no_sync {
  using T = typename Model::T;
  Model* model;
  std::pair<std::int64_t, std::int64_t> local_rows(std::int64_t batch) const { return {0, batch}; }
  void begin_step() {}
  void after_forward() {}
  void before_backward(bool /*last*/) {}
  void after_backward(bool /*last*/) {}
  double grad_sum_of_squares() {
    auto& p = model->parameters();
    return kernels::sum_of_squares(typename Model::policy::device{}, p.grads_data(), p.size());
  }
  const T* state_gradients() const { return nullptr; }
  void share_weights() {}
  double mean(double v) { return v; }
};

// A model split over pipeline stages runs a whole step's micro-batches itself, under its
// schedule (examples/gpt2/gpt2_pipeline.hpp); the trainer hands it the rows and reduces after.
template <class M>
concept pipelined_model = requires(M& m, tensor_view<const std::int32_t> tokens, std::int64_t rows, int n, double s) {
  { m.run_microbatches(tokens, tokens, rows, n, s) } -> std::convertible_to<double>;
};

template <class Model, class Optimizer, class Sync = no_sync<Model>>
class trainer {
 public:
  trainer(Model& model, Optimizer& opt, trainer_options o)
    requires std::is_same_v<Sync, no_sync<Model>>
      : trainer(model, opt, o, own_sync_, true) {}
  trainer(Model& model, Optimizer& opt, trainer_options o, Sync& sync) : trainer(model, opt, o, sync, false) {}

  step_result step(const token_batch& batch) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto [first_row, rows] = sync_->local_rows(batch.batch);
    const std::int64_t micro = opt_s_.micro_batch > 0 ? opt_s_.micro_batch : rows;
    STRATA_CHECK(rows % micro == 0, "trainer: ", rows, " sequences per rank (global batch ", batch.batch,
                 ") is not a multiple of the micro-batch ", micro);
    const std::int64_t n_micro = rows / micro;
    auto& params = model_->parameters();
    params.zero_grads();
    sync_->begin_step();

    step_result r;
    r.step = step_;
    r.loss_scale = scaler_.scale();
    double loss_sum = 0;
    if constexpr (pipelined_model<Model>) {
      // Every forward and backward of the step happens inside; no gradient is reported ready
      // while the schedule runs, so the synchronizer reduces them all once it is done.
      loss_sum = model_->run_microbatches(batch.input_view(first_row, rows), batch.target_view(first_row, rows), micro,
                                          static_cast<int>(n_micro), r.loss_scale / static_cast<double>(n_micro));
      sync_->before_backward(true);
      sync_->after_backward(true);
    } else {
      for (std::int64_t m = 0; m < n_micro; ++m) {
        const std::int64_t at = first_row + m * micro;
        loss_sum += model_->forward(batch.input_view(at, micro), batch.target_view(at, micro),
                                    r.loss_scale / static_cast<double>(n_micro));
        sync_->after_forward();
        sync_->before_backward(m == n_micro - 1);
        model_->backward();
        sync_->after_backward(m == n_micro - 1);
      }
    }
    r.loss = sync_->mean(loss_sum / static_cast<double>(n_micro));

    const double scaled_norm = std::sqrt(sync_->grad_sum_of_squares());
    const bool finite = std::isfinite(scaled_norm);
    r.grad_norm = scaled_norm / r.loss_scale;
    r.lr = opt_s_.schedule(step_);
    r.applied = scaler_.update(finite);
    if (r.applied) {
      STRATA_CHECK(finite, "trainer: step ", step_, " produced a non-finite gradient norm (", r.grad_norm,
                   ") and no loss scaling is in use to skip it");
      opt_->step(r.lr, clip_coefficient(r.grad_norm, opt_s_.grad_clip) / r.loss_scale, sync_->state_gradients());
      sync_->share_weights();
    }
    ++step_;
    r.tokens = batch.batch * batch.seq;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

  const loss_scaler& scaler() const { return scaler_; }
  int steps() const { return step_; }
  // Continue a run from a checkpoint: `step` steps done, the loss scaler as it was then.
  void resume_at(int step, const loss_scaler::state& scaler) {
    STRATA_CHECK(step >= 0, "trainer: cannot resume at step ", step);
    step_ = step;
    scaler_.restore(scaler);
  }

 private:
  trainer(Model& model, Optimizer& opt, trainer_options o, Sync& sync, bool)
      : model_(&model), opt_(&opt), opt_s_(o), scaler_(scaler_options(o)), sync_(&sync) {
    if constexpr (std::is_same_v<Sync, no_sync<Model>>) own_sync_.model = &model;
    o.schedule.validate();
    STRATA_CHECK(o.micro_batch >= 0, "trainer: micro_batch (", o.micro_batch, ") must be >= 0");
    if constexpr (pipelined_model<Model>) {
      if constexpr (requires { sync.zero_stage(); })
        STRATA_CHECK(sync.zero_stage() <= 1, "trainer: pipeline parallelism works with ZeRO 0 or 1, not ", sync.zero_stage(),
                     " (ZeRO-2/3 would reduce gradients or gather weights for every micro-batch of every stage)");
    }
    if constexpr (std::is_same_v<Sync, no_sync<Model>> && pipelined_model<Model>)
      fail("trainer: a model split over pipeline stages needs a synchronizer that knows the pipeline group "
           "(data_parallel with options.pipeline_group) for its global gradient norm");
    if constexpr (std::is_same_v<Sync, no_sync<Model>>) {
      // A rank of a tensor-parallel model holds pieces: its own squares are not the global
      // gradient norm, and clipping by them would silently differ from the serial model.
      for (const auto& e : model.parameters().entries())
        STRATA_CHECK(!e.shard.sharded(), "trainer: parameter '", e.name,
                     "' is split over a tensor-parallel group; train with a synchronizer that knows the group "
                     "(data_parallel with options.tensor_group, over a data-parallel group of one if need be)");
    }
  }
  static loss_scaler::options scaler_options(const trainer_options& o) {
    loss_scaler::options s;
    s.enabled = Model::policy::precision::dynamic_loss_scale;
    s.initial_scale = o.initial_loss_scale;
    s.growth_interval = o.loss_scale_growth_interval;
    return s;
  }

  Model* model_;
  Optimizer* opt_;
  trainer_options opt_s_;
  loss_scaler scaler_;
  // The trainer's own no-op synchronizer, when none is given.
  std::conditional_t<std::is_same_v<Sync, no_sync<Model>>, no_sync<Model>, char> own_sync_{};
  Sync* sync_;
  int step_ = 0;
};

}  // namespace strata
