// strata/kernels/rowwise.hpp - reductions over the last dimension, written once, run on any
// device, deterministic: the building blocks of a custom norm.
//
//   row_reduce(device, rows, cols, op)        per row r of [rows, cols]:
//       s = sum over c of op.term(r, c)        (in term's return type: float, or double)
//       v = op.finish(r, s)                    (once per row; may store a per-row value, 1/rms)
//       op.write(r, c, v) for every c          (after the whole sum: may overwrite what term read)
//   sum_columns(device, rows, cols, out, term)
//       out[c] += sum over r of term(r, c)     (summed in term's type, one rounding into out's)
//
// A norm's forward and its input gradient are a row_reduce each; its gain's gradient is a
// sum_columns. The op is a struct with STRATA_HD members term, finish and write holding pointers
// and numbers; term for sum_columns a struct with a STRATA_HD call operator (r, c). For example,
// y = x / sqrt(mean(x²) + eps) and keeping 1/rms:
//
//   struct rms_forward {
//     const T* x; T* y; float* inv; std::int64_t C; float eps;
//     STRATA_HD float term(std::int64_t r, std::int64_t c) const { const float v = st::convert<float>(x[r * C + c]);
//     return v * v; } STRATA_HD float finish(std::int64_t r, float s) const { return inv[r] = 1.0f / std::sqrt(s /
//     float(C) + eps); } STRATA_HD void write(std::int64_t r, std::int64_t c, float s) const { y[r * C + c] =
//     st::convert<T>(st::convert<float>(x[r * C + c]) * s); }
//   };
//
// (std::sqrt of a float: strata::hd::sqrt in code that must also compile for the GPU.)
//
// Every sum has one fixed order that depends on the sizes only - never the thread count, the
// grid or the GPU - so results are the same bits from run to run. On the host
// (kernels/host/rowwise.hpp) rows run in parallel and each row sums in 16 fixed lanes;
// sum_columns cuts the rows into fixed chunks (column_sum.hpp). On the GPU
// (kernels/cuda/rowwise.cuh) one block per row, a fixed butterfly-and-warp order, and
// column_sum.cuh's fixed chunks; the GPU's order differs from the host's, so the two agree to
// rounding, not bit for bit.
#pragma once

#include "strata/kernels/host/rowwise.hpp"
#if defined(__CUDACC__)
#include "strata/kernels/cuda/rowwise.cuh"
#endif
