// strata/kernels/cuda/amp_state.hpp - mixed-precision step state that lives in device memory:
// the dynamic loss scale, the global gradient norm, the clip factor and the optimizer's step
// count, advanced by one single-thread kernel per step, so the GPU never waits for the host.
//
// A step on the GPU (kernels/cuda/loss_scale.cuh runs each line as a kernel on the stream):
//   cross_entropy_forward_backward(..., dloss, &state)   dlogits scaled by dloss * state.scale
//   backward                                             gradients carry the loss scale
//   grad_norm_squared(grads, n, &state)                  state.sumsq = sum g^2 (deterministic)
//   amp_advance(&state, options)                         this header's amp_step(), on the GPU
//   adamw_update(..., hyper, &state)                     skipped when !state.apply; gradients
//                                                        multiplied by state.grad_mult
// amp_step() is plain C++ (STRATA_HD): the CPU tests run the very code the GPU runs. It mirrors
// strata::loss_scaler::update and the trainer's step: the scale used by this step's backward is
// the one the norm and the clip factor divide by; the updated scale applies from the next step.
#pragma once
#include <cstdint>

#include "strata/core/config.hpp"
#include "strata/kernels/cuda/launch_config.hpp"

namespace strata::gpu {

struct amp_options {
  bool dynamic = false;        // dynamic loss scaling (fp16): skip and back off on overflow
  double growth_factor = 2.0;  // after growth_interval clean steps in a row
  double backoff_factor = 0.5;
  double min_scale = 1.0;
  int growth_interval = 2000;
  double max_norm = 1.0;  // global gradient-norm clipping; <= 0 turns it off
  double beta1 = 0.9, beta2 = 0.95;  // AdamW's, for the bias corrections of the applied steps
};

// Plain data, 8-byte aligned; one per optimizer, in device memory (gpu::amp owns one).
struct amp_state {
  double scale = 1.0;      // loss scale the current step's backward uses (initial_scale for fp16)
  double sumsq = 0.0;      // sum of squares of the scaled gradients, written by grad_norm_squared
  double norm = 0.0;       // last step's unscaled global gradient norm
  double grad_mult = 1.0;  // clip / scale: AdamW multiplies every gradient by it
  double bias_correction1 = 1.0, bias_correction2 = 1.0;  // 1 - beta^t for the applied step t
  long long skipped = 0;             // steps skipped for overflow (dynamic scaling)
  long long nonfinite_unscaled = 0;  // non-finite norms without dynamic scaling: an error
  int clean_steps = 0;               // finite steps since the scale last changed
  int step = 0;                      // optimizer steps applied (AdamW's t)
  int apply = 0;                     // 1: the optimizer takes this step
  int found_inf = 0;                 // 1: this step's gradients held an inf or NaN
};

// The clip factor of strata/optim/grad_clip.hpp (clip_coefficient), on host and device.
STRATA_HD inline double amp_clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0;
  return max_norm / (norm + 1e-6);
}

// One step's bookkeeping, after state.sumsq holds the scaled gradients' sum of squares.
STRATA_HD inline void amp_step(amp_state& s, const amp_options& o) {
  const double used = s.scale;
  const double scaled_norm = hd::sqrt(s.sumsq);
  const bool finite = hd::is_finite(scaled_norm);
  s.found_inf = finite ? 0 : 1;
  s.norm = scaled_norm / used;
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
    // The host trainer throws here; on the GPU it is counted and gpu::amp::check() throws.
    s.apply = finite ? 1 : 0;
    if (!finite) ++s.nonfinite_unscaled;
  }
  if (s.apply) {
    ++s.step;
    s.grad_mult = amp_clip_coefficient(s.norm, o.max_norm) / used;
    s.bias_correction1 = 1.0 - hd::pow(o.beta1, double(s.step));
    s.bias_correction2 = 1.0 - hd::pow(o.beta2, double(s.step));
  }
}

}  // namespace strata::gpu
