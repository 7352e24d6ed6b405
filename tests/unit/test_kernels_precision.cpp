// Host kernels in reduced precision and at their edges: bf16/fp16 against fp32, the dtype
// rounding rules they rely on, GEMM against a plain loop and the portable
// GEMM against the BLAS path, AdamW against a hand computation,
// run-to-run and thread-count determinism, and the error messages for bad ids.
#include <doctest/doctest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "strata/core/init.hpp"
#include "strata/core/memory.hpp"
#include "strata/kernels/all.hpp"

namespace {

namespace k = strata::kernels;
using strata::bf16;
using strata::convert;
using strata::fp16;
using strata::host;
using fvec = std::vector<float>;

// Sizes are int64 in the kernel API and size_t in std::vector.
constexpr std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

fvec randn(std::size_t n, std::uint64_t stream, double scale = 1.0, double shift = 0.0) {
  fvec v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float(shift + scale * strata::counter_normal(7, stream, i));
  return v;
}

template <class T>
std::vector<T> narrow(const fvec& x) {
  std::vector<T> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = convert<T>(x[i]);
  return y;
}
template <class T>
fvec widen(const std::vector<T>& x) {
  fvec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = convert<float>(x[i]);
  return y;
}
// x as the 16-bit type sees it: the fp32 reference runs on exactly these values.
template <class T>
fvec quantized(const fvec& x) {
  return widen(narrow<T>(x));
}

// Unit roundoff of the 16-bit types: rounding to nearest moves a value by at most this
// fraction of itself (8 and 11 significant bits).
template <class T>
constexpr double unit_roundoff = 0;
template <>
constexpr double unit_roundoff<bf16> = 1.0 / 256;  // 2^-8  ~ 3.9e-3
template <>
constexpr double unit_roundoff<fp16> = 1.0 / 2048;  // 2^-11 ~ 4.9e-4
// Below fp16's normal range the spacing is absolute: 2^-24, so half of it may be lost.
template <class T>
constexpr double absolute_floor = 0;
template <>
constexpr double absolute_floor<bf16> = 1e-38;
template <>
constexpr double absolute_floor<fp16> = 1.0 / (1 << 25);

// Compares a kernel's 16-bit output with the same kernel in fp32 on the same (quantised)
// inputs. Every kernel computes in fp32 and rounds each output once, so each element must be
// within one rounding of the fp32 value: |y16 - y32| <= u |y32| + floor. (A kernel that
// accumulated in 16 bits, or rounded twice, would fail this.) Also reports
// max|y16 - y32| / max|y32|, the tensor-relative error, with STRATA_TEST_VERBOSE.
template <class T>
void check_one_rounding(const char* what, const std::vector<T>& got16, const fvec& ref32) {
  REQUIRE(got16.size() == ref32.size());
  double worst_ratio = 0, max_diff = 0, max_ref = 0;
  for (std::size_t i = 0; i < ref32.size(); ++i) {
    const double g = convert<float>(got16[i]), r = ref32[i];
    const double bound = unit_roundoff<T> * std::fabs(r) + absolute_floor<T>;
    worst_ratio = std::max(worst_ratio, std::fabs(g - r) / bound);
    max_diff = std::max(max_diff, std::fabs(g - r));
    max_ref = std::max(max_ref, std::fabs(r));
  }
  if (std::getenv("STRATA_TEST_VERBOSE"))
    std::printf("  %s %-28s tensor-relative error %.2e (bound used: %.0f%%)\n", strata::dtype_name<T>(), what,
                max_diff / max_ref, 100 * worst_ratio);
  INFO(strata::dtype_name<T>(), " ", what, ": worst |y16 - y32| / (u|y32| + floor) = ", worst_ratio);
  CHECK(worst_ratio <= 1.0);
  CHECK(max_diff / max_ref <= 2 * unit_roundoff<T>);
}

template <class T>
bool bit_identical(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Message of the strata::error f throws, or "" when it throws nothing.
template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const strata::error& e) { return e.what(); }
  return "";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// dtype rounding
// ---------------------------------------------------------------------------------------------

TEST_CASE("fp16: every bit pattern widens exactly and narrows back to itself") {
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    const auto h = fp16::from_bits(std::uint16_t(bits));
    const float f = float(h);
    const std::uint32_t sign = bits >> 15, exp = (bits >> 10) & 0x1f, man = bits & 0x3ff;
    if (exp == 0x1f) {
      if (man == 0) CHECK(f == (sign ? -INFINITY : INFINITY));
      else CHECK(std::isnan(f));
      if (man != 0) CHECK(std::isnan(float(fp16(f))));  // NaN stays NaN (quietened)
      else CHECK(fp16(f).bits == bits);
      continue;
    }
    // Reference value from the definition: subnormal man * 2^-24, normal (1024 + man) 2^(exp-25).
    const double magnitude = exp == 0 ? std::ldexp(double(man), -24) : std::ldexp(1024.0 + man, int(exp) - 25);
    const double expected = sign ? -magnitude : magnitude;
    if (double(f) != expected || fp16(f).bits != bits) {
      INFO("fp16 bits 0x", std::hex, bits);
      CHECK(double(f) == expected);
      CHECK(fp16(f).bits == bits);
    }
  }
}

TEST_CASE("fp16: the hardware conversions (F16C) round as the portable code does") {
  // Every half widens to the same float; floats narrow to the same half: every 97th bit
  // pattern of the whole float range, and every pattern around fp16's subnormal, normal and
  // overflow boundaries. Only NaN payloads may differ (both stay NaN).
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    const float hw = fp16::to_float(std::uint16_t(bits)), sw = fp16::to_float_portable(std::uint16_t(bits));
    if (std::isnan(sw)) CHECK(std::isnan(hw));
    else if (std::memcmp(&hw, &sw, 4) != 0) CHECK(std::memcmp(&hw, &sw, 4) == 0);
  }
  auto check_narrow = [](std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    const std::uint16_t hw = fp16::from_float(f), sw = fp16::from_float_portable(f);
    if (std::isnan(f)) CHECK(std::isnan(fp16::to_float_portable(hw)));
    else if (hw != sw) CHECK(hw == sw);
  };
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 97) check_narrow(std::uint32_t(u));
  for (std::uint32_t edge : {0x33000000u, 0x38800000u, 0x477fe000u, 0x7f800000u})
    for (std::uint32_t d = 0; d < 0x4000u; ++d)
      for (std::uint32_t sign : {0u, 0x80000000u}) {
        check_narrow(sign | (edge + d));
        check_narrow(sign | (edge - d));
      }
  const std::string path = STRATA_HOST_F16C ? "F16C instructions" : "portable code (no F16C in this build)";
  MESSAGE("fp16 conversions: " << path);
}

TEST_CASE("bf16: every bit pattern widens exactly and narrows back to itself") {
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    const auto b = bf16::from_bits(std::uint16_t(bits));
    const float f = float(b);
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    if (u != (bits << 16)) CHECK(u == (bits << 16));
    if (std::isnan(f)) CHECK(std::isnan(float(bf16(f))));
    else if (bf16(f).bits != bits) CHECK(bf16(f).bits == bits);
  }
}

