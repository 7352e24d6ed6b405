// strata/kernels/attention.hpp - causal multi-head self-attention between the QKV and output
// projections: attention_forward, attention_backward and attention_saved_per_row.
//
// What a layer includes to call this op on any device: the host overload
// (kernels/host/attention.hpp) and, when nvcc compiles the translation unit, the CUDA overload
// (kernels/cuda/attention.cuh). Both are declared before any layer template that calls them, so the
// order in which a program includes strata's headers does not matter. A call picks its overload
// by the device tag it passes: strata::host, strata::cuda, or a tag derived from one of them
// (struct my_gpu : strata::cuda {}), which converts to its base.
#pragma once

#include "strata/kernels/host/attention.hpp"
// Plain C++, for every compiler: the planner prices CUDA policies in g++ translation units.
#include "strata/kernels/cuda/attention_saved.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/attention.cuh"
#endif
