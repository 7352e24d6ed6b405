// strata/kernels/adamw.hpp - one AdamW step over a flat array of parameters:
// adamw_update (and adamw_hyper).
//
// What a layer includes to call this op on any device: the host overload
// (kernels/host/adamw.hpp) and, when nvcc compiles the translation unit, the CUDA overload
// (kernels/cuda/adamw.cuh). Both are declared before any layer template that calls them, so the
// order in which a program includes strata's headers does not matter. A call picks its overload
// by the device tag it passes: strata::host, strata::cuda, or a tag derived from one of them
// (struct my_gpu : strata::cuda {}), which converts to its base.
#pragma once

#include "strata/kernels/host/adamw.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/adamw.cuh"
#endif