TEST_CASE("bf16 and fp16 round to nearest, ties to even") {
  // bf16 keeps 7 fraction bits: near 1 the spacing is 2^-7.
  CHECK(bf16(1.0f + 0x1p-8f).bits == bf16(1.0f).bits);              // tie, 1.0 is even
  CHECK(float(bf16(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);         // tie, rounds up to even
  CHECK(float(bf16(1.0f + 0x1p-8f + 0x1p-20f)) == 1.0f + 0x1p-7f);  // above the tie
  CHECK(float(bf16(-(1.0f + 0x1p-8f))) == -1.0f);                   // symmetric in sign
  // fp16 keeps 10 fraction bits: near 1 the spacing is 2^-10.
  CHECK(fp16(1.0f + 0x1p-11f).bits == 0x3c00);
  CHECK(float(fp16(1.0f + 3 * 0x1p-11f)) == 1.0f + 0x1p-9f);
  CHECK(float(fp16(1.0f + 0x1p-11f + 0x1p-22f)) == 1.0f + 0x1p-10f);
  CHECK(float(fp16(2048.0f + 1.0f)) == 2048.0f);  // spacing 2 above 2048
  CHECK(float(fp16(2048.0f + 3.0f)) == 2052.0f);
}

TEST_CASE("fp16 subnormals, overflow, infinities and NaN") {
  CHECK(fp16(0x1p-24f).bits == 0x0001);            // smallest subnormal
  CHECK(fp16(0x1p-25f).bits == 0x0000);            // half of it: tie to even (zero)
  CHECK(fp16(0x1p-25f * 1.0001f).bits == 0x0001);  // just above the tie
  CHECK(fp16(3 * 0x1p-25f).bits == 0x0002);        // 1.5 ulp: tie to even (2)
  CHECK(fp16(-0x1p-24f).bits == 0x8001);
  CHECK(fp16(1023 * 0x1p-24f).bits == 0x03ff);      // largest subnormal
  CHECK(fp16(0x1p-14f - 0x1p-25f).bits == 0x0400);  // ties up into the smallest normal
  CHECK(fp16(0x1p-14f).bits == 0x0400);
  CHECK(fp16(1e-10f).bits == 0x0000);
  CHECK(fp16(-0.0f).bits == 0x8000);
  CHECK(fp16(65504.0f).bits == 0x7bff);  // largest finite
  CHECK(fp16(65519.0f).bits == 0x7bff);  // below the midpoint to 65536
  CHECK(fp16(65520.0f).bits == 0x7c00);  // the midpoint overflows (ties to even)
  CHECK(fp16(1e10f).bits == 0x7c00);
  CHECK(fp16(-1e10f).bits == 0xfc00);
  CHECK(fp16(INFINITY).bits == 0x7c00);
  CHECK(fp16(-INFINITY).bits == 0xfc00);
  CHECK(std::isnan(float(fp16(NAN))));
}

TEST_CASE("bf16 subnormals, overflow, infinities and NaN") {
  const float smallest_sub = std::numeric_limits<float>::denorm_min();
  CHECK(bf16(65536 * smallest_sub).bits == 0x0001);               // 2^-133: smallest bf16 subnormal
  CHECK(bf16(32768 * smallest_sub).bits == 0x0000);               // tie to even (zero)
  CHECK(bf16(3 * 32768 * smallest_sub).bits == 0x0002);           // tie to even (2)
  CHECK(bf16(std::numeric_limits<float>::max()).bits == 0x7f80);  // rounds past bf16's max
  CHECK(float(bf16::from_bits(0x7f7f)) == 0x1.fep127f);           // largest finite bf16
  CHECK(bf16(INFINITY).bits == 0x7f80);
  CHECK(bf16(-INFINITY).bits == 0xff80);
  CHECK(std::isnan(float(bf16(NAN))));
  // A NaN whose payload sits only in the low 16 bits must not truncate to infinity.
  float low_payload_nan;
  const std::uint32_t nan_bits = 0x7f800001u;
  std::memcpy(&low_payload_nan, &nan_bits, 4);
  CHECK(std::isnan(float(bf16(low_payload_nan))));
}

// ---------------------------------------------------------------------------------------------
// GEMM
// ---------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("gemm matches a plain triple loop for every transpose and padded strides", T, float, double) {
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  const std::int64_t M = 7, N = 5, K = 6, pad = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const std::int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
      const std::int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
      fvec a = randn(sz(a_rows * lda), 100), b = randn(sz(b_rows * ldb), 101), c0 = randn(sz(M * ldc), 102);
      std::vector<T> A(a.begin(), a.end()), B(b.begin(), b.end()), C(c0.begin(), c0.end());
      const double alpha = 0.75, beta = -0.5;
      k::gemm<T>(host{}, ws, ta, tb, M, N, K, T(alpha), A.data(), lda, B.data(), ldb, T(beta), C.data(), ldc);
      for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (std::int64_t p = 0; p < K; ++p)
            s += double(ta ? A[p * lda + i] : A[i * lda + p]) * double(tb ? B[j * ldb + p] : B[p * ldb + j]);
          const double expected = alpha * s + beta * double(c0[i * ldc + j]);
          CHECK(double(C[i * ldc + j]) == doctest::Approx(expected).epsilon(1e-5));
        }
      // Padding between rows of C is never written.
      for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = N; j < ldc; ++j) CHECK(C[i * ldc + j] == T(c0[i * ldc + j]));
    }
}

TEST_CASE_TEMPLATE("gemm in 16 bits equals fp32 gemm rounded once", T, bf16, fp16) {
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  const std::int64_t M = 9, N = 11, K = 33;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        const fvec a = quantized<T>(randn(sz(M * K), 110)), b = quantized<T>(randn(sz(K * N), 111)),
                   c = quantized<T>(randn(sz(M * N), 112));
        const std::int64_t lda = ta ? M : K, ldb = tb ? K : N;
        fvec c32 = c;
        k::gemm<float>(host{}, ws, ta, tb, M, N, K, 1.0f, a.data(), lda, b.data(), ldb, beta, c32.data(), N);
        auto A = narrow<T>(a), B = narrow<T>(b), C = narrow<T>(c);
        k::gemm<T>(host{}, ws, ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, beta, C.data(), N);
        check_one_rounding("gemm", C, c32);
      }
}

