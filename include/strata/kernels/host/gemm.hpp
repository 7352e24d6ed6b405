// strata/kernels/host/gemm.hpp - row-major GEMM on the CPU: through a CBLAS (OpenBLAS or MKL) when the
// program has one, through a portable loop GEMM when it has none.
//
//   C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C[M,N]
//   op(A) = A (stored M x K, leading dimension lda) or A^T (stored K x M) when trans_a.
//
// Precision, the same on both paths: float and double accumulate in their own type; bf16 and
// fp16 are widened to fp32, multiplied with fp32 accumulation, and each output is rounded back
// once. With beta == 0, C is not read, so an uninitialised (even NaN) C is fine, as for BLAS.
//
// The path is STRATA_HOST_BLAS: 1 calls cblas_sgemm/dgemm (fp16, and bf16 without a bf16 unit,
// through fp32 copies in the workspace, slots 0, 1, 2; bf16 on AMX or AVX-512 BF16 through
// gemm_bf16.hpp's kernel, fp32 result in slot 2; large fp32 products through that kernel's
// AVX-512 form where the BLAS runs without AVX-512, gemm_detail::own_fp32_kernel); 0 calls
// gemm_detail::reference_gemm. Left undefined, it is 1 exactly when <cblas.h> can be included or
// STRATA_HOST_BLAS_MKL is defined. strata::strata links its BLAS (OpenBLAS, or MKL:
// kernels/host/blas_core.hpp) and puts the CBLAS header on the include path; a program without a
// BLAS (a CUDA-only build, whose st::cuda policy never multiplies on the host) either has no
// cblas.h or defines STRATA_HOST_BLAS=0, and needs no stub header and no BLAS library. Define it
// alike in every translation unit of a program: both paths are the body of one template.
//
// Thread counts: the BLAS path splits C itself, into panels that depend on the shape alone, and
// runs the BLAS on one thread per panel (gemm_detail::blas_panels). Left to its own threads,
// OpenBLAS splits C by the thread count, and on some cores (Haswell's kernels, which Zen runs too)
// its edge kernels round differently from its full tiles: the same product then differs in the
// last bit between 1 and 2 threads. With fixed panels the result does not depend on the thread
// count on any CBLAS. A product with too few panels to share (a small model's weight gradient)
// is also cut along K into fixed slices whose partial products are summed in order
// (gemm_detail::k_slices): the same holds.
//
// reference_gemm is defined whatever the setting, so a test can hold it against the BLAS path in
// one program. It computes each C tile from packed slices of op(A) and op(B) that stay in cache,
// one tile per OpenMP task, every element summed over k in order: the result does not depend on
// the thread count.
#pragma once

#include "strata/kernels/host/blas_core.hpp"  // STRATA_HOST_BLAS and <cblas.h>
#include "strata/kernels/host/gemm_bf16.hpp"  // STRATA_HOST_BF16_GEMM

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/kernels/host/openmp.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

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

