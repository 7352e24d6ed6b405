// strata/optim/loss_scaler.hpp - dynamic loss scaling for fp16.
//
// fp16's range ends at 65504 and its subnormals at 6e-8: small gradients vanish unless the
// loss is multiplied up first. The scaler starts high; a step whose gradients overflow (inf or
// NaN anywhere) is skipped and the scale halved; after `growth_interval` clean steps in a row
// it doubles again. With scaling off, scale() stays 1 and the scaler never changes; the trainer
// still skips a step whose gradients are not finite (train/trainer.hpp).
#pragma once
#include <algorithm>
#include <cmath>

#include "strata/core/error.hpp"

namespace strata {

class loss_scaler {
 public:
  struct options {
    bool enabled = false;
    double initial_scale = 65536.0;
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int growth_interval = 2000;
    double min_scale = 1.0;
  };

  loss_scaler() = default;
  explicit loss_scaler(options o) : opt_(o), scale_(o.enabled ? o.initial_scale : 1.0) {}

  // Everything that changes as steps go by: what a checkpoint keeps.
  struct state {
    double scale = 1.0;
    int clean_steps = 0;
    long skipped = 0;
  };
  state snapshot() const { return {scale_, clean_steps_, skipped_}; }
  // A state from a checkpoint: a scale of 0, a negative or non-finite one would divide every
  // gradient by it; with scaling off (fp32, bf16) the scale is 1, as every save of it wrote.
  void restore(const state& s) {
    STRATA_CHECK(std::isfinite(s.scale) && s.scale > 0, "loss scaler: cannot restore a loss scale of ", s.scale,
                 " (it must be positive and finite)");
    STRATA_CHECK(opt_.enabled || s.scale == 1.0, "loss scaler: cannot restore a loss scale of ", s.scale,
                 " into a precision without loss scaling (its scale is 1)");
    STRATA_CHECK(s.clean_steps >= 0 && s.skipped >= 0, "loss scaler: cannot restore ", s.clean_steps,
                 " clean steps and ", s.skipped, " skipped steps (neither can be negative)");
    scale_ = s.scale;
    clean_steps_ = s.clean_steps;
    skipped_ = s.skipped;
  }

  double scale() const { return scale_; }
  bool enabled() const { return opt_.enabled; }
  // Whether backing off can no longer help: scaling off, or the scale at its floor.
  bool at_minimum() const { return !opt_.enabled || scale_ <= opt_.min_scale; }
  long skipped_steps() const { return skipped_; }

  // Reports whether this step's gradients were finite; returns whether to apply the step (with
  // scaling off: always - the trainer decides alone, and nothing here changes).
  bool update(bool grads_finite) {
    if (!opt_.enabled) return true;
    if (!grads_finite) {
      scale_ = std::max(opt_.min_scale, scale_ * opt_.backoff_factor);
      clean_steps_ = 0;
      ++skipped_;
      return false;
    }
    if (++clean_steps_ >= opt_.growth_interval) {
      scale_ *= opt_.growth_factor;
      clean_steps_ = 0;
    }
    return true;
  }

 private:
  options opt_{};
  double scale_ = 1.0;
  int clean_steps_ = 0;
  long skipped_ = 0;
};

}  // namespace strata
