// strata/core/grad_clip.hpp - the gradient-clipping coefficient.
//
// The norm is taken over every gradient element of the model (every rank's shards), so clipping
// never depends on how the model is split. STRATA_HD: the step's bookkeeping
// (core/step_state.hpp) calls it on the GPU too, which is why it sits in core with it.
#pragma once
#include "strata/core/config.hpp"

namespace strata {

// The factor that brings a norm down to max_norm (1 when it is already below, or when
// clipping is off with max_norm <= 0).
STRATA_HD inline double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0;
  return max_norm / (norm + 1e-6);
}

}  // namespace strata
