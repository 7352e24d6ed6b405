// strata/kernels/host/gemm.hpp - row-major GEMM on the CPU through OpenBLAS.
//
//   C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C[M,N]
//   op(A) = A (stored M x K, leading dimension lda) or A^T (stored K x M) when trans_a.
//
// float and double call sgemm/dgemm directly. bf16 and fp16 have no BLAS, so A and B (and C
// when beta != 0) are widened into fp32 scratch from the workspace (slots 0, 1, 2), multiplied
// with sgemm, and C is rounded back once: one rounding per output, fp32 accumulation.
#pragma once
#include <cblas.h>

#include <cstdint>
#include <type_traits>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace gemm_detail {
// Copies a rows x cols block with leading dimension ld into a dense fp32 array (ld = cols).
template <class T>
void widen_block(float* dst, const T* src, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) dst[r * cols + c] = convert<float>(src[r * ld + c]);
}

template <class T>
void narrow_block(T* dst, std::int64_t ld, const float* src, std::int64_t rows, std::int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) dst[r * ld + c] = convert<T>(src[r * cols + c]);
}

inline void check_gemm_args(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N,
                            std::int64_t K, std::int64_t lda, std::int64_t ldb, std::int64_t ldc) {
  STRATA_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M = ", M, ", N = ", N, ", K = ", K);
  const std::int64_t a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
  STRATA_CHECK(lda >= (a_cols > 1 ? a_cols : 1), "gemm: lda = ", lda, " is less than A's ", a_cols, " columns");
  STRATA_CHECK(ldb >= (b_cols > 1 ? b_cols : 1), "gemm: ldb = ", ldb, " is less than B's ", b_cols, " columns");
  STRATA_CHECK(ldc >= (N > 1 ? N : 1), "gemm: ldc = ", ldc, " is less than C's ", N, " columns");
  constexpr std::int64_t blas_int_max = 2147483647;
  STRATA_CHECK(M <= blas_int_max && N <= blas_int_max && K <= blas_int_max && lda <= blas_int_max &&
                   ldb <= blas_int_max && ldc <= blas_int_max,
               "gemm: a size exceeds the 32-bit range of the BLAS interface");
}
}  // namespace gemm_detail

template <class T>
void gemm(host, workspace& ws, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N,
          std::int64_t K, acc_t<T> alpha, const T* A, std::int64_t lda, const T* B, std::int64_t ldb,
          acc_t<T> beta, T* C, std::int64_t ldc) {
  static_assert(is_scalar_v<T>, "strata::kernels::gemm: T must be float, double, bf16 or fp16");
  gemm_detail::check_gemm_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  const int m = int(M), n = int(N), k = int(K);

  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
  } else if constexpr (std::is_same_v<T, double>) {
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
  } else {
    // Stored shapes of A and B; the fp32 copies are dense, so their leading dimension is cols.
    const std::int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
    const std::int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
    float* a32 = ws.floats(std::size_t(a_rows * a_cols), 0);
    float* b32 = ws.floats(std::size_t(b_rows * b_cols), 1);
    float* c32 = ws.floats(std::size_t(M * N), 2);
    gemm_detail::widen_block(a32, A, a_rows, a_cols, lda);
    gemm_detail::widen_block(b32, B, b_rows, b_cols, ldb);
    // With beta == 0 BLAS never reads C, so an uninitialised (even NaN) C is fine, as for sgemm.
    if (beta != 0.0f) gemm_detail::widen_block(c32, C, M, N, ldc);
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a32, int(a_cols > 0 ? a_cols : 1), b32,
                int(b_cols > 0 ? b_cols : 1), beta, c32, n);
    gemm_detail::narrow_block(C, ldc, c32, M, N);
  }
}

}  // namespace strata::kernels
