// strata/optim/lr_schedule.hpp - linear warm-up, then cosine decay to a floor.
//
// lr(step) for 0-based steps: (step+1)/warmup · max_lr while warming up, then
// min_lr + (max_lr - min_lr)·(1 + cos(π·progress))/2 with progress running 0 → 1 over the
// remaining steps.
#pragma once
#include <algorithm>
#include <cmath>

#include "strata/core/error.hpp"

namespace strata {

struct warmup_cosine {
  double max_lr = 6e-4;
  double min_lr = 6e-5;
  int warmup_steps = 0;
  int total_steps = 1;

  void validate() const {
    STRATA_CHECK(max_lr > 0, "warmup_cosine: max_lr (", max_lr, ") must be positive");
    STRATA_CHECK(min_lr >= 0 && min_lr <= max_lr, "warmup_cosine: min_lr (", min_lr,
                 ") must lie in [0, max_lr = ", max_lr, "]");
    STRATA_CHECK(total_steps >= 1, "warmup_cosine: total_steps (", total_steps, ") must be >= 1");
    STRATA_CHECK(warmup_steps >= 0 && warmup_steps <= total_steps, "warmup_cosine: warmup_steps (", warmup_steps,
                 ") must lie in [0, total_steps = ", total_steps, "]");
  }

  bool operator==(const warmup_cosine&) const = default;

  double operator()(int step) const {
    if (step < warmup_steps) return max_lr * double(step + 1) / double(warmup_steps);
    const int decay_steps = std::max(1, total_steps - warmup_steps - 1);
    const double progress = std::clamp(double(step - warmup_steps) / double(decay_steps), 0.0, 1.0);
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + std::cos(3.141592653589793 * progress));
  }
};

}  // namespace strata
