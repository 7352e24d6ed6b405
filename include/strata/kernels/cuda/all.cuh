// strata/kernels/cuda/all.cuh - every CUDA kernel: one op per header under kernels/cuda/, each
// an overload of the host kernel's function with strata::cuda as its first argument (same
// arguments otherwise), enqueued on the thread's current stream (runtime.cuh). See docs/cuda.md.
#pragma once

#include "strata/kernels/cuda/adamw.cuh"
#include "strata/kernels/cuda/amp_state.hpp"
#include "strata/kernels/cuda/attention.cuh"
#include "strata/kernels/cuda/cross_entropy.cuh"
#include "strata/kernels/cuda/embedding.cuh"
#include "strata/kernels/cuda/gelu.cuh"
#include "strata/kernels/cuda/gemm.cuh"
#include "strata/kernels/cuda/launch_config.hpp"
#include "strata/kernels/cuda/layernorm.cuh"
#include "strata/kernels/cuda/linear.cuh"
#include "strata/kernels/cuda/loss_scale.cuh"
#include "strata/kernels/cuda/reduce.cuh"
#include "strata/kernels/cuda/residual.cuh"
#include "strata/kernels/cuda/runtime.cuh"