// The portable GEMM (gemm_detail::reference_gemm, what kernels::gemm runs without a BLAS)
// against the BLAS path (kernels::gemm in this build) on the same inputs: every transpose,
// padded leading dimensions, alpha/beta including beta = 0 over a NaN C, and sizes that cross
// the reference's 64 x 128 x 256 tiles with partial tiles on every side.
//
// Tolerance. Both paths accumulate in the same type A (fp32, or fp64 for double) and differ only
// in summation order, so with S = |alpha| sum_p |op(A)_ip op(B)_pj| + |beta C_ij| each is within
// (K + 2) u_A S of the exact value (u_A: A's unit roundoff) and:
//   float, double:  |ref - blas| <= 2 (K + 2) u_A S   per element (the rigorous bound), and
//                   max|ref - blas| / max|blas| <= 8 sqrt(K) u_A   over the tensor (the
//                   statistical size of a reordered sum: a real fault lands far above it);
//   bf16, fp16:     each output is its fp32 value rounded once, so the two may differ by one
//                   rounding where the fp32 values straddle a rounding boundary:
//                   |ref - blas| <= 2 u_T max(|ref|, |blas|) + 2 (K + 2) u_fp32 S + floor.
// STRATA_TEST_VERBOSE=1 prints the measured figures.
TEST_CASE_TEMPLATE("the portable GEMM (no BLAS) matches the BLAS path", T, float, double, bf16, fp16) {
  using A = strata::acc_t<T>;
  if (!STRATA_HOST_BLAS) MESSAGE("built without a BLAS: kernels::gemm is reference_gemm itself");
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  const double u_acc = std::is_same_v<A, double> ? 0x1p-53 : 0x1p-24;
  const double u_out = std::is_same_v<T, bf16> ? 0x1p-8 : std::is_same_v<T, fp16> ? 0x1p-11 : 0.0;
  const double floor = std::is_same_v<T, fp16> ? absolute_floor<fp16> : 0.0;
  struct shape {
    std::int64_t M, N, K;
  };
  struct scalars {
    double alpha, beta;
  };
  double worst_bound_ratio = 0, worst_tensor_rel = 0;
  std::size_t differing = 0, total = 0;
  for (const shape sh : {shape{150, 300, 600}, shape{7, 5, 3}, shape{1, 129, 257}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (const scalars sc : {scalars{1.0, 0.0}, scalars{0.75, -0.5}, scalars{-2.0, 1.0}}) {
          const std::int64_t M = sh.M, N = sh.N, K = sh.K, pad = 5;
          const std::int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
          const std::int64_t lda = a_cols + pad, ldb = b_cols + 2 * pad, ldc = N + 3 * pad;
          // Inputs exactly representable in T, so S below is computed from the values T holds.
          const fvec a = quantized<T>(randn(sz(a_rows * lda), 120));
          const fvec b = quantized<T>(randn(sz(b_rows * ldb), 121));
          fvec c0 = quantized<T>(randn(sz(M * ldc), 122));
          // beta = 0: C must not be read, so start it as NaN (padding keeps its random values).
          if (sc.beta == 0)
            for (std::int64_t i = 0; i < M; ++i)
              for (std::int64_t j = 0; j < N; ++j) c0[sz(i * ldc + j)] = std::numeric_limits<float>::quiet_NaN();
          std::vector<T> Av(a.size()), Bv(b.size()), Cblas(c0.size());
          for (std::size_t i = 0; i < a.size(); ++i) Av[i] = convert<T>(a[i]);
          for (std::size_t i = 0; i < b.size(); ++i) Bv[i] = convert<T>(b[i]);
          for (std::size_t i = 0; i < c0.size(); ++i) Cblas[i] = convert<T>(c0[i]);
          std::vector<T> Cref = Cblas;
          k::gemm<T>(host{}, ws, ta, tb, M, N, K, A(sc.alpha), Av.data(), lda, Bv.data(), ldb, A(sc.beta), Cblas.data(),
                     ldc);
          k::gemm_detail::reference_gemm<T>(ta, tb, M, N, K, A(sc.alpha), Av.data(), lda, Bv.data(), ldb, A(sc.beta),
                                            Cref.data(), ldc);
          double max_diff = 0, max_val = 0;
          bool padding_kept = true;
          for (std::int64_t i = 0; i < M; ++i) {
            for (std::int64_t j = 0; j < N; ++j) {
              double s = sc.beta == 0 ? 0 : std::fabs(sc.beta) * std::fabs(double(c0[sz(i * ldc + j)]));
              for (std::int64_t p = 0; p < K; ++p)
                s += std::fabs(sc.alpha) * std::fabs(double(ta ? a[sz(p * lda + i)] : a[sz(i * lda + p)]) *
                                                     double(tb ? b[sz(j * ldb + p)] : b[sz(p * ldb + j)]));
              const double r = convert<double>(Cref[sz(i * ldc + j)]), q = convert<double>(Cblas[sz(i * ldc + j)]);
              const double bound =
                  2 * u_out * std::max(std::fabs(r), std::fabs(q)) + 2 * double(K + 2) * u_acc * s + floor;
              const double diff = std::fabs(r - q);
              REQUIRE(std::isfinite(r));
              worst_bound_ratio = std::max(worst_bound_ratio, bound > 0 ? diff / bound : diff);
              max_diff = std::max(max_diff, diff);
              max_val = std::max(max_val, std::fabs(q));
              differing += diff != 0;
              ++total;
            }
            for (std::int64_t j = N; j < ldc; ++j)
              padding_kept =
                  padding_kept && std::memcmp(&Cref[sz(i * ldc + j)], &Cblas[sz(i * ldc + j)], sizeof(T)) == 0;
          }
          CHECK(padding_kept);
          const double tensor_rel = max_diff / max_val;
          worst_tensor_rel = std::max(worst_tensor_rel, tensor_rel);
          if (u_out == 0) {
            INFO("M = ", M, ", N = ", N, ", K = ", K, ", trans_a = ", ta, ", trans_b = ", tb, ", alpha = ", sc.alpha,
                 ", beta = ", sc.beta);
            CHECK(tensor_rel <= 8 * std::sqrt(double(K)) * u_acc);
          }
        }
  if (std::getenv("STRATA_TEST_VERBOSE"))
    std::printf(
        "  %s reference_gemm vs BLAS: worst |ref - blas| / bound %.3f, worst tensor-relative %.2e, "
        "%zu of %zu elements differ\n",
        strata::dtype_name<T>(), worst_bound_ratio, worst_tensor_rel, differing, total);
  CHECK(worst_bound_ratio <= 1.0);
}

TEST_CASE("the portable GEMM is bit-identical for 1, 2 or 3 threads; K = 0 and alpha = 0 scale C by beta") {
  const std::int64_t M = 130, N = 140, K = 300;
  const fvec a = randn(sz(M * K), 130), b = randn(sz(K * N), 131), c0 = randn(sz(M * N), 132);
  std::vector<fvec> results;
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    fvec c = c0;
    k::gemm_detail::reference_gemm<float>(false, true, M, N, K, 1.5f, a.data(), K, b.data(), K, 0.5f, c.data(), N);
    results.push_back(c);
  }
  omp_set_num_threads(saved);
  CHECK(bit_identical(results[0], results[1]));
  CHECK(bit_identical(results[0], results[2]));

  fvec c{1.0f, 2.0f, 3.0f, 4.0f}, nan_in(4, std::numeric_limits<float>::quiet_NaN());
  k::gemm_detail::reference_gemm<float>(false, false, 2, 2, 0, 1.0f, nan_in.data(), 1, nan_in.data(), 2, 0.5f, c.data(),
                                        2);
  CHECK(c == fvec{0.5f, 1.0f, 1.5f, 2.0f});
  // alpha = 0 reads neither A nor B (NaN there stays out), as BLAS; beta = 0 does not read C.
  k::gemm_detail::reference_gemm<float>(false, false, 2, 2, 2, 0.0f, nan_in.data(), 2, nan_in.data(), 2, 2.0f, c.data(),
                                        2);
  CHECK(c == fvec{1.0f, 2.0f, 3.0f, 4.0f});
  fvec c_nan = nan_in;
  k::gemm_detail::reference_gemm<float>(false, false, 2, 2, 0, 1.0f, nan_in.data(), 1, nan_in.data(), 2, 0.0f,
                                        c_nan.data(), 2);
  CHECK(c_nan == fvec{0.0f, 0.0f, 0.0f, 0.0f});
  // The same argument checks as the BLAS path.
  CHECK(error_message([&] {
          k::gemm_detail::reference_gemm<float>(false, false, 2, 2, 2, 1.0f, c.data(), 1, c.data(), 2, 0.0f, c.data(),
                                                2);
        }) == "gemm: lda = 1 is less than A's 2 columns");
}

// ---------------------------------------------------------------------------------------------
// Every op in bf16 and fp16 against fp32 on the same quantised inputs
// ---------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("linear in 16 bits is fp32 rounded once", T, bf16, fp16) {
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  const std::int64_t N = 24, C = 32, OC = 40;
  const fvec inp = quantized<T>(randn(sz(N * C), 120)), w = quantized<T>(randn(sz(OC * C), 121, 0.2)),
             bias = quantized<T>(randn(sz(OC), 122)), dout = quantized<T>(randn(sz(N * OC), 123));
  fvec out32(sz(N * OC)), dinp32(sz(N * C)), dw32(sz(OC * C)), db32(sz(OC));
  k::linear_forward(host{}, ws, out32.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  k::linear_backward(host{}, ws, dinp32.data(), dw32.data(), db32.data(), dout.data(), inp.data(), w.data(), N, C, OC);

  auto inp16 = narrow<T>(inp), w16 = narrow<T>(w), bias16 = narrow<T>(bias), dout16 = narrow<T>(dout);
  std::vector<T> out16(out32.size()), dinp16(dinp32.size()), dw16(dw32.size()), db16(db32.size());
  k::linear_forward(host{}, ws, out16.data(), inp16.data(), w16.data(), bias16.data(), N, C, OC);
  k::linear_backward(host{}, ws, dinp16.data(), dw16.data(), db16.data(), dout16.data(), inp16.data(), w16.data(), N, C,
                     OC);
  check_one_rounding("linear out", out16, out32);
  check_one_rounding("linear dinp", dinp16, dinp32);
  check_one_rounding("linear dweight", dw16, dw32);
  check_one_rounding("linear dbias", db16, db32);
}

TEST_CASE_TEMPLATE("layernorm in 16 bits is fp32 rounded once", T, bf16, fp16) {
  const std::int64_t N = 16, C = 48;
  const fvec inp = quantized<T>(randn(sz(N * C), 130, 2.0, 0.5)), w = quantized<T>(randn(sz(C), 131, 0.2, 1.0)),
             b = quantized<T>(randn(sz(C), 132, 0.1)), dout = quantized<T>(randn(sz(N * C), 133));
  fvec out32(inp.size()), mean32(sz(N)), rstd32(sz(N)), dinp32(inp.size()), dw32(w.size()), db32(b.size());
  k::layernorm_forward(host{}, out32.data(), mean32.data(), rstd32.data(), inp.data(), w.data(), b.data(), N, C, 1e-5f);
  k::layernorm_backward(host{}, dinp32.data(), dw32.data(), db32.data(), dout.data(), inp.data(), w.data(),
                        mean32.data(), rstd32.data(), N, C);

  auto inp16 = narrow<T>(inp), w16 = narrow<T>(w), b16 = narrow<T>(b), dout16 = narrow<T>(dout);
  std::vector<T> out16(inp.size()), dinp16(inp.size()), dw16(w.size()), db16(b.size());
  fvec mean16(sz(N)), rstd16(sz(N));
  k::layernorm_forward(host{}, out16.data(), mean16.data(), rstd16.data(), inp16.data(), w16.data(), b16.data(), N, C,
                       1e-5f);
  k::layernorm_backward(host{}, dinp16.data(), dw16.data(), db16.data(), dout16.data(), inp16.data(), w16.data(),
                        mean16.data(), rstd16.data(), N, C);
  CHECK(mean16 == mean32);  // statistics stay in fp32
  CHECK(rstd16 == rstd32);
  check_one_rounding("layernorm out", out16, out32);
  check_one_rounding("layernorm dinp", dinp16, dinp32);
  check_one_rounding("layernorm dweight", dw16, dw32);
  check_one_rounding("layernorm dbias", db16, db32);
}

TEST_CASE_TEMPLATE("gelu and residual in 16 bits are fp32 rounded once", T, bf16, fp16) {
  const std::int64_t n = 500;
  const fvec x = quantized<T>(randn(sz(n), 140, 3.0)), y = quantized<T>(randn(sz(n), 141)),
             dout = quantized<T>(randn(sz(n), 142));
  fvec gelu32(x.size()), dgelu32(x.size()), sum32(x.size()), da32(x.size()), db32(x.size());
  k::gelu_forward(host{}, gelu32.data(), x.data(), n);
  k::gelu_backward(host{}, dgelu32.data(), x.data(), dout.data(), n);
  k::residual_forward(host{}, sum32.data(), x.data(), y.data(), n);
  k::residual_backward(host{}, da32.data(), db32.data(), dout.data(), n);

  auto x16 = narrow<T>(x), y16 = narrow<T>(y), dout16 = narrow<T>(dout);
  std::vector<T> gelu16(x.size()), dgelu16(x.size()), sum16(x.size()), da16(x.size()), db16(x.size());
  k::gelu_forward(host{}, gelu16.data(), x16.data(), n);
  k::gelu_backward(host{}, dgelu16.data(), x16.data(), dout16.data(), n);
  k::residual_forward(host{}, sum16.data(), x16.data(), y16.data(), n);
  k::residual_backward(host{}, da16.data(), db16.data(), dout16.data(), n);
  check_one_rounding("gelu out", gelu16, gelu32);
  check_one_rounding("gelu dinp", dgelu16, dgelu32);
  check_one_rounding("residual out", sum16, sum32);
  check_one_rounding("residual da", da16, da32);
  check_one_rounding("residual db", db16, db32);
}

TEST_CASE_TEMPLATE("attention in 16 bits is fp32 rounded once", T, bf16, fp16) {
  const std::int64_t B = 2, T_ = 9, C = 16, NH = 4;
  const fvec qkv = quantized<T>(randn(sz(B * T_ * 3 * C), 150)), dout = quantized<T>(randn(sz(B * T_ * C), 151));
  fvec out32(dout.size()), att32(sz(B * NH * T_ * T_)), dqkv32(qkv.size());
  k::attention_forward(host{}, out32.data(), att32.data(), qkv.data(), B, T_, C, NH);
  k::attention_backward(host{}, dqkv32.data(), dout.data(), qkv.data(), att32.data(), B, T_, C, NH);

  auto qkv16 = narrow<T>(qkv), dout16 = narrow<T>(dout);
  std::vector<T> out16(out32.size()), dqkv16(qkv.size());
  fvec att16(att32.size());
  k::attention_forward(host{}, out16.data(), att16.data(), qkv16.data(), B, T_, C, NH);
  k::attention_backward(host{}, dqkv16.data(), dout16.data(), qkv16.data(), att16.data(), B, T_, C, NH);
  CHECK(att16 == att32);  // probabilities stay in fp32
  check_one_rounding("attention out", out16, out32);
  check_one_rounding("attention dqkv", dqkv16, dqkv32);
}

TEST_CASE_TEMPLATE("embedding in 16 bits is fp32 rounded once, even for repeated tokens", T, bf16, fp16) {
  const std::int64_t B = 3, T_ = 8, C = 20, V = 6;
  std::vector<std::int32_t> tokens(sz(B * T_));
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = std::int32_t((i * 7 + i / 5) % V);
  const fvec wte = quantized<T>(randn(sz(V * C), 160)), wpe = quantized<T>(randn(sz(T_ * C), 161)),
             dout = quantized<T>(randn(sz(B * T_ * C), 162));
  fvec out32(dout.size()), dwte32(wte.size()), dwpe32(wpe.size());
  k::embedding_forward(host{}, out32.data(), tokens.data(), wte.data(), wpe.data(), B, T_, C, V);
  k::embedding_backward(host{}, dwte32.data(), dwpe32.data(), dout.data(), tokens.data(), B, T_, C);

  auto wte16 = narrow<T>(wte), wpe16 = narrow<T>(wpe), dout16 = narrow<T>(dout);
  std::vector<T> out16(out32.size()), dwte16(wte.size()), dwpe16(wpe.size());
  k::embedding_forward(host{}, out16.data(), tokens.data(), wte16.data(), wpe16.data(), B, T_, C, V);
  k::embedding_backward(host{}, dwte16.data(), dwpe16.data(), dout16.data(), tokens.data(), B, T_, C);
  check_one_rounding("embedding out", out16, out32);
  check_one_rounding("embedding dwte", dwte16, dwte32);
  check_one_rounding("embedding dwpe", dwpe16, dwpe32);
}

TEST_CASE_TEMPLATE("cross-entropy in 16 bits: fp32 losses, dlogits rounded once", T, bf16, fp16) {
  const std::int64_t N = 12, V = 50, Vp = 64;
  std::vector<std::int32_t> targets(sz(N));
  for (std::int64_t i = 0; i < N; ++i) targets[sz(i)] = std::int32_t((i * 13) % V);
  const fvec logits = quantized<T>(randn(sz(N * Vp), 170, 3.0));
  fvec losses32(sz(N)), dlogits32 = logits;
  k::cross_entropy_forward_backward(host{}, losses32.data(), dlogits32.data(), targets.data(), N, V, Vp, 1.0f / N);

  std::vector<T> dlogits16 = narrow<T>(logits);
  fvec losses16(sz(N)), forward16(sz(N));
  k::cross_entropy_forward(host{}, forward16.data(), dlogits16.data(), targets.data(), N, V, Vp);
  k::cross_entropy_forward_backward(host{}, losses16.data(), dlogits16.data(), targets.data(), N, V, Vp, 1.0f / N);
  CHECK(losses16 == losses32);
  CHECK(forward16 == losses32);
  check_one_rounding("cross_entropy dlogits", dlogits16, dlogits32);
}

// ---------------------------------------------------------------------------------------------
// AdamW
// ---------------------------------------------------------------------------------------------

namespace {
// AdamW as the paper and PyTorch's docs write it, in double, for comparison.
struct reference_adamw {
  double p, m = 0, v = 0;
  void step(double g, const k::adamw_hyper& h, int t) {
    p *= 1 - h.lr * h.weight_decay;
    m = h.beta1 * m + (1 - h.beta1) * g;
    v = h.beta2 * v + (1 - h.beta2) * g * g;
    const double m_hat = m / (1 - std::pow(h.beta1, t)), v_hat = v / (1 - std::pow(h.beta2, t));
    p -= h.lr * m_hat / (std::sqrt(v_hat) + h.eps);
  }
};
}  // namespace

TEST_CASE("adamw matches a hand computation over several steps (double master)") {
  // beta1 = 0.3 takes torch.lerp's other formula (weight 1 - beta1 >= 0.5).
  for (double beta1 : {0.9, 0.3}) {
    INFO("beta1 = ", beta1);
    const k::adamw_hyper hyper{.lr = 1e-2, .beta1 = beta1, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    const std::int64_t n = 6;
    const double grad_scale = 0.5;
    std::vector<double> p{0.5, -1.0, 2.0, 0.0, 1e-3, -3.0}, m(n), v(n);
    std::vector<reference_adamw> ref;
    for (double x : p) ref.push_back({x});
    for (int step = 1; step <= 5; ++step) {
      std::vector<double> g(n);
      for (std::int64_t i = 0; i < n; ++i) g[sz(i)] = std::sin(double(3 * i + step)) * (i == 3 ? 0.0 : 1.0);
      k::adamw_update(host{}, p.data(), p.data(), g.data(), m.data(), v.data(), n, hyper, step, grad_scale);
      for (std::int64_t i = 0; i < n; ++i) ref[sz(i)].step(g[sz(i)] * grad_scale, hyper, step);
      for (std::int64_t i = 0; i < n; ++i) {
        CHECK(p[sz(i)] == doctest::Approx(ref[sz(i)].p).epsilon(1e-13));
        CHECK(m[sz(i)] == doctest::Approx(ref[sz(i)].m).epsilon(1e-13));
        CHECK(v[sz(i)] == doctest::Approx(ref[sz(i)].v).epsilon(1e-13));
      }
    }
    // Element 3 never had a gradient: only weight decay moved it, and 0 stays 0.
    CHECK(p[3] == 0.0);
  }
}

TEST_CASE("adamw first step moves each weight by lr * sign(g) after decay") {
  const k::adamw_hyper hyper{.lr = 1e-3, .weight_decay = 0.1};
  std::vector<double> p{1.0, -2.0}, g{0.3, -5.0}, m(2), v(2);
  k::adamw_update(host{}, p.data(), p.data(), g.data(), m.data(), v.data(), 2, hyper, 1, 1.0);
  // Step 1: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps).
  CHECK(p[0] == doctest::Approx(1.0 * (1 - 1e-4) - 1e-3 * 0.3 / (0.3 + 1e-8)).epsilon(1e-15));
  CHECK(p[1] == doctest::Approx(-2.0 * (1 - 1e-4) + 1e-3 * 5.0 / (5.0 + 1e-8)).epsilon(1e-15));
}

TEST_CASE_TEMPLATE("adamw with fp32 master and 16-bit weights", T, bf16, fp16) {
  const k::adamw_hyper hyper{.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.05};
  const std::int64_t n = 100;
  fvec master = randn(sz(n), 180), m(sz(n)), v(sz(n));
  std::vector<reference_adamw> ref;
  for (float x : master) ref.push_back({double(x)});
  std::vector<T> weights(sz(n));
  for (int step = 1; step <= 4; ++step) {
    const std::vector<T> grad = narrow<T>(randn(sz(n), 181 + std::uint64_t(step)));
    k::adamw_update(host{}, master.data(), weights.data(), grad.data(), m.data(), v.data(), n, hyper, step, 2.0);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto ii = sz(i);
      ref[ii].step(2.0 * convert<double>(grad[ii]), hyper, step);
      CHECK(master[ii] == doctest::Approx(ref[ii].p).epsilon(1e-5));
      CHECK(weights[ii].bits == convert<T>(master[ii]).bits);  // weights are the master rounded
    }
  }
}

TEST_CASE_TEMPLATE("adamw driven by a step_state: the step-count form bit for bit, nothing when not applied", T, float,
                   bf16) {
  // The trainer's form: advance_step decides and the update reads t, the bias corrections and
  // the multiplier from the state. Over 3 applied steps and one skipped, it equals the form with
  // the step count and grad_scale given (clip / scale) bit for bit.
  const k::adamw_hyper hyper{.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.05};
  const std::int64_t n = 100;
  fvec master_a = randn(sz(n), 190), m_a(sz(n)), v_a(sz(n));
  fvec master_b = master_a, m_b = m_a, v_b = v_a;
  std::vector<T> w_a(sz(n)), w_b(sz(n));
  strata::step_rules rules;
  rules.dynamic = true;
  rules.max_norm = 0.5;
  rules.beta1 = hyper.beta1;
  rules.beta2 = hyper.beta2;
  strata::step_state state;
  state.scale = 8.0;
  int applied = 0;
  for (int s = 0; s < 4; ++s) {
    const std::vector<T> grad = narrow<T>(randn(sz(n), 191 + std::uint64_t(s)));
    const double sumsq = s == 2 ? INFINITY : k::sum_of_squares(host{}, grad.data(), n);
    k::sum_of_squares_into(host{}, grad.data(), n, &state.sumsq);
    if (s == 2) state.sumsq = sumsq;  // an overflowed step
    const double used = state.scale;
    k::advance_step(host{}, &state, rules);
    k::adamw_update(host{}, master_a.data(), w_a.data(), grad.data(), m_a.data(), v_a.data(), n, hyper, &state);
    if (s == 2) {
      CHECK(state.apply == 0);
      CHECK(state.scale == used / 2);
      CHECK(master_a == master_b);  // skipped: nothing moved
      continue;
    }
    ++applied;
    CHECK(state.step == applied);
    const double norm = std::sqrt(sumsq) / used;
    k::adamw_update(host{}, master_b.data(), w_b.data(), grad.data(), m_b.data(), v_b.data(), n, hyper, applied,
                    strata::clip_coefficient(norm, rules.max_norm) / used);
    CHECK(master_a == master_b);
    CHECK(m_a == m_b);
    CHECK(v_a == v_b);
    for (std::int64_t i = 0; i < n; ++i) CHECK(convert<float>(w_a[sz(i)]) == convert<float>(w_b[sz(i)]));
  }
  CHECK(applied == 3);
}

// ---------------------------------------------------------------------------------------------
// reduce.hpp
// ---------------------------------------------------------------------------------------------

TEST_CASE("sum_of_squares, all_finite, scale_in_place, convert_array") {
  const std::int64_t n = 50000;  // several chunks
  const fvec x = randn(sz(n), 190);
  long double expected = 0;
  for (float e : x) expected += (long double)e * e;
  CHECK(k::sum_of_squares(host{}, x.data(), n) == doctest::Approx(double(expected)).epsilon(1e-13));
  CHECK(k::sum_of_squares(host{}, x.data(), 0) == 0.0);
  // The in-place form the trainer uses: written, accumulated with a weight, or zeroed by n = 0.
  double into = 123.0;
  k::sum_of_squares_into(host{}, x.data(), n, &into);
  CHECK(into == k::sum_of_squares(host{}, x.data(), n));
  k::sum_of_squares_into(host{}, x.data(), 100, &into, true, 0.5);
  CHECK(into == k::sum_of_squares(host{}, x.data(), n) + 0.5 * k::sum_of_squares(host{}, x.data(), 100));
  k::sum_of_squares_into(host{}, static_cast<const float*>(nullptr), 0, &into);
  CHECK(into == 0.0);

  auto xb = narrow<bf16>(x);
  auto xh = narrow<fp16>(x);
  CHECK(k::all_finite(host{}, x.data(), n));
  CHECK(k::all_finite(host{}, xb.data(), n));
  CHECK(k::all_finite(host{}, xh.data(), n));
  fvec bad = x;
  bad[4321] = NAN;
  CHECK_FALSE(k::all_finite(host{}, bad.data(), n));
  xb[n - 1] = bf16(INFINITY);
  CHECK_FALSE(k::all_finite(host{}, xb.data(), n));
  xh[0] = fp16(70000.0f);  // overflows to inf
  CHECK_FALSE(k::all_finite(host{}, xh.data(), n));

  fvec y = x;
  k::scale_in_place(host{}, y.data(), n, 0.25);
  for (std::int64_t i = 0; i < n; i += 997) CHECK(y[sz(i)] == x[sz(i)] * 0.25f);

  std::vector<fp16> h(sz(n));
  fvec back(sz(n));
  k::convert_array(host{}, h.data(), x.data(), n);
  k::convert_array(host{}, back.data(), h.data(), n);
  for (std::int64_t i = 0; i < n; i += 997) {
    CHECK(h[sz(i)].bits == fp16(x[sz(i)]).bits);
    CHECK(back[sz(i)] == float(h[sz(i)]));
  }
}

// ---------------------------------------------------------------------------------------------
// Determinism
// ---------------------------------------------------------------------------------------------

namespace {
// Everything the non-GEMM kernels produce, at sizes large enough to take their parallel paths.
struct all_outputs {
  fvec ln_out, ln_dinp, ln_dw, ln_db, gelu_d, att_out, att_dqkv, emb_dwte, emb_dwpe, ce_losses, ce_dlogits,
      linear_dbias;
  double sumsq = 0;
  bool operator==(const all_outputs&) const = default;
};

all_outputs run_all_kernels() {
  all_outputs r;
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  {
    const std::int64_t N = 96, C = 384;
    const fvec x = randn(sz(N * C), 200), w = randn(sz(C), 201), b = randn(sz(C), 202), dy = randn(sz(N * C), 203);
    fvec mean(sz(N)), rstd(sz(N));
    r.ln_out.resize(x.size()), r.ln_dinp.resize(x.size()), r.ln_dw.resize(w.size()), r.ln_db.resize(b.size());
    k::layernorm_forward(host{}, r.ln_out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
    k::layernorm_backward(host{}, r.ln_dinp.data(), r.ln_dw.data(), r.ln_db.data(), dy.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
    r.gelu_d.resize(x.size());
    k::gelu_backward(host{}, r.gelu_d.data(), x.data(), dy.data(), N * C);
    r.sumsq = k::sum_of_squares(host{}, x.data(), N * C);
  }
  {
    const std::int64_t B = 2, T = 64, C = 128, NH = 4;
    const fvec qkv = randn(sz(B * T * 3 * C), 210), dy = randn(sz(B * T * C), 211);
    fvec att(sz(B * NH * T * T));
    r.att_out.resize(dy.size()), r.att_dqkv.resize(qkv.size());
    k::attention_forward(host{}, r.att_out.data(), att.data(), qkv.data(), B, T, C, NH);
    k::attention_backward(host{}, r.att_dqkv.data(), dy.data(), qkv.data(), att.data(), B, T, C, NH);
  }
  {
    const std::int64_t B = 4, T = 64, C = 256, V = 50;
    std::vector<std::int32_t> tokens(sz(B * T));
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = std::int32_t((i * i + 3 * i) % V);
    const fvec dy = randn(sz(B * T * C), 220);
    r.emb_dwte.resize(sz(V * C)), r.emb_dwpe.resize(sz(T * C));
    k::embedding_backward(host{}, r.emb_dwte.data(), r.emb_dwpe.data(), dy.data(), tokens.data(), B, T, C);
  }
  {
    const std::int64_t N = 128, V = 500, Vp = 512;
    std::vector<std::int32_t> targets(sz(N));
    for (std::int64_t i = 0; i < N; ++i) targets[sz(i)] = std::int32_t((i * 37) % V);
    r.ce_dlogits = randn(sz(N * Vp), 230, 2.0);
    r.ce_losses.resize(sz(N));
    k::cross_entropy_forward_backward(host{}, r.ce_losses.data(), r.ce_dlogits.data(), targets.data(), N, V, Vp,
                                      1.0f / N);
  }
  {
    const std::int64_t N = 256, C = 64, OC = 320;
    const fvec x = randn(sz(N * C), 240), w = randn(sz(OC * C), 241), dy = randn(sz(N * OC), 242);
    fvec dw(w.size());
    r.linear_dbias.resize(sz(OC));
    k::linear_backward<float>(host{}, ws, nullptr, dw.data(), r.linear_dbias.data(), dy.data(), x.data(), w.data(), N,
                              C, OC);
  }
  return r;
}
}  // namespace

TEST_CASE("kernels are bit-identical run to run and for 1, 2 or 3 threads") {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  const all_outputs first = run_all_kernels();
  const all_outputs second = run_all_kernels();
  CHECK(first == second);  // float == is exact (and no output here is NaN)
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    INFO("threads = ", threads);
    CHECK(run_all_kernels() == first);
  }
  omp_set_num_threads(saved);
}

TEST_CASE("linear (OpenBLAS) is bit-identical run to run") {
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  const std::int64_t N = 128, C = 96, OC = 160;
  const auto x = narrow<bf16>(randn(sz(N * C), 250)), w = narrow<bf16>(randn(sz(OC * C), 251)),
             b = narrow<bf16>(randn(sz(OC), 252)), dy = narrow<bf16>(randn(sz(N * OC), 253));
  auto run = [&] {
    std::vector<bf16> out(sz(N * OC)), dx(x.size()), dw(w.size()), db(b.size());
    k::linear_forward(host{}, ws, out.data(), x.data(), w.data(), b.data(), N, C, OC);
    k::linear_backward(host{}, ws, dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC);
    return std::vector<std::vector<bf16>>{out, dx, dw, db};
  };
  const auto first = run(), second = run();
  for (std::size_t i = 0; i < first.size(); ++i) CHECK(bit_identical(first[i], second[i]));
}

// ---------------------------------------------------------------------------------------------
// Errors name the culprit
// ---------------------------------------------------------------------------------------------

TEST_CASE("bad token ids and targets throw strata::error naming the value and position") {
  const std::int64_t B = 2, T = 10, C = 4, V = 256;
  std::vector<std::int32_t> tokens(sz(B * T), 5);
  tokens[17] = 300;
  fvec wte(sz(V * C)), wpe(sz(T * C)), out(sz(B * T * C)), dwte(wte.size()), dwpe(wpe.size());
  CHECK(error_message([&] {
          k::embedding_forward(host{}, out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, V);
        }) == "embedding: token id 300 at position 17 is out of range for vocab 256");
  tokens[17] = 5;
  tokens[3] = -2;
  CHECK(error_message([&] {
          k::embedding_forward(host{}, out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, V);
        }) == "embedding: token id -2 at position 3 is out of range for vocab 256");
  CHECK(error_message([&] {
          k::embedding_backward(host{}, dwte.data(), dwpe.data(), out.data(), tokens.data(), B, T, C);
        }) == "embedding: token id -2 at position 3 is negative");
  for (float g : dwte) REQUIRE(g == 0.0f);  // nothing was written before the check

  const std::int64_t N = 4, Vce = 11, Vp = 12;
  std::vector<std::int32_t> targets{1, 2, 11, 3};
  fvec logits(sz(N * Vp), 0.5f), losses(sz(N));
  const fvec logits_before = logits;
  const std::string expected = "cross_entropy: target 11 at position 2 is out of range for vocab 11";
  CHECK(error_message([&] {
          k::cross_entropy_forward_backward(host{}, losses.data(), logits.data(), targets.data(), N, Vce, Vp, 0.25f);
        }) == expected);
  CHECK(logits == logits_before);  // validated before anything was overwritten
  CHECK(error_message([&] {
          k::cross_entropy_forward(host{}, losses.data(), logits.data(), targets.data(), N, Vce, Vp);
        }) == expected);
}

TEST_CASE("empty sizes are no-ops; gemm with K = 0 scales C by beta") {
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  fvec c{1.0f, 2.0f, 3.0f, 4.0f}, unused(1);
  k::gemm<float>(host{}, ws, false, false, 2, 2, 0, 1.0f, unused.data(), 1, unused.data(), 2, 0.5f, c.data(), 2);
  CHECK(c == fvec{0.5f, 1.0f, 1.5f, 2.0f});
  std::vector<bf16> cb = narrow<bf16>(c), ub(1);
  k::gemm<bf16>(host{}, ws, true, true, 2, 2, 0, 1.0f, ub.data(), 2, ub.data(), 1, 2.0f, cb.data(), 2);
  CHECK(widen(cb) == fvec{1.0f, 2.0f, 3.0f, 4.0f});

  std::vector<std::int32_t> no_tokens(1, 0);
  fvec buf(64);
  k::linear_forward<float>(host{}, ws, buf.data(), buf.data(), buf.data(), nullptr, 0, 4, 4);
  k::layernorm_forward<float>(host{}, buf.data(), nullptr, nullptr, buf.data(), buf.data(), buf.data(), 0, 4, 1e-5f);
  k::attention_forward(host{}, buf.data(), buf.data(), buf.data(), 0, 0, 8, 2);
  k::attention_backward(host{}, buf.data(), buf.data(), buf.data(), buf.data(), 1, 0, 8, 2);
  k::embedding_forward(host{}, buf.data(), no_tokens.data(), buf.data(), buf.data(), 1, 0, 4, 3);
  k::embedding_backward(host{}, buf.data(), buf.data(), buf.data(), no_tokens.data(), 0, 4, 4);
  k::cross_entropy_forward(host{}, buf.data(), buf.data(), no_tokens.data(), 0, 5, 5);
  CHECK(k::sum_of_squares(host{}, buf.data(), 0) == 0.0);
  CHECK(k::all_finite(host{}, buf.data(), 0));
}

TEST_CASE("residual_forward in place (out aliasing a) is a += b") {
  fvec a{1, 2, 3}, b{10, 20, 30};
  k::residual_forward(host{}, a.data(), a.data(), b.data(), 3);
  CHECK(a == fvec{11, 22, 33});
  fvec db{1, 1, 1};
  k::residual_backward(host{}, nullptr, db.data(), b.data(), 3);  // a null gradient is skipped
  CHECK(db == fvec{10, 20, 30});                                  // written, not added to
}

TEST_CASE("bad shapes throw strata::error naming the numbers") {
  fvec buf(1024);
  CHECK(error_message([&] { k::attention_forward(host{}, buf.data(), buf.data(), buf.data(), 1, 2, 10, 3); }) ==
        "attention_forward: heads = 3 does not divide channels C = 10");
  std::vector<std::int32_t> targets{0};
  CHECK(error_message([&] { k::cross_entropy_forward(host{}, buf.data(), buf.data(), targets.data(), 1, 8, 6); }) ==
        "cross_entropy_forward: padded row length Vp = 6 is less than the vocab V = 8");
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  CHECK(error_message([&] {
          k::gemm<float>(host{}, ws, false, false, 4, 4, 4, 1.0f, buf.data(), 3, buf.data(), 4, 0.0f, buf.data(), 4);
        }) == "gemm: lda = 3 is less than A's 4 columns");
}

// --- Attention across several 64-key blocks (the host kernel's block size) -----------------
namespace {
using strata::acc_t;

// float64 causal attention written out: out, lse and the += of dqkv, from the same inputs.
struct attention_reference {
  std::vector<double> out, lse, dqkv;
};
template <class T>
attention_reference attention_naive(const std::vector<T>& qkv_t, const std::vector<T>& dout_t,
                                    const k::attention_shape& s) {
  const std::int64_t B = s.batch, T_ = s.seq, H = s.heads, d = s.head_dim, G = s.group(), W = s.row_width();
  const double scale = s.softmax_scale();
  std::vector<double> qkv(qkv_t.size()), dout(dout_t.size());
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = convert<double>(qkv_t[i]);
  for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = convert<double>(dout_t[i]);
  attention_reference r{std::vector<double>(sz(B * T_ * H * d)), std::vector<double>(sz(B * H * T_)),
                        std::vector<double>(qkv.size())};
  std::vector<double> p(sz(T_)), dp(sz(T_));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < T_; ++t) {
        const auto q = [&](std::int64_t tt) { return &qkv[sz((b * T_ + tt) * W + h * d)]; };
        const auto key = [&](std::int64_t tt) { return &qkv[sz((b * T_ + tt) * W + s.q_width() + (h / G) * d)]; };
        const auto val = [&](std::int64_t tt) {
          return &qkv[sz((b * T_ + tt) * W + s.q_width() + s.kv_width() + (h / G) * d)];
        };
        double mx = -INFINITY, sum = 0;
        for (std::int64_t t2 = 0; t2 <= t; ++t2) {
          double x = 0;
          for (std::int64_t i = 0; i < d; ++i) x += q(t)[i] * key(t2)[i];
          p[sz(t2)] = x * scale, mx = std::max(mx, p[sz(t2)]);
        }
        for (std::int64_t t2 = 0; t2 <= t; ++t2) sum += std::exp(p[sz(t2)] - mx);
        for (std::int64_t t2 = 0; t2 <= t; ++t2) p[sz(t2)] = std::exp(p[sz(t2)] - mx) / sum;
        r.lse[sz((b * H + h) * T_ + t)] = mx + std::log(sum);
        double* o = &r.out[sz((b * T_ + t) * H * d + h * d)];
        for (std::int64_t t2 = 0; t2 <= t; ++t2)
          for (std::int64_t i = 0; i < d; ++i) o[i] += p[sz(t2)] * val(t2)[i];
        const double* dy = &dout[sz((b * T_ + t) * H * d + h * d)];
        double D = 0;
        for (std::int64_t i = 0; i < d; ++i) D += dy[i] * o[i];
        const auto grad = [&](const double* at) { return &r.dqkv[sz(at - qkv.data())]; };
        for (std::int64_t t2 = 0; t2 <= t; ++t2) {
          double x = 0;
          for (std::int64_t i = 0; i < d; ++i) x += dy[i] * val(t2)[i];
          const double ds = p[sz(t2)] * (x - D) * scale;
          for (std::int64_t i = 0; i < d; ++i) {
            grad(q(t))[i] += ds * key(t2)[i];
            grad(key(t2))[i] += ds * q(t)[i];
            grad(val(t2))[i] += p[sz(t2)] * dy[i];
          }
        }
      }
  return r;
}

// max |got - want| / max |want|
template <class T>
double relative_error(const std::vector<T>& got, const std::vector<double>& want) {
  double err = 0, top = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    err = std::max(err, std::abs(convert<double>(got[i]) - want[i])), top = std::max(top, std::abs(want[i]));
  return err / top;
}

// Shapes that cross 64-key blocks at ragged ends: multi-head with a head size of no whole vector,
// grouped-query and multi-query.
const k::attention_shape attention_block_shapes[] = {
    {.batch = 2, .seq = 150, .heads = 3, .kv_heads = 3, .head_dim = 40},
    {.batch = 2, .seq = 130, .heads = 8, .kv_heads = 2, .head_dim = 24},
    {.batch = 1, .seq = 100, .heads = 4, .kv_heads = 1, .head_dim = 16},
};

template <class T>
struct attention_run {
  std::vector<T> out, dqkv, dqkv_no_out;
  std::vector<acc_t<T>> lse;
  bool operator==(const attention_run&) const = default;
};
template <class T>
attention_run<T> run_attention(const std::vector<T>& qkv, const std::vector<T>& dout, const k::attention_shape& s) {
  // dqkv starts as NaN: attention_backward writes every element and reads none.
  const T nan = convert<T>(std::numeric_limits<float>::quiet_NaN());
  attention_run<T> r{std::vector<T>(dout.size()),
                     std::vector<T>(qkv.size(), nan),
                     {},
                     std::vector<acc_t<T>>(sz(s.batch * s.heads * s.seq))};
  k::attention_forward(host{}, r.out.data(), r.lse.data(), qkv.data(), s);
  k::attention_backward(host{}, r.dqkv.data(), dout.data(), qkv.data(), r.lse.data(), r.out.data(), s);
  if (s.heads == s.kv_heads) {  // the multi-head overload without out redoes the forward
    r.dqkv_no_out.assign(qkv.size(), nan);
    const std::int64_t C = s.heads * s.head_dim;
    k::attention_backward(host{}, r.dqkv_no_out.data(), dout.data(), qkv.data(), r.lse.data(), s.batch, s.seq, C,
                          s.heads);
  }
  return r;
}
}  // namespace

TEST_CASE_TEMPLATE("attention over several key blocks matches a float64 reference", T, float, double) {
  const double tol = std::is_same_v<T, float> ? 5e-6 : 1e-13;
  for (const auto& s : attention_block_shapes) {
    INFO("seq = ", s.seq, ", heads = ", s.heads, ", kv_heads = ", s.kv_heads, ", head_dim = ", s.head_dim);
    const auto qkv = narrow<T>(randn(sz(s.batch * s.seq * s.row_width()), 300, 1.5)),
               dout = narrow<T>(randn(sz(s.batch * s.seq * s.q_width()), 301));
    const attention_run<T> got = run_attention(qkv, dout, s);
    const attention_reference want = attention_naive(qkv, dout, s);
    CHECK(relative_error(got.out, want.out) < tol);
    CHECK(relative_error(got.lse, want.lse) < tol);
    CHECK(relative_error(got.dqkv, want.dqkv) < tol);
    if (!got.dqkv_no_out.empty()) CHECK(relative_error(got.dqkv_no_out, want.dqkv) < tol);
  }
}

TEST_CASE_TEMPLATE("attention is bit-identical for 1, 2 or 3 threads", T, float, double, bf16) {
  const int saved = omp_get_max_threads();
  for (const auto& s : attention_block_shapes) {
    INFO("seq = ", s.seq, ", heads = ", s.heads, ", kv_heads = ", s.kv_heads, ", head_dim = ", s.head_dim);
    const auto qkv = narrow<T>(randn(sz(s.batch * s.seq * s.row_width()), 310, 1.5)),
               dout = narrow<T>(randn(sz(s.batch * s.seq * s.q_width()), 311));
    omp_set_num_threads(1);
    const attention_run<T> one = run_attention(qkv, dout, s);
    for (int threads : {2, 3}) {
      INFO("threads = ", threads);
      omp_set_num_threads(threads);
      const attention_run<T> many = run_attention(qkv, dout, s);
      CHECK(std::memcmp(many.out.data(), one.out.data(), one.out.size() * sizeof(T)) == 0);
      CHECK(std::memcmp(many.lse.data(), one.lse.data(), one.lse.size() * sizeof(acc_t<T>)) == 0);
      CHECK(std::memcmp(many.dqkv.data(), one.dqkv.data(), one.dqkv.size() * sizeof(T)) == 0);
      CHECK(std::memcmp(many.dqkv_no_out.data(), one.dqkv_no_out.data(), one.dqkv_no_out.size() * sizeof(T)) == 0);
    }
  }
  omp_set_num_threads(saved);
}

TEST_CASE_TEMPLATE("cached attention gives the full forward's rows bit for bit across key blocks", T, float, bf16) {
  // A prefill that ends inside the second block, then one position at a time past the third.
  for (const auto& full : attention_block_shapes) {
    INFO("seq = ", full.seq, ", heads = ", full.heads, ", kv_heads = ", full.kv_heads);
    const std::int64_t B = full.batch, T_ = full.seq, W = full.row_width(), Q = full.q_width(), prefill = 70;
    const auto qkv = narrow<T>(randn(sz(B * T_ * W), 320, 1.5));
    std::vector<T> ref(sz(B * T_ * Q));
    std::vector<acc_t<T>> lse(sz(B * full.heads * T_));
    k::attention_forward(host{}, ref.data(), lse.data(), qkv.data(), full);
    std::vector<T> k_cache(sz(B * T_ * full.kv_width())), v_cache(k_cache.size());
    bool same = true;
    for (std::int64_t pos = 0; pos < T_;) {
      k::attention_shape step = full;
      step.seq = pos == 0 ? prefill : 1;
      std::vector<T> in(sz(B * step.seq * W)), out(sz(B * step.seq * Q));
      for (std::int64_t b = 0; b < B; ++b)
        std::copy_n(qkv.begin() + (b * T_ + pos) * W, step.seq * W, in.begin() + b * step.seq * W);
      k::cached_attention_forward(host{}, out.data(), k_cache.data(), v_cache.data(), in.data(), step, pos, T_);
      for (std::int64_t b = 0; b < B; ++b)
        same = same && std::memcmp(out.data() + b * step.seq * Q, ref.data() + (b * T_ + pos) * Q,
                                   sz(step.seq * Q) * sizeof(T)) == 0;
      pos += step.seq;
    }
    CHECK(same);
  }
}

// exp_fast (kernels/host/vector_math.hpp), the exp the float kernels vectorise: within 2 ulp of
// the exact value over float's whole range, and the edge values a softmax or sigmoid meets.
TEST_CASE("exp_fast is within 2 ulp of exp over float's range") {
  double worst = 0;
  float worst_x = 0;
  for (float x = -87.3f; x < 88.7f; x += 1e-3f + 1e-4f * std::fabs(x)) {
    const double exact = std::exp(double(x));
    const float rounded = float(exact);
    const double ulp = double(std::nextafter(rounded, INFINITY)) - double(rounded);
    const double err = std::fabs(double(k::exp_fast(x)) - exact) / ulp;
    if (err > worst) worst = err, worst_x = x;
  }
  INFO("worst ", worst, " ulp at x = ", worst_x);
  CHECK(worst <= 2.0);
  CHECK(k::exp_fast(-INFINITY) == 0.0f);
  CHECK(k::exp_fast(-100.0f) == 0.0f);  // would be subnormal: flushed
  CHECK(k::exp_fast(0.0f) == 1.0f);
  CHECK(std::isinf(k::exp_fast(INFINITY)));
  CHECK(std::isinf(k::exp_fast(89.0f)));
  CHECK(std::isfinite(k::exp_fast(88.72f)));
  CHECK(std::isnan(k::exp_fast(NAN)));
  CHECK(k::exp_fast(1.5) == std::exp(1.5));  // double: the library's exp itself
}
