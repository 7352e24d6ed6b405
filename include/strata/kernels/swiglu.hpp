// strata/kernels/swiglu.hpp - the SwiGLU gate between the fused gate|up projection and the down
// projection: swiglu_forward, swiglu_backward.
//
//   gate_up [N, 2H]  per row: the H gate features, then the H up features
//   out     [N, H]   out = silu(gate) · up,  silu(z) = z / (1 + exp(-z))
//
// What a layer includes to call this op on any device: the host overload
// (kernels/host/swiglu.hpp) and, when nvcc compiles the translation unit, the CUDA overload
// (kernels/cuda/swiglu.cuh). A call picks its overload by the device tag it passes.
#pragma once

#include "strata/kernels/host/swiglu.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/swiglu.cuh"
#endif
