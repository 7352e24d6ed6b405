// strata/kernels/rope.hpp - rotary position embedding of the query and key heads, in place in a
// fused qkv buffer (kernels/attention_shape.hpp's layout): rope_forward, rope_backward.
//
// The Hugging Face / Meta convention (rotate-half pairing): for a head of size d and position p,
// element i < r/2 pairs with i + r/2 and both turn by the angle p · theta^(-2i/r), r the rotary
// size (the head size d, or fewer: partial rotary, elements r .. d-1 left as they are):
//   out[i]       = x[i] cos - x[i + r/2] sin
//   out[i + r/2] = x[i + r/2] cos + x[i] sin
// Value heads are untouched. The rotation is orthogonal, so backward turns the gradients of the
// rotated q and k back by the opposite angle, in place as well.
//
// What a layer includes to call this op on any device: the host overload
// (kernels/host/rope.hpp) and, when nvcc compiles the translation unit, the CUDA overload
// (kernels/cuda/rope.cuh). A call picks its overload by the device tag it passes.
#pragma once

#include "strata/kernels/host/rope.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/rope.cuh"
#endif
