// The host GEMM's machine-specific paths: OpenBLAS's core selection or MKL's threading layer
// (kernels/host/blas_core.hpp), the bf16 kernel on AMX or AVX-512 BF16 and its fp32 form on
// AVX-512 (kernels/host/gemm_bf16.hpp), at sizes that cross every block edge. On a machine with neither
// unit the bf16 cases run the fp32-copy path and still hold.
#include <doctest/doctest.h>

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "strata/core/init.hpp"
#include "strata/core/memory.hpp"
#include "strata/kernels/all.hpp"

namespace {

namespace k = strata::kernels;
using strata::bf16;
using strata::host;

std::vector<bf16> random_bf16(std::int64_t n, std::uint64_t stream) {
  std::vector<bf16> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = bf16(float(strata::counter_normal(11, stream, i)));
  return v;
}

double value(const std::vector<bf16>& x, std::int64_t ld, bool trans, std::int64_t r, std::int64_t c) {
  return double(float(trans ? x[static_cast<std::size_t>(c * ld + r)] : x[static_cast<std::size_t>(r * ld + c)]));
}

}  // namespace

TEST_CASE("the bf16 GEMM is within one rounding of the exact product plus fp32 accumulation, at every edge") {
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  MESSAGE("bf16 GEMM: " << k::gemm_bf16::describe());
#if STRATA_HOST_BF16_AVX512
  // A CPU that runs a build for AVX-512 BF16 has the unit: the kernel is in use, not skipped.
  CHECK(k::gemm_bf16::available());
#endif
  // M, N, K past the kernel's 192 x 256 x 384 blocks, none a multiple of 16 or 32, K odd.
  const std::int64_t M = 203, N = 270, K = 401;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 0.5f}) {
        const std::int64_t lda = ta ? M : K, ldb = tb ? K : N;
        const auto A = random_bf16(M * K, 1), B = random_bf16(K * N, 2), C0 = random_bf16(M * N, 3);
        auto C = C0;
        const float alpha = 0.75f;
        k::gemm<bf16>(host{}, ws, ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), N);
        double worst = 0;
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t j = 0; j < N; ++j) {
            double exact = 0, magnitude = 0;
            for (std::int64_t p = 0; p < K; ++p) {
              const double t = value(A, lda, ta, i, p) * value(B, ldb, tb, p, j);
              exact += t;
              magnitude += std::fabs(t);
            }
            const double c0 = double(float(C0[static_cast<std::size_t>(i * N + j)]));
            exact = alpha * exact + beta * c0;
            // One bf16 rounding of the result, plus fp32 accumulation over K terms (and alpha, beta).
            const double bound =
                std::fabs(exact) / 256 + (K + 3) * std::ldexp(1.0, -24) * (alpha * magnitude + beta * std::fabs(c0));
            const double got = double(float(C[static_cast<std::size_t>(i * N + j)]));
            worst = std::max(worst, std::fabs(got - exact) / bound);
          }
        INFO("ta ", ta, " tb ", tb, " beta ", beta, ": worst error / bound ", worst);
        CHECK(worst <= 1.0);
      }
}

TEST_CASE("the bf16 GEMM gives the same bits at 1, 2 and 3 threads") {
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  const std::int64_t M = 400, N = 530, K = 800;
  const auto A = random_bf16(M * K, 4), B = random_bf16(K * N, 5);
  std::vector<std::vector<bf16>> results;
  const int before = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    std::vector<bf16> C(static_cast<std::size_t>(M * N));
    k::gemm<bf16>(host{}, ws, false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C.data(), N);
    results.push_back(C);
  }
  omp_set_num_threads(before);
  for (std::size_t r = 1; r < results.size(); ++r)
    CHECK(std::memcmp(results[0].data(), results[r].data(), results[0].size() * sizeof(bf16)) == 0);
}

