// strata/kernels/embedding.hpp - token plus position embedding: embedding_forward/backward and
// the vocabulary-parallel pieces (embedding_lookup_range, position_embedding_add, ...).
//
// What a layer includes to call this op on any device: the host overload
// (kernels/host/embedding.hpp) and, when nvcc compiles the translation unit, the CUDA overload
// (kernels/cuda/embedding.cuh). Both are declared before any layer template that calls them, so the
// order in which a program includes strata's headers does not matter. A call picks its overload
// by the device tag it passes: strata::host, strata::cuda, or a tag derived from one of them
// (struct my_gpu : strata::cuda {}), which converts to its base.
#pragma once

#include "strata/kernels/host/embedding.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/embedding.cuh"
#endif
