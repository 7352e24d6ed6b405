// strata/kernels/qkv_layout.hpp - a fused QKV projection's output from the per-head layout
// (GPT-NeoX's: each head's q, k and v together, [heads, 3, head_dim] per token) to the grouped
// one every attention kernel reads ([q heads | k heads | v heads], attention_shape.hpp), and back:
// qkv_from_per_head, qkv_to_per_head.
//
// What a layer includes to call this op on any device: the host overload
// (kernels/host/qkv_layout.hpp) and, when nvcc compiles the translation unit, the CUDA overload
// (kernels/cuda/qkv_layout.cuh). A call picks its overload by the device tag it passes.
#pragma once

#include "strata/kernels/host/qkv_layout.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/qkv_layout.cuh"
#endif
