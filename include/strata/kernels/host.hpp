// strata/kernels/host.hpp - every host (CPU) kernel: one op per header under kernels/host/.
// Each function takes strata::host as its first argument; the CUDA kernels mirror the
// signatures with strata::cuda.
#pragma once

#include "strata/kernels/host/adamw.hpp"
#include "strata/kernels/host/attention.hpp"
#include "strata/kernels/host/cross_entropy.hpp"
#include "strata/kernels/host/embedding.hpp"
#include "strata/kernels/host/gelu.hpp"
#include "strata/kernels/host/gemm.hpp"
#include "strata/kernels/host/layernorm.hpp"
#include "strata/kernels/host/linear.hpp"
#include "strata/kernels/host/reduce.hpp"
#include "strata/kernels/host/residual.hpp"