inline void check_gemm_args(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                            std::int64_t lda, std::int64_t ldb, std::int64_t ldc) {
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

// blas_panels' split of C: along its longer side (rows M or columns N), into panels of at least
// panel_min and at most max_panels of them, a multiple of panel_align wide. Both depend on the
// shape alone. The BLAS repacks the other operand once per panel; panels of 128 split the
// GPT-2-small shapes evenly over 2 or 3 threads, and on 2 cores the whole costs 5-8% of the
// throughput of OpenBLAS's own threading (docs/architecture.md, "Determinism"). 32 panels keep
// 2 to 16 threads busy.
inline constexpr std::int64_t panel_min = 128, max_panels = 32, panel_align = 16;

// The panels of an M x N result: along rows (by_rows) or columns, `count` of them `width` wide.
struct panel_split {
  bool by_rows;
  std::int64_t extent, width, count;
};
inline panel_split panels_of(std::int64_t M, std::int64_t N) {
  const bool by_rows = M >= N;
  const std::int64_t extent = by_rows ? M : N;
  std::int64_t width = (extent + max_panels - 1) / max_panels;
  width = std::max(panel_min, (width + panel_align - 1) / panel_align * panel_align);
  return {by_rows, extent, width, (extent + width - 1) / width};
}

// Runs call(row0, rows, col0, cols) for each panel of an M x N result: the panels of one call
// on one thread each, and the BLAS inside on that thread alone.
template <class Call>
void blas_panels(std::int64_t M, std::int64_t N, Call&& call) {
  const panel_split split = panels_of(M, N);
  const int threads = int(std::min<std::int64_t>(openmp::max_threads(), split.count));
#pragma omp parallel num_threads(threads)
  {
    openmp::nested_single_thread();
#pragma omp for schedule(static)
    for (std::int64_t p = 0; p < split.count; ++p) {
      const std::int64_t start = p * split.width, size = std::min(split.width, split.extent - start);
      if (split.by_rows) call(start, size, std::int64_t(0), N);
      else call(std::int64_t(0), M, start, size);
    }
  }
}

// A product whose C has fewer panels than split_tasks, and a long K, is also split along K: a
// weight gradient (C out x in, K the tokens) of a small model has one to three panels, which
// leave a second thread idle or half busy. Each slice of K (at least split_k_min long) goes
// into its own M x N partial product; the partials are summed in slice order. The slice count
// depends on the shape alone, so the result does not depend on the thread count.
inline constexpr std::int64_t split_tasks = 8, split_k_min = 256;
inline std::int64_t k_slices(std::int64_t M, std::int64_t N, std::int64_t K) {
  const std::int64_t panels = panels_of(M, N).count;
  if (panels >= split_tasks) return 1;
  return std::clamp<std::int64_t>(K / split_k_min, 1, (split_tasks + panels - 1) / panels);
}

#if STRATA_HOST_BF16_GEMM || STRATA_HOST_FP32_AVX512
// C = alpha op(A) op(B) + beta C through gemm_bf16.hpp's packed kernel: its fp32 sums into c32
// (M x N), then alpha and beta, and one rounding to T.
template <class T>
void packed_product(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const T* A,
                    std::int64_t lda, const T* B, std::int64_t ldb, float beta, T* C, std::int64_t ldc, float* c32) {
  gemm_bf16::product(trans_a, trans_b, M, N, K, A, lda, B, ldb, c32);
#pragma omp parallel for schedule(static) if (M * N > 32768)
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      const float product = alpha * c32[i * N + j];
      C[i * ldc + j] = convert<T>(beta == 0.0f ? product : product + beta * convert<float>(C[i * ldc + j]));
    }
}
#endif

#if STRATA_HOST_BLAS && STRATA_HOST_FP32_AVX512
// Whether an fp32 product runs on strata's AVX-512 kernel (gemm_bf16.hpp) rather than the BLAS:
// where the BLAS runs without AVX-512 on a CPU with it (blas_core::runs_without_avx512), for
// products of a million multiply-adds or more whose C has two blocks or more to share (a single
// block is one thread's; the sliced BLAS path keeps both busy). The shape and the machine decide,
// never the thread count.
inline bool own_fp32_kernel(std::int64_t M, std::int64_t N, std::int64_t K) {
  if (M * N * K < (std::int64_t(1) << 20)) return false;
  const std::int64_t blocks = ((M + gemm_bf16::MC - 1) / gemm_bf16::MC) * ((N + gemm_bf16::NC - 1) / gemm_bf16::NC);
  return blocks >= 2 && gemm_bf16::fp32_available() && blas_core::runs_without_avx512();
}
#endif

#if STRATA_HOST_BLAS
// C = alpha op(A) op(B) + beta C in `slices` slices of K (k_slices), through a CBLAS sgemm:
// each (panel, slice) task on one thread, into partial (slices x M x N floats), then the sum.
template <class Sgemm>
void sgemm_k_sliced(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t slices,
                    float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta,
                    float* C, std::int64_t ldc, float* partial, Sgemm sgemm) {
  const panel_split split = panels_of(M, N);
  const std::int64_t slice = (K + slices - 1) / slices, tasks = split.count * slices;
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
#pragma omp parallel num_threads(int(std::min <std::int64_t>(openmp::max_threads(), tasks)))
  {
    openmp::nested_single_thread();
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const std::int64_t p = t % split.count, q = t / split.count;
      const std::int64_t start = p * split.width, size = std::min(split.width, split.extent - start);
      const std::int64_t r0 = split.by_rows ? start : 0, rows = split.by_rows ? size : M;
      const std::int64_t c0 = split.by_rows ? 0 : start, cols = split.by_rows ? N : size;
      const std::int64_t k0 = q * slice, kn = std::min(slice, K - k0);
      const float* a = trans_a ? A + k0 * lda + r0 : A + r0 * lda + k0;
      const float* b = trans_b ? B + c0 * ldb + k0 : B + k0 * ldb + c0;
      sgemm(CblasRowMajor, ta, tb, int(rows), int(cols), int(kn), alpha, a, int(lda), b, int(ldb), 0.0f,
            partial + q * M * N + r0 * N + c0, int(N));
    }
#pragma omp for schedule(static)
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        float sum = partial[i * N + j];
        for (std::int64_t q = 1; q < slices; ++q) sum += partial[(q * M + i) * N + j];
        C[i * ldc + j] = beta == 0.0f ? sum : sum + beta * C[i * ldc + j];
      }
  }
}
#endif

