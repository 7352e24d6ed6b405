// strata/optim/adamw.hpp - AdamW over the model's flat parameter buffer.
//
// Holds the optimizer state the precision policy asks for: two moments (in the master type)
// and, when weights are stored narrower than the master type, an fp32 master copy of the
// weights. With fp32 AdamW that is 8Ψ bytes of moments and no master copy (the weights are
// their own master), so model state is 4Ψ + 4Ψ + 8Ψ = 16Ψ bytes.
//
// Which pieces it updates comes from the gradient synchronizer: adamw<P> opt(sync, {...}) takes
// this rank's segments (all of them, or a ZeRO shard) from it. Built from a model instead, it
// updates every parameter; the trainer refuses to pair that with a synchronizer that shards.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "strata/core/memory.hpp"
#include "strata/core/profile.hpp"
#include "strata/core/step_state.hpp"
#include "strata/kernels/adamw.hpp"
#include "strata/kernels/reduce.hpp"
#include "strata/layers/parameters.hpp"
#include "strata/parallel/dp_layout.hpp"
#include "strata/parallel/gradient_synchronizer.hpp"

namespace strata {

struct adamw_options {
  double lr = 6e-4;  // the peak rate; a schedule passes the step's rate to step()
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.1;  // applied to parameters registered with decay (matrices)
};

template <class P>
class adamw {
 public:
  using T = typename P::storage;
  using M = typename P::master;

  // Every parameter: the serial case, and data parallelism without ZeRO.
  adamw(parameter_store<T>& params, adamw_options o) : adamw(params, o, whole_model_segments(params), params.size()) {}
  // Only the given segments of the flat buffer, with optimizer state for `state_elems`
  // elements: a ZeRO shard (dp_layout::owned_segments()). Under ZeRO-3 the shard's weights
  // live apart from any flat buffer: `state_weights`, indexed like the optimizer state.
  adamw(parameter_store<T>& params, adamw_options o, std::vector<owned_segment> segments, std::int64_t state_elems,
        T* state_weights = nullptr)
      : params_(&params), opt_(o), segments_(std::move(segments)), state_weights_(state_weights) {
    STRATA_CHECK(o.lr >= 0, "adamw: lr (", o.lr, ") must be >= 0");
    STRATA_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "adamw: betas (", o.beta1, ", ", o.beta2,
                 ") must lie in [0, 1)");
    STRATA_CHECK(o.eps > 0, "adamw: eps (", o.eps, ") must be positive");
    STRATA_CHECK(o.weight_decay >= 0, "adamw: weight_decay (", o.weight_decay, ") must be >= 0");
    // Checked before any cast or byte count: a negative or huge count must not wrap.
    STRATA_CHECK(state_elems >= 0 && std::uint64_t(state_elems) <= PTRDIFF_MAX / sizeof(M), "adamw: ", state_elems,
                 " optimizer state elements is not a size");
    const auto n = static_cast<std::size_t>(state_elems);
    auto& ledger = params.ledger();
    m_ = buffer<M>(ledger, memory_category::optimizer_state, n);
    v_ = buffer<M>(ledger, memory_category::optimizer_state, n);
    if constexpr (P::precision::keeps_master_copy) {
      master_ = buffer<M>(ledger, memory_category::master_weights, n);
      for (const auto& s : segments_)
        kernels::convert_array(device{}, master_.data() + s.state, weights_of(s), s.count);
    }
  }
  // What the synchronizer gives this rank to update: its optimizer segments, and under ZeRO-3
  // the shard's weights.
  template <gradient_synchronizer Sync>
  adamw(Sync& sync, adamw_options o)
      : adamw(sync.parameters(), o, sync.optimizer_segments(), sync.optimizer_elements(), sync.state_weights()) {}
  // Every parameter of a model that exposes them (a single rank; see the top of the file).
  template <class Model>
  requires(!gradient_synchronizer<Model> &&
           requires(Model & m) {
             { m.parameters() } -> std::same_as<parameter_store<T>&>;
           }) adamw(Model& model, adamw_options o)
      : adamw(model.parameters(), o) {}

  // One update with learning rate `lr`, as the trainer's step_state decided
  // (core/step_state.hpp): none when state->apply is 0; otherwise step state->step with its
  // bias corrections, every gradient first multiplied by state->grad_mult (gradient clipping's
  // coefficient divided by the loss scale). The state lives in the model's memory space and is
  // read there (on a GPU by the update kernels: the host does not read the norm first); the
  // trainer brings steps_taken() up to date when it reads the state after the step. Gradients
  // are read from the flat gradient buffer, or from `state_grads` (indexed like the optimizer
  // state) when given: a ZeRO shard's reduced gradients.
  void step(double lr, const step_state* state, const T* state_grads = nullptr) {
    STRATA_PROFILE("adamw");
    const T* g = state_grads ? nullptr : params_->grads_data();
    for (const auto& s : segments_) {
      kernels::adamw_hyper h{lr, opt_.beta1, opt_.beta2, opt_.eps, s.decay ? opt_.weight_decay : 0.0};
      T* w = weights_of(s);
      M* master = master_data(w, s);
      const T* grad = state_grads ? state_grads + s.state : g + s.flat;
      kernels::adamw_update(device{}, master, w, grad, m_.data() + s.state, v_.data() + s.state, s.count, h, state);
    }
  }

  int steps_taken() const { return step_; }
  parameter_store<T>& parameters() const { return *params_; }
  // Where the ZeRO-3 shard's weights live (null: the flat buffer).
  const T* state_weights() const { return state_weights_; }
  std::int64_t state_elements() const { return static_cast<std::int64_t>(m_.size()); }
  const adamw_options& options() const { return opt_; }
  const std::vector<owned_segment>& segments() const { return segments_; }

  // The state a checkpoint keeps, indexed like the segments' `state`: both moments, the master
  // copy (empty when the weights are their own master), each segment's weights, and the step
  // count behind the bias correction.
  std::span<M> first_moments() { return {m_.data(), m_.size()}; }
  std::span<M> second_moments() { return {v_.data(), v_.size()}; }
  std::span<M> master_weights() { return {master_.data(), master_.size()}; }
  T* segment_weights(const owned_segment& s) { return weights_of(s); }
  // The count a checkpoint or the trainer's step_state holds.
  void restore_steps_taken(int steps) {
    STRATA_CHECK(steps >= 0, "adamw: a step count of ", steps, " cannot be restored");
    step_ = steps;
  }

 private:
  using device = typename P::device;
  // The segment's weights: in the flat buffer, or in the ZeRO-3 shard.
  T* weights_of(const owned_segment& s) {
    return state_weights_ ? state_weights_ + s.state : params_->weights_data() + s.flat;
  }
  M* master_data([[maybe_unused]] T* segment_weights, const owned_segment& s) {
    if constexpr (P::precision::keeps_master_copy) return master_.data() + s.state;
    else return segment_weights;  // storage and master agree: the weights are the master copy
  }

  parameter_store<T>* params_;
  adamw_options opt_;
  std::vector<owned_segment> segments_;
  T* state_weights_ = nullptr;
  int step_ = 0;
  buffer<M> m_, v_, master_;
};

}  // namespace strata
