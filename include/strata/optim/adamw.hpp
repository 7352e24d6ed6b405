// strata/optim/adamw.hpp - AdamW over the model's flat parameter buffer.
//
// Holds the optimizer state the precision policy asks for: two moments (in the master type)
// and, when weights are stored narrower than the master type, an fp32 master copy of the
// weights. With fp32 AdamW that is 8Ψ bytes of moments and no master copy (the weights are
// their own master), so model state is 4Ψ + 4Ψ + 8Ψ = 16Ψ bytes.
#pragma once
#include <cstdint>

#include "strata/core/memory.hpp"
#include "strata/kernels/host/adamw.hpp"
#include "strata/kernels/host/reduce.hpp"
#include "strata/layers/parameters.hpp"

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

  adamw(parameter_store<T>& params, adamw_options o) : params_(&params), opt_(o) {
    STRATA_CHECK(o.lr >= 0, "adamw: lr (", o.lr, ") must be >= 0");
    STRATA_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "adamw: betas (", o.beta1, ", ", o.beta2,
                 ") must lie in [0, 1)");
    STRATA_CHECK(o.eps > 0, "adamw: eps (", o.eps, ") must be positive");
    STRATA_CHECK(o.weight_decay >= 0, "adamw: weight_decay (", o.weight_decay, ") must be >= 0");
    const auto n = static_cast<std::size_t>(params.size());
    auto& ledger = params.ledger();
    T* w = params.weights_data();
    m_ = buffer<M>(ledger, memory_category::optimizer_state, n);
    v_ = buffer<M>(ledger, memory_category::optimizer_state, n);
    if constexpr (P::precision::keeps_master_copy) {
      master_ = buffer<M>(ledger, memory_category::master_weights, n);
      kernels::convert_array(device{}, master_.data(), w, static_cast<std::int64_t>(n));
    }
  }
  // Takes the parameters of any model that exposes them (north-star: adamw<P> opt(model, {...})).
  template <class Model>
    requires requires(Model& m) { { m.parameters() } -> std::same_as<parameter_store<T>&>; }
  adamw(Model& model, adamw_options o) : adamw(model.parameters(), o) {}

  // One update with learning rate `lr`; every gradient is first multiplied by `grad_scale`
  // (gradient clipping's coefficient divided by the loss scale).
  void step(double lr, double grad_scale = 1.0) {
    ++step_;
    T* w = params_->weights_data();
    T* g = params_->grads_data();
    for (const auto& e : params_->entries()) {
      kernels::adamw_hyper h{lr, opt_.beta1, opt_.beta2, opt_.eps, e.weight_decay ? opt_.weight_decay : 0.0};
      M* master = master_data(w) + e.offset;
      kernels::adamw_update(device{}, master, w + e.offset, g + e.offset, m_.data() + e.offset, v_.data() + e.offset,
                            e.numel, h, step_, grad_scale);
    }
  }

  int steps_taken() const { return step_; }
  const adamw_options& options() const { return opt_; }

 private:
  using device = typename P::device;
  M* master_data(T* weights) {
    if constexpr (P::precision::keeps_master_copy) return master_.data();
    else return weights;  // storage and master agree: the weights are the master copy
  }

  parameter_store<T>* params_;
  adamw_options opt_;
  int step_ = 0;
  buffer<M> m_, v_, master_;
};

}  // namespace strata
