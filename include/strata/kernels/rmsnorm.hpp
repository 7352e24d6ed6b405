// strata/kernels/rmsnorm.hpp - root-mean-square normalisation over the last axis (Llama's norm):
// rmsnorm_forward, rmsnorm_backward, and residual_rmsnorm_forward (the residual add fused in
// front: resid = a + b written out, out = rmsnorm(resid), the numbers of the two calls).
//
//   inp, out, dinp, dout [N, C];  weight, dweight [C];  rstd [N] (acc_t)
//   out = inp · rstd · weight,  rstd = 1 / sqrt(mean_c(inp²) + eps)
//
// What a layer includes to call this op on any device: the host overload
// (kernels/host/rmsnorm.hpp) and, when nvcc compiles the translation unit, the CUDA overload
// (kernels/cuda/rmsnorm.cuh). A call picks its overload by the device tag it passes.
#pragma once

#include "strata/kernels/host/rmsnorm.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/rmsnorm.cuh"
#endif
