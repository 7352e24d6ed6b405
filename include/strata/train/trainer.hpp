// strata/train/trainer.hpp - one optimizer step over a global batch.
//
// A step: zero the gradients; for each micro-batch run forward (the loss gradient scaled by
// loss_scale / micro-batches) and backward, so the gradients sum to those of the mean loss
// over the global batch; take the global gradient norm; skip the step if the norm is not finite
// (in every precision: a non-finite gradient is never applied), and with fp16 back the loss
// scale off; clip; let the optimizer update with the schedule's learning rate. Norm, decision,
// clip factor and loss scale live where the model does (a step_state, core/step_state.hpp): on
// a GPU the update is queued without reading the norm, and the host reads the state once,
// after the update, for the step's result.
//
// A skipped step changes nothing but the step count (and, under fp16, the scaler). Steps that
// no smaller loss scale could have saved (fp32 and bf16: every non-finite one; fp16: those at
// the scaler's minimum) stop the run when `nonfinite_step_limit` of them come in a row: the
// weights or the data are broken, and training on would only skip every step.
//
// The gradient synchronizer (parallel/gradient_synchronizer.hpp; data_parallel for any layout)
// picks this rank's rows of the global batch, reduces the gradients around each backward (ZeRO
// 0/1: only the last micro-batch's; ZeRO-2: every one, since it keeps no full gradient), gives
// the global gradient norm, and shares the updated weights. Without one, the rank trains alone.
// The optimizer must update what the synchronizer gives this rank: build it from the
// synchronizer (adamw<P> opt(sync, {...})); a pair that disagrees is refused at construction,
// naming both. A pipelined model runs its micro-batches itself, under its schedule
// (train/trainable_model.hpp): the trainer splits this rank's rows into the schedule's count.
//
// Auxiliary terms (layers/auxiliary_loss.hpp: a router's load-balancing and z-losses) are part
// of the objective the step minimises but not of `loss`, the language-model loss: step_result
// reports them apart, averaged over micro-batches and data-parallel ranks, with the statistics
// of each block (summed over the step's micro-batches and ranks where they are counts).
//
// train/training.hpp assembles model, synchronizer, optimizer and trainer from a policy.
#pragma once
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/core/step_state.hpp"
#include "strata/kernels/loss_scale.hpp"
#include "strata/kernels/reduce.hpp"
#include "strata/layers/auxiliary_loss.hpp"
#include "strata/optim/adamw.hpp"
#include "strata/optim/loss_scaler.hpp"
#include "strata/optim/lr_schedule.hpp"
#include "strata/parallel/gradient_synchronizer.hpp"
#include "strata/train/token_data.hpp"
#include "strata/train/trainable_model.hpp"

namespace strata {

struct trainer_options {
  std::int64_t micro_batch = 0;  // sequences per forward/backward; 0: the whole batch at once
  warmup_cosine schedule{};
  double grad_clip = 1.0;  // max global norm; <= 0 turns clipping off
  double initial_loss_scale = 65536.0;
  int loss_scale_growth_interval = 2000;
  int nonfinite_step_limit = 10;  // such steps in a row before the run stops; 0: never stops
};

struct step_result {
  int step = 0;
  double loss = 0, lr = 0, grad_norm = 0, loss_scale = 1;
  bool applied = true;  // false when a non-finite gradient (an fp16 overflow, or worse) skipped the update
  double seconds = 0;
  std::int64_t tokens = 0;
  // The auxiliary terms' value (coefficients applied; 0 without any) and their blocks' statistics,
  // each row's numbers as the layer that wrote them says (layers/moe.hpp: moe_row_*).
  double aux_loss = 0;
  auxiliary_sums auxiliary;
};

namespace detail {
// The synchronizer of a single rank for Model; a placeholder when Model has no policy, so that
// trainer's own checks (check_trainable_model) name what is missing.
template <class Model>
struct default_sync {
  using type = struct model_without_policy {};
};
template <class Model>
requires requires { typename Model::policy; }
struct default_sync<Model> {
  using type = no_sync<typename Model::policy>;
};
// The model first: with it wrong, the rest would only repeat the error.
template <class Model, class Optimizer, class Sync>
consteval bool check_trainer_parts() {
  check_trainable_model<Model>();
  if constexpr (trainable_model<Model>) {
    check_gradient_synchronizer<Sync>();
    static_assert(std::is_same_v<typename Optimizer::T, typename Model::T>,
                  "strata::trainer: the optimizer's storage type differs from the model's (built for another policy)");
  }
  return true;
}
}  // namespace detail

template <class Model, class Optimizer, class Sync = typename detail::default_sync<Model>::type>
class trainer {
  static_assert(detail::check_trainer_parts<Model, Optimizer, Sync>());
  using own_sync_type = typename detail::default_sync<Model>::type;

