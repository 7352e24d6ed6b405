// strata/kernels/attention.hpp - causal self-attention between the QKV and output projections:
// attention_forward and attention_backward.
//
// Multi-head, grouped-query and multi-query attention take an attention_shape
// (kernels/attention_shape.hpp: batch, seq, heads, kv_heads, head_dim, scale) over a fused qkv
// buffer whose token rows hold the query heads, then the key heads, then the value heads:
//   attention_forward(device, out, lse, qkv, shape)
//   attention_backward(device, dqkv, dout, qkv, lse, out, shape)      writes dqkv (not read)
// The forward keeps one logsumexp per query row (lse [batch, heads, seq]); backward recomputes the
// probabilities from it and reads rowsum(dout · out) from the forward's output, on every device.
// Multi-head overloads in GPT-2's terms (B, T, C, NH), with `att` for lse and `out` optional
// last, are shorthands for attention_shape::multi_head(B, T, C, NH).
//
// What a layer includes to call this op on any device: the host overload
// (kernels/host/attention.hpp) and, when nvcc compiles the translation unit, the CUDA overload
// (kernels/cuda/attention.cuh). Both are declared before any layer template that calls them, so the
// order in which a program includes strata's headers does not matter. A call picks its overload
// by the device tag it passes: strata::host, strata::cuda, or a tag derived from one of them
// (struct my_gpu : strata::cuda {}), which converts to its base.
#pragma once

#include "strata/kernels/attention_shape.hpp"
#include "strata/kernels/host/attention.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/attention.cuh"
#endif
