// strata/kernels/gelu.hpp - GELU, element-wise, in the tanh approximation (GPT-2's, the default)
// or the exact form (gelu_form.hpp): gelu_forward, gelu_backward, and bias_gelu_backward (GELU's
// backward with the bias gradient of the projection before it).
//
// What a layer includes to call this op on any device: the host overload
// (kernels/host/gelu.hpp) and, when nvcc compiles the translation unit, the CUDA overload
// (kernels/cuda/gelu.cuh). Both are declared before any layer template that calls them, so the
// order in which a program includes strata's headers does not matter. A call picks its overload
// by the device tag it passes: strata::host, strata::cuda, or a tag derived from one of them
// (struct my_gpu : strata::cuda {}), which converts to its base.
#pragma once

#include "strata/kernels/host/gelu.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/gelu.cuh"
#endif
