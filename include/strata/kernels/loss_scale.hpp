// strata/kernels/loss_scale.hpp - the mixed-precision step kept on the GPU: the loss scale, the
// global gradient norm and the clip factor in device memory (gpu::amp_state, advanced by the rule
// gpu::amp_step), and, under nvcc, gpu::amp, grad_norm_squared(cuda, ...), amp_advance(cuda, ...).
//
// CUDA only: on the host the same step is strata::loss_scaler (optim/loss_scaler.hpp) over
// kernels::sum_of_squares (kernels/reduce.hpp). amp_state.hpp is plain C++, so every translation
// unit can name the state and its options; the kernels that run it need nvcc, and like every
// per-op header this one declares them before any template that calls them.
#pragma once

#include "strata/kernels/cuda/amp_state.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/loss_scale.cuh"
#endif
