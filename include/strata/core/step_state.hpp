// strata/core/step_state.hpp - what an optimizer step decides after backward, kept where the
// model lives (device memory on a GPU, host memory on the host): the loss scale, the global
// gradient norm, the clip factor, whether the step is applied, and the optimizer's step count.
//
// The trainer's step (train/trainer.hpp), each line in the model's memory space, on a GPU
// kernels (and the groups' collectives) on the stream, so the host never reads the norm between
// backward and update:
//   sync.grad_sum_of_squares_into(&state->sumsq)       sum g^2 over the model, every rank alike
//   kernels::advance_step(device, state, rules)        advance_step() below
//   optimizer.step(lr, state, ...)                     nothing when !state->apply; gradients
//                                                      multiplied by state->grad_mult
// then one read of the state for the step's log line. advance_step() is plain C++ (STRATA_HD):
// the host runs the very code the GPU runs. Its loss-scale rule is strata::loss_scaler's (a test
// holds them equal); the scale used by this step's backward is the one the norm and the clip
// factor divide by, and the updated scale applies from the next step.
//
// In core because the kernels that read and update it (loss scale, cross-entropy, AdamW) and the
// optimizer and trainer that own it sit in folders that may not include each other's.
#pragma once
#include "strata/core/config.hpp"
#include "strata/core/grad_clip.hpp"
#include "strata/core/hd_math.hpp"

namespace strata {

struct step_rules {
  bool dynamic = false;        // dynamic loss scaling (fp16): skip and back off on overflow
  double growth_factor = 2.0;  // after growth_interval clean steps in a row
  double backoff_factor = 0.5;
  double min_scale = 1.0;
  int growth_interval = 2000;
  double max_norm = 1.0;             // global gradient-norm clipping; <= 0 turns it off
  double beta1 = 0.9, beta2 = 0.95;  // AdamW's, for the bias corrections of the applied steps
};

// Plain data, 8-byte aligned; one per trainer, in the model's memory space.
struct step_state {
  double scale = 1.0;      // loss scale the current step's backward uses (initial_scale for fp16)
  double sumsq = 0.0;      // sum of squares of the scaled gradients, over the whole model
  double norm = 0.0;       // last step's unscaled global gradient norm
  double grad_mult = 1.0;  // clip / scale: AdamW multiplies every gradient by it
  double bias_correction1 = 1.0, bias_correction2 = 1.0;  // 1 - beta^t for the applied step t
  long long skipped = 0;                                  // steps skipped for overflow (dynamic scaling)
  long long nonfinite_unscaled = 0;                       // non-finite norms without dynamic scaling
  int clean_steps = 0;                                    // finite steps since the scale last changed
  int step = 0;                                           // optimizer steps applied (AdamW's t)
  int apply = 0;                                          // 1: the optimizer takes this step
  int found_inf = 0;                                      // 1: this step's gradients held an inf or NaN
};

// One step's bookkeeping, after s.sumsq holds the scaled gradients' sum of squares.
STRATA_HD inline void advance_step(step_state& s, const step_rules& o) {
  const double used = s.scale;
  const double scaled_norm = hd::sqrt(s.sumsq);
  const double norm = scaled_norm / used, mult = clip_coefficient(norm, o.max_norm) / used;
  // All three: whatever the scale, inf or NaN never reaches the weights.
  const bool finite = hd::is_finite(scaled_norm) && hd::is_finite(norm) && hd::is_finite(mult);
  s.found_inf = finite ? 0 : 1;
  s.norm = norm;
  if (o.dynamic) {
    if (!finite) {
      const double backed_off = used * o.backoff_factor;
      s.scale = backed_off > o.min_scale ? backed_off : o.min_scale;
      s.clean_steps = 0;
      ++s.skipped;
      s.apply = 0;
    } else {
      if (++s.clean_steps >= o.growth_interval) {
        s.scale = used * o.growth_factor;
        s.clean_steps = 0;
      }
      s.apply = 1;
    }
  } else {
    // Skipped and counted; the trainer stops a run after too many in a row.
    s.apply = finite ? 1 : 0;
    if (!finite) ++s.nonfinite_unscaled;
  }
  if (s.apply) {
    ++s.step;
    s.grad_mult = mult;
    s.bias_correction1 = 1.0 - hd::pow(o.beta1, double(s.step));
    s.bias_correction2 = 1.0 - hd::pow(o.beta2, double(s.step));
  }
}

}  // namespace strata