 public:
  // A single rank: the whole batch, every parameter.
  trainer(Model& model, Optimizer& opt, trainer_options o) requires std::is_same_v<Sync, own_sync_type>
      : trainer(model, opt, o, nullptr) {}
  trainer(Model& model, Optimizer& opt, trainer_options o, Sync& sync) : trainer(model, opt, o, &sync) {}

  step_result step(const token_batch& batch) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto [first_row, rows] = sync_->local_rows(batch.batch);
    const bool piped = is_pipelined();
    std::int64_t micro = opt_s_.micro_batch > 0 ? opt_s_.micro_batch : rows;
    if constexpr (pipelined_model<Model>) {
      if (piped) {
        const int count = model_->microbatches();
        STRATA_CHECK(rows % count == 0, "trainer: ", rows, " sequences per data-parallel rank (global batch ",
                     batch.batch, ") do not split into the pipeline's ", count, " micro-batches");
        STRATA_CHECK(opt_s_.micro_batch == 0 || opt_s_.micro_batch == rows / count, "trainer: micro_batch ",
                     opt_s_.micro_batch, " was given, but the pipeline splits this rank's ", rows, " sequences into ",
                     count, " micro-batches of ", rows / count, " (leave micro_batch 0 under a pipeline)");
        micro = rows / count;
      }
    }
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
    if (piped) {
      // Every forward and backward of the step happens inside; no gradient is reported ready
      // while the schedule runs, so the synchronizer reduces them all once it is done.
      if constexpr (pipelined_model<Model>)
        loss_sum =
            model_->run_microbatches(batch.input_view(first_row, rows), batch.target_view(first_row, rows), micro,
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
    if constexpr (requires { model_->take_auxiliary(); }) take_auxiliary(r, n_micro);

    // Norm, skip decision, clip factor and loss-scale update are made where the model lives
    // (core/step_state.hpp): on a GPU the host queues the update without reading the norm.
    // The norm is the same on every rank (reduced over the whole model), so is the decision; a
    // skipped update leaves every weight as it was, so sharing them changes nothing.
    step_state* state = state_.data();
    sync_->grad_sum_of_squares_into(&state->sumsq);
    kernels::advance_step(device{}, state, rules_);
    r.lr = opt_s_.schedule(step_);
    opt_->step(r.lr, state, sync_->state_gradients());
    sync_->share_weights();
    // The one read of the state per step: this step's result, and the host's copies of the
    // scaler and the optimizer's step count (what a checkpoint saves).
    step_state after;
    state_.download(&after, 1);
    r.grad_norm = after.norm;
    r.applied = after.apply == 1;
    const bool unsavable = after.found_inf == 1 && scaler_.at_minimum();  // at the scale this step used
    scaler_.restore({after.scale, after.clean_steps, static_cast<long>(after.skipped)});
    opt_->restore_steps_taken(after.step);
    nonfinite_in_a_row_ = unsavable ? nonfinite_in_a_row_ + 1 : 0;
    STRATA_CHECK(opt_s_.nonfinite_step_limit <= 0 || nonfinite_in_a_row_ < opt_s_.nonfinite_step_limit,
                 "trainer: ", nonfinite_in_a_row_, " steps in a row (the last: step ", step_ + 1,
                 " of the run) had a non-finite gradient norm (", r.grad_norm, ")",
                 scaler_.enabled() ? " at the minimum loss scale" : "",
                 " and were skipped; the weights or the data are broken (trainer_options::nonfinite_step_limit)");
    ++step_;
    r.tokens = batch.batch * batch.seq;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

  const loss_scaler& scaler() const { return scaler_; }
  int steps() const { return step_; }
  // Steps in a row skipped for a non-finite gradient that no loss scale could fix (see above).
  int nonfinite_steps_in_a_row() const { return nonfinite_in_a_row_; }
  // Continue a run from a checkpoint: `step` steps done, the loss scaler as it was then.
  // Load the optimizer's state first: its step count goes into the step state too.
  void resume_at(int step, const loss_scaler::state& scaler) {
    STRATA_CHECK(step >= 0, "trainer: cannot resume at step ", step);
    scaler_.restore(scaler);
    step_ = step;
    nonfinite_in_a_row_ = 0;
    upload_state();
  }

 private:
  // The step's auxiliary sums into r: the terms and each row's first `averaged` columns (values)
  // averaged over micro-batches and data-parallel ranks, the other columns (counts) summed. Only a
  // model that reports rows (the same on every rank: its blocks) communicates; a model without
  // auxiliary terms costs nothing.
  void take_auxiliary(step_result& r, std::int64_t n_micro) requires requires(Model& m) { m.take_auxiliary(); }
  {
    auxiliary_sums a = model_->take_auxiliary();
    r.aux_loss = a.objective / static_cast<double>(n_micro);
    constexpr bool reduces_each = requires(Sync & s, std::span<double> v) {
      s.mean_each(v);
      s.sum_each(v);
    };
    if constexpr (!reduces_each)
      STRATA_CHECK(a.empty(),
                   "trainer: the gradient synchronizer has no mean_each/sum_each(std::span<double>) "
                   "to reduce the model's auxiliary statistics over its ranks");
    else if (!a.empty()) {
      std::vector<double> totals = a.rows;
      sync_->sum_each(std::span<double>(totals));
      std::vector<double> values{r.aux_loss};
      for (const double v : a.rows) values.push_back(v / static_cast<double>(n_micro));
      sync_->mean_each(std::span<double>(values));
      r.aux_loss = values[0];
      for (std::int64_t b = 0; b < a.blocks; ++b)
        for (std::int64_t i = 0; i < a.width; ++i) {
          const std::size_t at = std::size_t(b * a.width + i);
          a.rows[at] = i < a.averaged ? values[at + 1] : totals[at];
        }
    }
    r.auxiliary = std::move(a);
  }

  // `given` null: the trainer's own synchronizer of a single rank.
  trainer(Model& model, Optimizer& opt, trainer_options o, Sync* given)
      : model_(&model),
        opt_(&opt),
        opt_s_(o),
        scaler_(scaler_options(o)),
        rules_(step_rules_of(o, opt)),
        state_(model.parameters().ledger(), memory_category::workspace, 1),
        own_sync_(own_sync(model, given == nullptr)),
        sync_(pick(given, own_sync_)) {
    const bool own = given == nullptr;
    o.schedule.validate();
    STRATA_CHECK(o.micro_batch >= 0, "trainer: micro_batch (", o.micro_batch, ") must be >= 0");
    STRATA_CHECK(o.nonfinite_step_limit >= 0, "trainer: nonfinite_step_limit (", o.nonfinite_step_limit,
                 ") must be >= 0");
    STRATA_CHECK(!scaler_.enabled() || (std::isfinite(o.initial_loss_scale) && o.initial_loss_scale > 0),
                 "trainer: initial_loss_scale (", o.initial_loss_scale, ") must be positive and finite");
    check_wiring();
    upload_state();
    if (is_pipelined()) {
      if constexpr (requires { sync_->zero_stage(); })
        STRATA_CHECK(sync_->zero_stage() <= 1, "trainer: pipeline parallelism works with ZeRO 0 or 1, not ",
                     sync_->zero_stage(),
                     " (ZeRO-2/3 would reduce gradients or gather weights for every micro-batch of every stage)");
      STRATA_CHECK(!own,
                   "trainer: a model split over pipeline stages needs a synchronizer that knows the pipeline "
                   "group (data_parallel with options.pipeline_group) for its global gradient norm");
    }
    if (own) {
      // A rank of a tensor-parallel model holds pieces: its own squares are not the global
      // gradient norm, and clipping by them would silently differ from the serial model.
      for (const auto& e : model.parameters().entries())
        STRATA_CHECK(!e.shard.sharded(), "trainer: parameter '", e.name,
                     "' is split over a tensor-parallel group; train with a synchronizer that knows the group "
                     "(data_parallel with options.tensor_group, over a data-parallel group of one if need be)");
    }
  }

  bool is_pipelined() const {
    if constexpr (pipelined_model<Model>) return model_->pipelined();
    else return false;
  }
  // Model, optimizer and synchronizer must agree on the parameters and on which pieces this
  // rank's optimizer updates: the mistakes that would otherwise train silently wrong.
  void check_wiring() const {
    auto& params = model_->parameters();
    STRATA_CHECK(&opt_->parameters() == &params, "trainer: the optimizer was built for another model's parameters");
    STRATA_CHECK(&sync_->parameters() == &params, "trainer: the synchronizer (", sync_->description(),
                 ") was built for another model's parameters");
    const auto expected = sync_->optimizer_segments();
    const bool same = opt_->segments() == expected && opt_->state_weights() == sync_->state_weights();
    STRATA_CHECK(same, "trainer: the optimizer updates ", opt_->state_elements(), " elements in ",
                 opt_->segments().size(), " segments, but the synchronizer, ", sync_->description(),
                 ", gives this rank ", sync_->optimizer_elements(), " elements in ", expected.size(),
                 " segments; build the optimizer from the synchronizer: st::adamw<P> opt(sync, {...})");
  }
  static std::optional<own_sync_type> own_sync(Model& model, bool own) {
    if (!own) return std::nullopt;
    return own_sync_type(model.parameters());
  }
  static Sync* pick(Sync* given, std::optional<own_sync_type>& own) {
    if constexpr (std::is_same_v<Sync, own_sync_type>) return given ? given : &*own;
    else return given;
  }
  // The host's scaler and step count, into the step state where the model lives.
  void upload_state() {
    const auto s = scaler_.snapshot();
    step_state init;
    init.scale = s.scale;
    init.clean_steps = s.clean_steps;
    init.skipped = s.skipped;
    init.step = opt_->steps_taken();
    state_.upload(&init, 1);
  }
  static step_rules step_rules_of(const trainer_options& o, const Optimizer& opt) {
    const auto s = scaler_options(o);
    step_rules r;
    r.dynamic = s.enabled;
    r.growth_factor = s.growth_factor;
    r.backoff_factor = s.backoff_factor;
    r.min_scale = s.min_scale;
    r.growth_interval = s.growth_interval;
    r.max_norm = o.grad_clip;
    r.beta1 = opt.options().beta1;
    r.beta2 = opt.options().beta2;
    return r;
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
  using device = typename Model::policy::device;

  trainer_options opt_s_;
  loss_scaler scaler_;  // the host's copy of the step state's scale, read back after each step
  step_rules rules_;
  buffer<step_state> state_;  // in the model's memory space
  // The trainer's own synchronizer of a single rank, when none is given.
  std::optional<own_sync_type> own_sync_;
  Sync* sync_;
  int step_ = 0;
  int nonfinite_in_a_row_ = 0;
};

}  // namespace strata
