// strata/kernels/linear.hpp - fully connected layer, out = inp . weight^T + bias:
// linear_forward, linear_backward, and linear_gelu_forward (with GELU on the output).
//
// What a layer includes to call this op on any device: the host overload
// (kernels/host/linear.hpp) and, when nvcc compiles the translation unit, the CUDA overload
// (kernels/cuda/linear.cuh). Both are declared before any layer template that calls them, so the
// order in which a program includes strata's headers does not matter. A call picks its overload
// by the device tag it passes: strata::host, strata::cuda, or a tag derived from one of them
// (struct my_gpu : strata::cuda {}), which converts to its base.
#pragma once

#include "strata/kernels/host/linear.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/linear.cuh"
#endif
