// strata/kernels/elementwise.hpp - element-wise ops written once, run on any device: the
// building block for a custom layer's point-wise math (an activation, a gate, a scaled add).
//
//   elementwise(device, rows, cols, outputs(y, ...), inputs(a, b, ...), f)
//   elementwise(device, n, outputs(y, ...), inputs(a, b, ...), f)        (one row of n)
//     for every element (r, c): f(y(r, c)&, ..., a(r, c), b(r, c), ...)
//   for_each_index(device, n, f)                                          f(i), i in [0, n)
//
// Operands are pointers to contiguous [rows, cols] data, or strided(p, ld) for rows ld elements
// apart (the gate and up halves of a fused [N, 2H] matrix: strided(gate_up, 2 * H) and
// strided(gate_up + H, 2 * H)). f receives each input's element widened to the arithmetic type
// (on the host acc_t of the first output's type: float, or double for double; on the GPU float)
// and sets each output's, which is rounded back to that output's type. Outputs are written, not
// read; an output may also be an input (each element is read before it is written), so
// `outputs(g), inputs(g, d)` with y = a + b accumulates. Where an output element must depend on
// other places than its own, for_each_index runs any f(i) (calls for different i must not write
// the same element).
//
// f is written once for both devices: a struct with a STRATA_HD call operator, templated on the
// arithmetic type, holding nothing but numbers (pointers in it are fine for for_each_index).
// Host-side lambdas work on the host only (on the GPU they would need nvcc's --extended-lambda):
//
//   struct squared_relu {
//     template <class A>
//     STRATA_HD void operator()(A& y, A x) const { const A z = x > A(0) ? x : A(0); y = z * z; }
//   };
//   st::kernels::elementwise(device{}, n, st::kernels::outputs(act), st::kernels::inputs(pre), squared_relu{});
//
// hd_exp(x) is e^x in STRATA_HD code: the host's vectorising exp_fast (2 ulp in float), the GPU's expf.
//
// On the host: OpenMP over the elements (rows when strided), static schedule, in parallel above
// elementwise_parallel_threshold elements. On the GPU (kernels/cuda/elementwise.cuh): one
// generated grid-stride kernel, 16-byte packs when the pointers (and row strides) allow, on the
// current stream. Each element is computed on its own, so results do not depend on the thread
// count or the grid. strata's residual and SwiGLU kernels are written with it.
#pragma once

#include "strata/kernels/host/elementwise.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/elementwise.cuh"
#endif
