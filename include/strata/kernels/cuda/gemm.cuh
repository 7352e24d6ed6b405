// strata/kernels/cuda/gemm.cuh - row-major GEMM on the GPU through cuBLASLt.
//
//   C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C[M,N]        (kernels/host/gemm.hpp's contract)
//   op(A) = A (stored M x K, leading dimension lda) or A^T (stored K x M) when trans_a.
//
// cuBLASLt is column-major; gpu::to_colmajor (launch_config.hpp, unit-tested on the CPU) maps
// the call onto C^T = op(B)^T op(A)^T. Precision (gpu::gemm_types_for): bf16/fp16 on tensor
// cores with fp32 accumulation and one rounding of the output; fp32 in true fp32 (TF32 only
// with gpu::this_context().allow_tf32); fp64 in fp64. Epilogues: bias (+ GELU with the
// pre-activation written to an aux buffer) fuse into the GEMM (kernels/cuda/linear.cuh).
// The GEMM runs on the current stream with the context's workspace for that stream.
#pragma once
#include <cublasLt.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/kernels/cuda/common.cuh"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {

inline cudaDataType_t lt_type(gpu::scalar_kind k) {
  switch (k) {
    case gpu::scalar_kind::f32: return CUDA_R_32F;
    case gpu::scalar_kind::f64: return CUDA_R_64F;
    case gpu::scalar_kind::bf16: return CUDA_R_16BF;
    case gpu::scalar_kind::f16: return CUDA_R_16F;
  }
  return CUDA_R_32F;
}
inline cublasComputeType_t lt_compute(gpu::compute_kind k) {
  switch (k) {
    case gpu::compute_kind::f32: return CUBLAS_COMPUTE_32F;
    case gpu::compute_kind::f32_fast_tf32: return CUBLAS_COMPUTE_32F_FAST_TF32;
    case gpu::compute_kind::f64: return CUBLAS_COMPUTE_64F;
  }
  return CUBLAS_COMPUTE_32F;
}

// What the GEMM's epilogue adds: nothing, a bias per output column, or bias then GELU with the
// pre-activation stored to `aux` (row-major, leading dimension ld_aux).
struct lt_epilogue {
  gpu::epilogue_kind kind = gpu::epilogue_kind::none;
  const void* bias = nullptr;
  void* aux = nullptr;
  std::int64_t ld_aux = 0;
};

// Owns the cuBLASLt descriptors of one call.
struct lt_descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  lt_descriptors() = default;
  lt_descriptors(const lt_descriptors&) = delete;
  lt_descriptors& operator=(const lt_descriptors&) = delete;
  ~lt_descriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

inline void check_gemm_args(const char* who, std::int64_t M, std::int64_t N, std::int64_t K, bool trans_a, bool trans_b,
                            std::int64_t lda, std::int64_t ldb, std::int64_t ldc) {
  STRATA_CHECK(M >= 0 && N >= 0 && K >= 0, who, ": negative size M = ", M, ", N = ", N, ", K = ", K);
  const std::int64_t a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
  STRATA_CHECK(lda >= (a_cols > 1 ? a_cols : 1), who, ": lda = ", lda, " is less than A's ", a_cols, " columns");
  STRATA_CHECK(ldb >= (b_cols > 1 ? b_cols : 1), who, ": ldb = ", ldb, " is less than B's ", b_cols, " columns");
  STRATA_CHECK(ldc >= (N > 1 ? N : 1), who, ": ldc = ", ldc, " is less than C's ", N, " columns");
}

// C[r, :] = beta * C[r, :] (+ bias) for a K = 0 product (cuBLASLt wants K >= 1).
template <class T>
__global__ void gemm_k0_kernel(T* C, std::int64_t M, std::int64_t N, std::int64_t ldc, float beta, const T* bias) {
  for (std::int64_t idx = thread_index(); idx < M * N; idx += grid_stride()) {
    const std::int64_t r = idx / N, c = idx % N;
    float v = beta == 0.0f ? 0.0f : beta * widen(C[r * ldc + c]);
    if (bias) v += widen(bias[c]);
    C[r * ldc + c] = narrow<T>(v);
  }
}

// A K = 0 product: C = beta * C (+ bias), which cuBLASLt does not take; refused for fp64 and
// with the GELU epilogue.
template <class T>
void lt_k0_product(const char* who, std::int64_t M, std::int64_t N, acc_t<T> beta, T* C, std::int64_t ldc,
                   const lt_epilogue& ep, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, double>) {
    fail(who, ": K = 0 is not supported for fp64 on the GPU");
  } else {
    STRATA_CHECK(ep.kind != gpu::epilogue_kind::gelu_aux_bias, who, ": K = 0 with the GELU epilogue");
    const auto d = gpu::elementwise_launch(M * N, 1);
    gemm_k0_kernel<T><<<d.grid, d.block, 0, stream>>>(
        C, M, N, ldc, float(beta), static_cast<const T*>(ep.kind == gpu::epilogue_kind::bias ? ep.bias : nullptr));
    STRATA_CUDA_CHECK_LAUNCH(who);
  }
}

