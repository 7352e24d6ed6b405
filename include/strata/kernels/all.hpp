// strata/kernels/all.hpp - every kernel op on every device the compiler can build: each per-op
// header kernels/<op>.hpp, which declares the host overload and, under nvcc, the CUDA one. Under
// nvcc it also brings the CUDA runtime pieces the kernels run in (kernels/cuda/runtime.cuh: the
// per-thread gpu::context and its stream, device buffers, checked calls).
//
// Every backward kernel writes the gradient of its inputs (never reading the buffer) and
// accumulates (+=) into the gradients of its parameters (docs/architecture.md, "A training step").
//
// A program includes this (or the per-op headers it uses) in any order relative to strata's
// other headers. It needs no BLAS: without one the host GEMM is a portable loop GEMM
// (kernels/host/gemm.hpp, STRATA_HOST_BLAS).
#pragma once

#include "strata/kernels/activation.hpp"
#include "strata/kernels/adamw.hpp"
#include "strata/kernels/attention.hpp"
#include "strata/kernels/cached_attention.hpp"
#include "strata/kernels/cross_entropy.hpp"
#include "strata/kernels/elementwise.hpp"
#include "strata/kernels/embedding.hpp"
#include "strata/kernels/gelu.hpp"
#include "strata/kernels/gemm.hpp"
#include "strata/kernels/layernorm.hpp"
#include "strata/kernels/linear.hpp"
#include "strata/kernels/loss_scale.hpp"
#include "strata/kernels/moe.hpp"
#include "strata/kernels/positioned_attention.hpp"
#include "strata/kernels/qkv_layout.hpp"
#include "strata/kernels/reduce.hpp"
#include "strata/kernels/residual.hpp"
#include "strata/kernels/rmsnorm.hpp"
#include "strata/kernels/rope.hpp"
#include "strata/kernels/rowwise.hpp"
#include "strata/kernels/swiglu.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/runtime.cuh"
#endif
