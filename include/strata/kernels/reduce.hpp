// strata/kernels/reduce.hpp - whole-array helpers: sum_of_squares, all_finite,
// scale_in_place, convert_array.
//
// What a layer includes to call this op on any device: the host overload
// (kernels/host/reduce.hpp) and, when nvcc compiles the translation unit, the CUDA overload
// (kernels/cuda/reduce.cuh). Both are declared before any layer template that calls them, so the
// order in which a program includes strata's headers does not matter. A call picks its overload
// by the device tag it passes: strata::host, strata::cuda, or a tag derived from one of them
// (struct my_gpu : strata::cuda {}), which converts to its base.
#pragma once

#include "strata/kernels/host/reduce.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/reduce.cuh"
#endif
