// strata/kernels/loss_scale.hpp - advance_step(device, state, rules): a step's loss scale,
// gradient norm, clip factor and apply decision (core/step_state.hpp), computed where the
// state lives. On the host (and any space the host can read: the emulated device) it runs
// strata::advance_step directly; on a GPU one device thread runs the same code
// (kernels/cuda/loss_scale.cuh, which also has gpu::amp, an owner of one state in device memory
// for loops written by hand). Like every per-op header it declares both overloads before any
// template that calls them.
#pragma once

#include "strata/core/step_state.hpp"
#include "strata/policy/device.hpp"

namespace strata::kernels {

inline void advance_step(host, step_state* state, const step_rules& rules) { strata::advance_step(*state, rules); }

}  // namespace strata::kernels

#if defined(__CUDACC__)
#include "strata/kernels/cuda/loss_scale.cuh"
#endif