TEST_CASE("fp32 GEMMs on strata's AVX-512 kernel: fp32 accuracy at every edge, the same bits at 1, 2 and 3 threads") {
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  // M, N, K past the kernel's 192 x 256 x 192 blocks, none a multiple of 16 or 32.
  const std::int64_t M = 203, N = 270, K = 401;
#if STRATA_HOST_BLAS && STRATA_HOST_FP32_AVX512
  const bool own = k::gemm_detail::own_fp32_kernel(M, N, K);
  MESSAGE("fp32 GEMMs of this size: " << std::string(own ? "strata's AVX-512 kernel" : "the BLAS"));
  // Where the BLAS runs without AVX-512 on this CPU, the kernel is what runs, not skipped.
  CHECK(own == (k::gemm_bf16::fp32_available() && k::blas_core::runs_without_avx512()));
  CHECK_FALSE(k::gemm_detail::own_fp32_kernel(96, 96, 1024));  // one block of C: the BLAS's slices share it
#else
  MESSAGE("no AVX-512 fp32 kernel in this build: fp32 runs on the BLAS");
#endif
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 0.5f}) {
        const std::int64_t lda = ta ? M : K, ldb = tb ? K : N;
        std::vector<float> A(static_cast<std::size_t>(M * K)), B(static_cast<std::size_t>(K * N)),
            C0(static_cast<std::size_t>(M * N));
        for (std::size_t i = 0; i < A.size(); ++i) A[i] = float(strata::counter_normal(13, 1, i));
        for (std::size_t i = 0; i < B.size(); ++i) B[i] = float(strata::counter_normal(13, 2, i));
        for (std::size_t i = 0; i < C0.size(); ++i) C0[i] = float(strata::counter_normal(13, 3, i));
        std::vector<std::vector<float>> results;
        const int before = omp_get_max_threads();
        for (int threads : {1, 2, 3}) {
          omp_set_num_threads(threads);
          auto C = C0;
          k::gemm<float>(host{}, ws, ta, tb, M, N, K, 0.75f, A.data(), lda, B.data(), ldb, beta, C.data(), N);
          results.push_back(C);
        }
        omp_set_num_threads(before);
        for (std::size_t r = 1; r < results.size(); ++r)
          CHECK(std::memcmp(results[0].data(), results[r].data(), results[0].size() * sizeof(float)) == 0);
        double worst = 0;
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t j = 0; j < N; ++j) {
            double exact = 0, magnitude = 0;
            for (std::int64_t p = 0; p < K; ++p) {
              const double a = A[static_cast<std::size_t>(ta ? p * lda + i : i * lda + p)];
              const double b = B[static_cast<std::size_t>(tb ? j * ldb + p : p * ldb + j)];
              exact += a * b;
              magnitude += std::fabs(a * b);
            }
            const double c0 = C0[static_cast<std::size_t>(i * N + j)];
            exact = 0.75 * exact + beta * c0;
            const double bound = (K + 3) * std::ldexp(1.0, -24) * (0.75 * magnitude + beta * std::fabs(c0)) + 1e-30;
            worst = std::max(worst, std::fabs(double(results[0][static_cast<std::size_t>(i * N + j)]) - exact) / bound);
          }
        INFO("ta ", ta, " tb ", tb, " beta ", beta, ": worst error / bound ", worst);
        CHECK(worst <= 1.0);
      }
}