// reference_gemm's tiles: a task owns an mb x nb tile of C (32 KiB of fp32 accumulators) and
// sweeps K in slices of kb, packing op(A)'s mb x kb slice (64 KiB) and op(B)'s kb x nb slice
// (128 KiB) into dense accumulator-type arrays that the inner loops read from cache.
inline constexpr std::int64_t tile_m = 64, tile_n = 128, tile_k = 256;

// dst[r * cols + c] = op(src)[r0 + r, c0 + c] in the accumulator type, where op(src)[r, c] is
// src[r * ld + c], or src[c * ld + r] when trans. The loop runs along src's rows either way.
template <class Acc, class T>
void pack(Acc* dst, const T* src, std::int64_t ld, bool trans, std::int64_t r0, std::int64_t rows, std::int64_t c0,
          std::int64_t cols) {
  if (!trans) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) dst[r * cols + c] = convert<Acc>(src[(r0 + r) * ld + c0 + c]);
  } else {
    for (std::int64_t c = 0; c < cols; ++c)
      for (std::int64_t r = 0; r < rows; ++r) dst[r * cols + c] = convert<Acc>(src[(c0 + c) * ld + r0 + r]);
  }
}

// The portable GEMM: the contract and precision of kernels::gemm, with no BLAS and no workspace
// (bf16/fp16 are widened while packing). kernels::gemm runs it when STRATA_HOST_BLAS is 0.
template <class T>
void reference_gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, acc_t<T> alpha,
                    const T* A, std::int64_t lda, const T* B, std::int64_t ldb, acc_t<T> beta, T* C, std::int64_t ldc) {
  static_assert(is_scalar_v<T>, "strata::kernels::gemm: T must be float, double, bf16 or fp16");
  using Acc = acc_t<T>;
  check_gemm_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == Acc(0)) {
    // No product to add (BLAS reads neither A nor B then): C = beta * C, or 0 without reading C.
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j)
        C[i * ldc + j] = beta == Acc(0) ? convert<T>(Acc(0)) : convert<T>(beta * convert<Acc>(C[i * ldc + j]));
    return;
  }

  const std::int64_t tiles_n = (N + tile_n - 1) / tile_n, tiles = ((M + tile_m - 1) / tile_m) * tiles_n;
  const std::size_t per_thread = std::size_t(tile_m * tile_k + tile_k * tile_n + tile_m * tile_n);
  const int threads = openmp::max_threads();
  std::vector<Acc> scratch(std::size_t(threads) * per_thread);

#pragma omp parallel num_threads(threads) if (M * N * K > 65536)
  {
    Acc* a_pack = scratch.data() + std::size_t(openmp::thread_id()) * per_thread;
    Acc* b_pack = a_pack + tile_m * tile_k;
    Acc* acc = b_pack + tile_k * tile_n;
#pragma omp for schedule(static)
    for (std::int64_t tile = 0; tile < tiles; ++tile) {
      const std::int64_t i0 = (tile / tiles_n) * tile_m, j0 = (tile % tiles_n) * tile_n;
      const std::int64_t mr = std::min(tile_m, M - i0), nr = std::min(tile_n, N - j0);
      std::fill(acc, acc + mr * nr, Acc(0));
      for (std::int64_t p0 = 0; p0 < K; p0 += tile_k) {
        const std::int64_t kr = std::min(tile_k, K - p0);
        pack(a_pack, A, lda, trans_a, i0, mr, p0, kr);  // op(A)[i0 .. i0+mr, p0 .. p0+kr]
        pack(b_pack, B, ldb, trans_b, p0, kr, j0, nr);  // op(B)[p0 .. p0+kr, j0 .. j0+nr]
        for (std::int64_t i = 0; i < mr; ++i) {
          Acc* c_row = acc + i * nr;
          const Acc* a_row = a_pack + i * kr;
          for (std::int64_t p = 0; p < kr; ++p) {
            const Acc a = a_row[p];
            const Acc* b_row = b_pack + p * nr;
            for (std::int64_t j = 0; j < nr; ++j) c_row[j] += a * b_row[j];
          }
        }
      }
      for (std::int64_t i = 0; i < mr; ++i) {
        T* c = C + (i0 + i) * ldc + j0;
        const Acc* c_row = acc + i * nr;
        if (beta == Acc(0)) {
          for (std::int64_t j = 0; j < nr; ++j) c[j] = convert<T>(alpha * c_row[j]);
        } else {
          for (std::int64_t j = 0; j < nr; ++j) c[j] = convert<T>(alpha * c_row[j] + beta * convert<Acc>(c[j]));
        }
      }
    }
  }
}
}  // namespace gemm_detail

