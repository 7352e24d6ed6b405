// strata/kernels/gemm.hpp - row-major GEMM, C = alpha op(A) op(B) + beta C: gemm (OpenBLAS, MKL or
// the portable loop GEMM on the host, cuBLASLt on the GPU).
//
// What a layer includes to call this op on any device: the host overload
// (kernels/host/gemm.hpp) and, when nvcc compiles the translation unit, the CUDA overload
// (kernels/cuda/gemm.cuh). Both are declared before any layer template that calls them, so the
// order in which a program includes strata's headers does not matter. A call picks its overload
// by the device tag it passes: strata::host, strata::cuda, or a tag derived from one of them
// (struct my_gpu : strata::cuda {}), which converts to its base.
#pragma once

#include "strata/kernels/host/gemm.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/gemm.cuh"
#endif