TEST_CASE("fp32 GEMMs with few panels are split along K: fp32 accuracy, and the same bits at 1, 2 and 3 threads") {
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  namespace gd = k::gemm_detail;
  // Weight gradients of a small model (out x in, K the tokens), two with K not a multiple of the slices.
  struct shape {
    std::int64_t M, N, K;
  };
  for (const shape s : {shape{96, 96, 1024}, shape{192, 96, 1003}, shape{96, 256, 777}}) {
    const std::int64_t slices = gd::k_slices(s.M, s.N, s.K);
    INFO("M ", s.M, " N ", s.N, " K ", s.K, ": ", gd::panels_of(s.M, s.N).count, " panels, ", slices, " slices");
    CHECK(slices > 1);  // the sliced path is what runs here
#if STRATA_HOST_FP32_AVX512
    CHECK_FALSE(gd::own_fp32_kernel(s.M, s.N, s.K));  // one block of C: not the AVX-512 kernel's
#endif
    for (bool ta : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        const std::int64_t lda = ta ? s.M : s.K;
        std::vector<float> A(static_cast<std::size_t>(s.M * s.K)), B(static_cast<std::size_t>(s.K * s.N)),
            C0(static_cast<std::size_t>(s.M * s.N));
        for (std::size_t i = 0; i < A.size(); ++i) A[i] = float(strata::counter_normal(12, 1, i));
        for (std::size_t i = 0; i < B.size(); ++i) B[i] = float(strata::counter_normal(12, 2, i));
        for (std::size_t i = 0; i < C0.size(); ++i) C0[i] = float(strata::counter_normal(12, 3, i));
        std::vector<std::vector<float>> results;
        const int before = omp_get_max_threads();
        for (int threads : {1, 2, 3}) {
          omp_set_num_threads(threads);
          auto C = C0;
          k::gemm<float>(host{}, ws, ta, false, s.M, s.N, s.K, 0.5f, A.data(), lda, B.data(), s.N, beta, C.data(), s.N);
          results.push_back(C);
        }
        omp_set_num_threads(before);
        for (std::size_t r = 1; r < results.size(); ++r)
          CHECK(std::memcmp(results[0].data(), results[r].data(), results[0].size() * sizeof(float)) == 0);
        double worst = 0;
        for (std::int64_t i = 0; i < s.M; ++i)
          for (std::int64_t j = 0; j < s.N; ++j) {
            double exact = 0, magnitude = 0;
            for (std::int64_t p = 0; p < s.K; ++p) {
              const double a = A[static_cast<std::size_t>(ta ? p * lda + i : i * lda + p)];
              const double t = a * B[static_cast<std::size_t>(p * s.N + j)];
              exact += t;
              magnitude += std::fabs(t);
            }
            const double c0 = C0[static_cast<std::size_t>(i * s.N + j)];
            exact = 0.5 * exact + beta * c0;
            // fp32 accumulation over K terms, the slices' sum, alpha and beta.
            const double bound = (s.K + 8) * std::ldexp(1.0, -24) * (0.5 * magnitude + beta * std::fabs(c0)) + 1e-30;
            worst =
                std::max(worst, std::fabs(double(results[0][static_cast<std::size_t>(i * s.N + j)]) - exact) / bound);
          }
        INFO("ta ", ta, " beta ", beta, ": worst error / bound ", worst);
        CHECK(worst <= 1.0);
      }
  }
  // A product with panels enough for the threads is left whole.
  CHECK(gd::k_slices(1024, 96, 96) == 1);
  CHECK(gd::k_slices(1536, 384, 2048) == 1);
}

TEST_CASE("the host BLAS runs kernels the CPU supports on strata's threads, and is described") {
  const std::string line = k::blas_core::describe();
  MESSAGE("host BLAS: " << (line.empty() ? std::string("(neither OpenBLAS nor MKL)") : line));
#if STRATA_HOST_BLAS && defined(STRATA_HOST_BLAS_MKL)
  CHECK(line.find("MKL ") == 0);
  // After a GEMM, MKL threads on the GNU OpenMP runtime strata's kernels use, and Intel's runtime
  // was never loaded (unless the user chose a threading layer).
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  std::vector<float> a(64 * 64, 1.0f), c(64 * 64);
  k::gemm<float>(host{}, ws, false, false, 64, 64, 64, 1.0f, a.data(), 64, a.data(), 64, 0.0f, c.data(), 64);
  CHECK(c[0] == 64.0f);
  if (!std::getenv("MKL_THREADING_LAYER")) {
    std::ifstream maps("/proc/self/maps");
    const std::string mapped((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
    CHECK(mapped.find("libmkl_gnu_thread") != std::string::npos);
    CHECK(mapped.find("libiomp5") == std::string::npos);
  }
#endif
#if STRATA_OPENBLAS_CORE_SELECTION
  CHECK(line.find("OpenBLAS") == 0);
  const auto& c = k::blas_core::ensure_selected();
  // Whatever OpenBLAS detected, a CPU with AVX2 never runs a pre-AVX2 core unless the user forced one.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && !std::getenv("OPENBLAS_CORETYPE") &&
      !std::getenv("STRATA_OPENBLAS_CORE"))
    CHECK_FALSE(k::blas_core::detail::pre_avx2(c.selected.empty() ? c.detected : c.selected));
#endif
}
