// strata/kernels/cross_entropy.hpp - softmax cross-entropy over the vocabulary, fused with its
// backward, whole or vocabulary-parallel: cross_entropy_forward[_backward], vocab_parallel_*.
//
// What a layer includes to call this op on any device: the host overload
// (kernels/host/cross_entropy.hpp) and, when nvcc compiles the translation unit, the CUDA overload
// (kernels/cuda/cross_entropy.cuh). Both are declared before any layer template that calls them, so the
// order in which a program includes strata's headers does not matter. A call picks its overload
// by the device tag it passes: strata::host, strata::cuda, or a tag derived from one of them
// (struct my_gpu : strata::cuda {}), which converts to its base.
#pragma once

#include "strata/kernels/host/cross_entropy.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/cross_entropy.cuh"
#endif