// The operation (transposes, compute and scale types, epilogue) and the three operand layouts of
// the column-major call g.
inline void lt_describe(lt_descriptors& d, const gpu::colmajor_gemm& g, const gpu::gemm_types& types,
                        const lt_epilogue& ep) {
  const cudaDataType_t dt = lt_type(types.storage), st = lt_type(types.scale);
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, lt_compute(types.compute), st));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (ep.kind != gpu::epilogue_kind::none) {
    const cublasLtEpilogue_t e =
        ep.kind == gpu::epilogue_kind::bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    STRATA_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ep.bias, sizeof ep.bias));
    if (ep.kind == gpu::epilogue_kind::gelu_aux_bias) {
      STRATA_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep.aux, sizeof ep.aux));
      const std::int64_t ld_aux = ep.ld_aux;
      STRATA_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux, sizeof ld_aux));
    }
  }
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, dt, std::uint64_t(g.a_rows), std::uint64_t(g.a_cols), g.lda));
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, dt, std::uint64_t(g.b_rows), std::uint64_t(g.b_cols), g.ldb));
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, dt, std::uint64_t(g.c_rows), std::uint64_t(g.c_cols), g.ldc));
}

// The one cuBLASLt call behind gemm, linear_forward/backward and the benchmarks.
template <class T>
void lt_matmul(const char* who, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
               acc_t<T> alpha, const T* A, std::int64_t lda, const T* B, std::int64_t ldb, acc_t<T> beta, T* C,
               std::int64_t ldc, const lt_epilogue& ep = {}) {
  check_gemm_args(who, M, N, K, trans_a, trans_b, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  gpu::context& ctx = gpu::this_context();
  const cudaStream_t stream = ctx.stream();
  if (K == 0) {
    lt_k0_product<T>(who, M, N, beta, C, ldc, ep, stream);
    return;
  }

  const gpu::colmajor_gemm g = gpu::to_colmajor(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  const gpu::gemm_types types = gpu::gemm_types_for<T>(ctx.allow_tf32);
  lt_descriptors d;
  lt_describe(d, g, types, ep);

  const std::uint64_t ws_bytes = ctx.gemm_workspace_bytes();
  void* ws = ctx.gemm_workspace(stream);
  // cuBLASLt's heuristic assumes 256-byte aligned operands unless told otherwise; strata's
  // operands are often offsets into flat buffers, so it is told their real alignment. The
  // algorithm it picks is cached per shape, types, epilogue and alignment.
  const std::uint32_t align_a = gpu::pointer_alignment(B), align_b = gpu::pointer_alignment(A),
                      align_c = gpu::pointer_alignment(C);
  const gpu::gemm_key key{{std::int64_t(gpu::scalar_kind_of<T>()), std::int64_t(types.compute), g.trans_a, g.trans_b,
                           g.m, g.n, g.k, g.lda, g.ldb, g.ldc, std::int64_t(ep.kind), ep.ld_aux, std::int64_t(align_a),
                           std::int64_t(align_b), std::int64_t(align_c),
                           std::int64_t(gpu::pointer_alignment(ep.bias)) * 1024 + gpu::pointer_alignment(ep.aux)}};
  const cublasLtMatmulAlgo_t* algo = ctx.find_gemm_algo(key);
  if (algo == nullptr) {
    STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
    STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &ws_bytes, sizeof ws_bytes));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}};
    for (const auto& [attr, value] : aligns)
      STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, attr, &value, sizeof value));
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    STRATA_CUBLAS_CHECK(
        cublasLtMatmulAlgoGetHeuristic(ctx.lt(), d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heuristic, &found));
    STRATA_CHECK(found > 0, who, ": cuBLASLt has no algorithm for ", dtype_name<T>(), " M = ", M, ", N = ", N,
                 ", K = ", K, " (trans_a = ", trans_a, ", trans_b = ", trans_b, ", lda = ", lda, ", ldb = ", ldb,
                 ", ldc = ", ldc, ", operand alignment ", align_b, "/", align_a, "/", align_c, " bytes)");
    algo = ctx.add_gemm_algo(key, heuristic.algo);
  }
  // cuBLASLt's A is strata's B and its B is strata's A (see gpu::to_colmajor).
  STRATA_CUBLAS_CHECK(
      cublasLtMatmul(ctx.lt(), d.op, &alpha, B, d.a, A, d.b, &beta, C, d.c, C, d.c, algo, ws, ws_bytes, stream));
}

}  // namespace cuda_detail

// Same contract as the host gemm; `ws` (the host workspace) is not used: cuBLASLt's device
// workspace belongs to the thread's gpu::context.
template <class T>
void gemm(cuda, workspace& /*ws: unused on the GPU*/, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N,
          std::int64_t K, acc_t<T> alpha, const T* A, std::int64_t lda, const T* B, std::int64_t ldb, acc_t<T> beta,
          T* C, std::int64_t ldc) {
  static_assert(is_scalar_v<T>, "strata::kernels::gemm: T must be float, double, bf16 or fp16");
  cuda_detail::lt_matmul<T>("gemm", trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace strata::kernels