template <class T>
void gemm(host, [[maybe_unused]] workspace& ws, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N,
          std::int64_t K, acc_t<T> alpha, const T* A, std::int64_t lda, const T* B, std::int64_t ldb, acc_t<T> beta,
          T* C, std::int64_t ldc) {
  static_assert(is_scalar_v<T>, "strata::kernels::gemm: T must be float, double, bf16 or fp16");
#if STRATA_HOST_BLAS
  gemm_detail::check_gemm_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  blas_core::ensure_selected();
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  const int k = int(K);

  // One panel of C: rows r0 .. r0+rows of op(A) and columns c0 .. c0+cols of op(B).
  const auto panel_of = [&](auto* a, std::int64_t la, auto* b, std::int64_t lb, auto* c, std::int64_t lc, auto blas) {
    gemm_detail::blas_panels(M, N, [&](std::int64_t r0, std::int64_t rows, std::int64_t c0, std::int64_t cols) {
      blas(CblasRowMajor, ta, tb, int(rows), int(cols), k, alpha, a + (trans_a ? r0 : r0 * la), int(la),
           b + (trans_b ? c0 * lb : c0), int(lb), beta, c + r0 * lc + c0, int(lc));
    });
  };
  const std::int64_t slices = gemm_detail::k_slices(M, N, K);
  if constexpr (std::is_same_v<T, float>) {
#if STRATA_HOST_FP32_AVX512
    if (gemm_detail::own_fp32_kernel(M, N, K)) {
      gemm_detail::packed_product(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                                  ws.floats(std::size_t(M * N), 2));
      return;
    }
#endif
    if (slices > 1)
      gemm_detail::sgemm_k_sliced(trans_a, trans_b, M, N, K, slices, alpha, A, lda, B, ldb, beta, C, ldc,
                                  ws.floats(std::size_t(slices * M * N), 3), cblas_sgemm);
    else panel_of(A, lda, B, ldb, C, ldc, cblas_sgemm);
  } else if constexpr (std::is_same_v<T, double>) {
    panel_of(A, lda, B, ldb, C, ldc, cblas_dgemm);
  } else {
#if STRATA_HOST_BF16_GEMM
    if constexpr (std::is_same_v<T, bf16>) {
      // Below a million multiply-adds the packing costs more than the bf16 unit saves.
      if (M * N * K >= (std::int64_t(1) << 20) && gemm_bf16::available()) {
        // The bf16 inputs as they are (gemm_bf16.hpp), summed into fp32; then alpha, beta, one
        // rounding. (Slices of K side by side, as the sgemm path runs them, measured slower here:
        // one thread multiplies a 96 x 96 x 1024 weight gradient in 54 us, and the partials cost
        // more than the second thread saves.)
        gemm_detail::packed_product(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                                    ws.floats(std::size_t(M * N), 2));
        return;
      }
    }
#endif
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
    const float *a32c = a32, *b32c = b32;
    const std::int64_t la = std::max<std::int64_t>(a_cols, 1), lb = std::max<std::int64_t>(b_cols, 1);
    if (slices > 1)
      gemm_detail::sgemm_k_sliced(trans_a, trans_b, M, N, K, slices, alpha, a32c, la, b32c, lb, beta, c32, N,
                                  ws.floats(std::size_t(slices * M * N), 3), cblas_sgemm);
    else panel_of(a32c, la, b32c, lb, c32, N, cblas_sgemm);
    gemm_detail::narrow_block(C, ldc, c32, M, N);
  }
#else
  gemm_detail::reference_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(gemm)

}  // namespace strata::kernels
