// strata/optim/grad_clip.hpp - the global gradient norm and the clipping coefficient.
//
// The norm is taken over every gradient element of the model (all shards, once the parallel
// layouts exist), so clipping never depends on how the model is split.
#pragma once
#include <cmath>

#include "strata/kernels/host/reduce.hpp"
#include "strata/layers/parameters.hpp"

namespace strata {

// sqrt(sum g²) over the flat gradient buffer, as the gradients stand (loss scale included).
template <class Device, class T>
double global_grad_norm(Device dev, parameter_store<T>& params) {
  return std::sqrt(kernels::sum_of_squares(dev, params.grads_data(), params.size()));
}

// The factor that brings a norm down to max_norm (1 when it is already below, or when
// clipping is off with max_norm <= 0).
inline double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0;
  return max_norm / (norm + 1e-6);
}

}  // namespace strata
