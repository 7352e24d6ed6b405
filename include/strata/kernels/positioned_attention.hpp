// strata/kernels/positioned_attention.hpp - attention of query rows against a block of keys at
// given absolute positions (key visible iff its position <= the query's), the building block of
// context parallelism (layers/context_attention.hpp):
//   attention_kv_pack(device, kv, qkv, shape)                     the keys and values of qkv, packed
//   positioned_attention_forward(device, out, lse, qkv, q_pos, kv, k_pos, keys, shape)   -> work
//   attention_merge(device, out, lse, part_out, part_lse, shape)   one block's partial result folded in
//   attention_delta(device, D, dout, out, shape)                   rowsum(dout · out)
//   positioned_attention_backward(device, dq, dkv, dout, lse, D, qkv, q_pos, kv, k_pos, keys, shape)
// (layouts in kernels/host/positioned_attention.hpp). What a caller includes to reach the op on
// any device: the host overloads (kernels/host/positioned_attention.hpp) and, when nvcc compiles
// the translation unit, the CUDA overloads (kernels/cuda/positioned_attention.cuh: the same
// arguments, device pointers, positions as device int64 arrays), declared together as
// kernels/attention.hpp does for the serial kernel.
//
// The CUDA kernels are checked against the host ones by tests/cuda/gpu_tests.cu; context
// parallelism's layer path (layers/context_attention.hpp) calls the overloads of its device.
#pragma once

#include "strata/kernels/attention_shape.hpp"
#include "strata/kernels/host/positioned_attention.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/positioned_attention.cuh"
#endif
