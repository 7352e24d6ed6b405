// tests/cuda/gpu_tests.cu - every strata CUDA kernel against its host reference, on a GPU.
//
//   strata_cuda_gpu_tests [--bench] [--tsv FILE]
//
// Correctness: each kernel's output against kernels/host (the same op on the CPU, same inputs),
// as ||out - ref|| / ||ref||: fp32 within 1e-5, bf16/fp16 within 1e-2; NaN never passes. Outputs
// that accumulate (+=: parameter gradients, positioned attention's dq and dkv) start from random
// values on both sides (positioned attention's are compared by what the kernels added); input
// gradients, which every backward kernel writes without reading, start from NaN on the device,
// so a kernel that reads one fails its check. Determinism: the reductions (attention backward,
// multi-head and grouped-query, positioned attention backward, LayerNorm and RMSNorm backward,
// embedding backward, sum of squares) run twice and must agree bit for bit. Linear layers are
// checked against a naive double-precision GEMM compiled in here, so this program needs nothing
// but the CUDA toolkit (no BLAS, no doctest).
//
// --bench adds, at GPT-2 124M shapes (B = 16, T = 1024, bf16), each kernel's time as GB/s or
// TFLOP/s against two measured ceilings: a 1 GiB device-to-device copy and an 8192^3 bf16
// cuBLASLt GEMM. --tsv writes the rows for scripts/gpu-check. Exit status 0 when every check
// passes, 1 otherwise, 2 when there is no GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gpu_harness.cuh"
#include "strata/kernels/all.hpp"           // each op's host reference and CUDA kernel, and the runtime
#include "strata/layers/context_split.hpp"  // the positions of context parallelism's ranks

using namespace strata_gpu_test;
namespace st = strata;
namespace k = strata::kernels;
using st::bf16;
using st::fp16;

namespace {

const st::host H{};
const st::cuda D{};
std::vector<result_row> rows;

template <class T>
double tol_for() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-2;
}

std::string shape_str(std::initializer_list<std::int64_t> dims) {
  std::string s;
  for (auto d : dims) {
    if (!s.empty()) s += 'x';
    s += std::to_string(d);
  }
  return s;
}

void check(const std::string& name, const std::string& dtype, const std::string& shape, double rel, double tol,
           const std::string& note = "") {
  result_row r;
  r.section = "check";
  r.name = name;
  r.dtype = dtype;
  r.shape = shape;
  r.rel = rel;
  r.tol = tol;
  r.pass = rel <= tol;  // false for NaN
  r.note = note;
  rows.push_back(r);
}

void check_true(const std::string& name, const std::string& dtype, const std::string& shape, bool ok,
                const std::string& note) {
  result_row r;
  r.section = "check";
  r.name = name;
  r.dtype = dtype;
  r.shape = shape;
  r.pass = ok;
  r.note = note;
  rows.push_back(r);
}

// n quiet NaNs: the starting value of a buffer the kernel must write without reading.
template <class T>
std::vector<T> nan_vec(std::size_t n) {
  return std::vector<T>(n, st::convert<T>(std::numeric_limits<float>::quiet_NaN()));
}

template <class T>
std::vector<float> widen_all(const std::vector<T>& v) {
  std::vector<float> w(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) w[i] = st::convert<float>(v[i]);
  return w;
}

// ---------------------------------------------------------------------------------------------
// Naive references for the GEMM-based kernels (double accumulation, one rounding).
template <class T>
void ref_gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, double alpha, const T* A,
              std::int64_t lda, const T* B, std::int64_t ldb, double beta, T* C, std::int64_t ldc) {
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (std::int64_t p = 0; p < K; ++p) {
        const double a = st::convert<double>(ta ? A[p * lda + i] : A[i * lda + p]);
        const double b = st::convert<double>(tb ? B[j * ldb + p] : B[p * ldb + j]);
        s += a * b;
      }
      const double c = beta == 0 ? 0.0 : beta * st::convert<double>(C[i * ldc + j]);
      C[i * ldc + j] = st::convert<T>(float(alpha * s + c));
    }
}

template <class T>
void ref_linear_forward(T* out, const T* inp, const T* w, const T* bias, std::int64_t N, std::int64_t C,
                        std::int64_t OC) {
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < OC; ++o) {
      double s = 0;
      for (std::int64_t c = 0; c < C; ++c) s += st::convert<double>(inp[n * C + c]) * st::convert<double>(w[o * C + c]);
      out[n * OC + o] = st::convert<T>(float(s + (bias ? st::convert<double>(bias[o]) : 0.0)));
    }
}

// ---------------------------------------------------------------------------------------------
template <class T>
void test_elementwise(std::int64_t n) {
  const std::string dt = st::dtype_name<T>(), sh = shape_str({n});
  const auto x = random_vec<T>(std::size_t(n), -4, 4, 1), g = random_vec<T>(std::size_t(n), -1, 1, 2);
  const auto d0 = random_vec<T>(std::size_t(n), -1, 1, 3);
  {  // gelu
    std::vector<T> ref(static_cast<std::size_t>(n));
    k::gelu_forward(H, ref.data(), x.data(), n);
    dvec<T> dx(x), dout(static_cast<std::size_t>(n));
    k::gelu_forward(D, dout.get(), dx.get(), n);
    check("gelu_forward", dt, sh, rel_error(dout.host(), ref), tol_for<T>());
    std::vector<T> dref = d0;
    k::gelu_backward(H, dref.data(), x.data(), g.data(), n);
    dvec<T> dd(nan_vec<T>(std::size_t(n))), dg(g);
    k::gelu_backward(D, dd.get(), dx.get(), dg.get(), n);
    check("gelu_backward", dt, sh, rel_error(dd.host(), dref), tol_for<T>());
  }
  {  // exact gelu (erf)
    std::vector<T> ref(static_cast<std::size_t>(n));
    k::gelu_forward(H, ref.data(), x.data(), n, st::gelu_form::exact);
    dvec<T> dx(x), dout(static_cast<std::size_t>(n));
    k::gelu_forward(D, dout.get(), dx.get(), n, st::gelu_form::exact);
    check("gelu_forward (exact)", dt, sh, rel_error(dout.host(), ref), tol_for<T>());
    std::vector<T> dref = d0;
    k::gelu_backward(H, dref.data(), x.data(), g.data(), n, st::gelu_form::exact);
    dvec<T> dd(nan_vec<T>(std::size_t(n))), dg(g);
    k::gelu_backward(D, dd.get(), dx.get(), dg.get(), n, st::gelu_form::exact);
    check("gelu_backward (exact)", dt, sh, rel_error(dd.host(), dref), tol_for<T>());
  }
  {  // residual, aligned and (offset by one element) scalar paths
    for (int off : {0, 1}) {
      const std::int64_t m = n - off;
      std::vector<T> ref(static_cast<std::size_t>(m));
      k::residual_forward(H, ref.data(), x.data() + off, g.data() + off, m);
      dvec<T> da(x), db(g), dout(static_cast<std::size_t>(n));
      k::residual_forward(D, dout.get() + off, da.get() + off, db.get() + off, m);
      auto got = dout.host();
      got.erase(got.begin(), got.begin() + off);
      check(off ? "residual_forward (unaligned)" : "residual_forward", dt, shape_str({m}), rel_error(got, ref),
            tol_for<T>());
    }
    std::vector<T> ra = d0, rb = x;
    k::residual_backward<T>(H, ra.data(), rb.data(), g.data(), n);
    dvec<T> da(nan_vec<T>(std::size_t(n))), db(nan_vec<T>(std::size_t(n))), dg(g);
    k::residual_backward<T>(D, da.get(), db.get(), dg.get(), n);
    check("residual_backward", dt, sh, std::max(rel_error(da.host(), ra), rel_error(db.host(), rb)), tol_for<T>());
  }
  {  // scale_in_place, convert_array
    std::vector<T> ref = x;
    k::scale_in_place(H, ref.data(), n, 0.37);
    dvec<T> dx(x);
    k::scale_in_place(D, dx.get(), n, 0.37);
    check("scale_in_place", dt, sh, rel_error(dx.host(), ref), tol_for<T>());
    const auto f = random_vec<float>(std::size_t(n), -70000, 70000, 4);  // fp16 overflows to inf: both sides
    std::vector<T> narrowed(static_cast<std::size_t>(n));
    k::convert_array(H, narrowed.data(), f.data(), n);
    dvec<float> df(f);
    dvec<T> dn(static_cast<std::size_t>(n));
    k::convert_array(D, dn.get(), df.get(), n);
    check_true("convert_array (fp32 -> T)", dt, sh, bitwise_equal(dn.host(), narrowed), "bitwise equal to the host");
    std::vector<float> wide(static_cast<std::size_t>(n));
    k::convert_array(H, wide.data(), x.data(), n);
    dvec<float> dw(static_cast<std::size_t>(n));
    k::convert_array(D, dw.get(), dx.get(), n);  // dx was scaled: widen the host's scaled copy
    std::vector<float> wide_scaled(static_cast<std::size_t>(n));
    k::convert_array(H, wide_scaled.data(), ref.data(), n);
    check_true("convert_array (T -> fp32)", dt, sh, bitwise_equal(dw.host(), wide_scaled), "bitwise equal to the host");
  }
  {  // reductions
    const double ref = k::sum_of_squares(H, x.data(), n);
    dvec<T> dx(x);
    const double got = k::sum_of_squares(D, dx.get(), n);
    const double again = k::sum_of_squares(D, dx.get(), n);
    check("sum_of_squares", dt, sh, std::abs(got - ref) / ref, 1e-10);
    check_true("sum_of_squares (deterministic)", dt, sh, got == again, "two runs bitwise equal");
    bool ok = k::all_finite(D, dx.get(), n);
    std::vector<T> bad = x;
    bad[std::size_t(n / 2)] = st::convert<T>(NAN);
    dvec<T> dbad(bad);
    const bool caught = !k::all_finite(D, dbad.get(), n);
    bad[std::size_t(n / 2)] = st::convert<T>(INFINITY);
    dvec<T> dinf(bad);
    const bool caught_inf = !k::all_finite(D, dinf.get(), n);
    check_true("all_finite", dt, sh, ok && caught && caught_inf, "finite / NaN / inf");
  }
}

template <class T>
void test_layernorm(std::int64_t N, std::int64_t C) {
  const std::string dt = st::dtype_name<T>(), sh = shape_str({N, C});
  const auto x = random_vec<T>(std::size_t(N * C), -2, 2, 10), a = random_vec<T>(std::size_t(N * C), -1, 1, 11);
  const auto w = random_vec<T>(std::size_t(C), 0.5f, 1.5f, 12), b = random_vec<T>(std::size_t(C), -0.5f, 0.5f, 13);
  const float eps = 1e-5f;
  std::vector<T> out(std::size_t(N * C));
  std::vector<float> mean(static_cast<std::size_t>(N)), rstd(static_cast<std::size_t>(N));
  k::layernorm_forward(H, out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, eps);
  dvec<T> dx(x), dw(w), db(b), dout(std::size_t(N * C));
  dvec<float> dmean(static_cast<std::size_t>(N)), drstd(static_cast<std::size_t>(N));
  k::layernorm_forward(D, dout.get(), dmean.get(), drstd.get(), dx.get(), dw.get(), db.get(), N, C, eps);
  check("layernorm_forward", dt, sh, rel_error(dout.host(), out), tol_for<T>());
  check("layernorm_forward (mean, rstd)", "fp32", sh,
        std::max(rel_error(dmean.host(), mean), rel_error(drstd.host(), rstd)), 1e-5);

  // backward: dweight and dbias accumulate into random starting values, dinp is written over NaN
  const auto g = random_vec<T>(std::size_t(N * C), -1, 1, 14);
  auto dinp = random_vec<T>(std::size_t(N * C), -1, 1, 15);
  auto dweight = random_vec<T>(std::size_t(C), -1, 1, 16), dbias = random_vec<T>(std::size_t(C), -1, 1, 17);
  dvec<T> ddinp(nan_vec<T>(std::size_t(N * C))), ddw(dweight), ddb(dbias), dg(g);
  k::layernorm_backward(H, dinp.data(), dweight.data(), dbias.data(), g.data(), x.data(), w.data(), mean.data(),
                        rstd.data(), N, C);
  k::layernorm_backward(D, ddinp.get(), ddw.get(), ddb.get(), dg.get(), dx.get(), dw.get(), dmean.get(), drstd.get(), N,
                        C);
  check("layernorm_backward (dinp)", dt, sh, rel_error(ddinp.host(), dinp), tol_for<T>());
  check("layernorm_backward (dweight)", dt, sh, rel_error(ddw.host(), dweight), tol_for<T>());
  check("layernorm_backward (dbias)", dt, sh, rel_error(ddb.host(), dbias), tol_for<T>());
  {  // determinism: the same backward again from the same start
    dvec<T> e1(nan_vec<T>(std::size_t(N * C))), w1(random_vec<T>(std::size_t(C), -1, 1, 16)),
        b1(random_vec<T>(std::size_t(C), -1, 1, 17));
    k::layernorm_backward(D, e1.get(), w1.get(), b1.get(), dg.get(), dx.get(), dw.get(), dmean.get(), drstd.get(), N,
                          C);
    check_true("layernorm_backward (deterministic)", dt, sh,
               bitwise_equal(e1.host(), ddinp.host()) && bitwise_equal(w1.host(), ddw.host()) &&
                   bitwise_equal(b1.host(), ddb.host()),
               "two runs bitwise equal");
  }
  {  // fused residual + layernorm against residual_forward then layernorm_forward
    std::vector<T> resid(std::size_t(N * C)), ln(std::size_t(N * C));
    std::vector<float> m2(static_cast<std::size_t>(N)), r2(static_cast<std::size_t>(N));
    k::residual_forward(H, resid.data(), x.data(), a.data(), N * C);
    k::layernorm_forward(H, ln.data(), m2.data(), r2.data(), resid.data(), w.data(), b.data(), N, C, eps);
    dvec<T> da(a), dresid(std::size_t(N * C)), dln(std::size_t(N * C));
    k::residual_layernorm_forward(D, dresid.get(), dln.get(), dmean.get(), drstd.get(), dx.get(), da.get(), dw.get(),
                                  db.get(), N, C, eps);
    check("residual_layernorm_forward", dt, sh, std::max(rel_error(dresid.host(), resid), rel_error(dln.host(), ln)),
          tol_for<T>());
  }
}

template <class T>
void test_linear(std::int64_t N, std::int64_t C, std::int64_t OC) {
  const std::string dt = st::dtype_name<T>(), sh = shape_str({N, C, OC});
  st::memory_ledger ledger;
  st::workspace ws(ledger);
  const auto x = random_vec<T>(std::size_t(N * C), -1, 1, 20), w = random_vec<T>(std::size_t(OC * C), -0.1f, 0.1f, 21);
  const auto bias = random_vec<T>(std::size_t(OC), -0.5f, 0.5f, 22);
  dvec<T> dx(x), dw(w), dbias(bias);
  for (bool with_bias : {true, false}) {
    std::vector<T> ref(std::size_t(N * OC));
    ref_linear_forward(ref.data(), x.data(), w.data(), with_bias ? bias.data() : nullptr, N, C, OC);
    dvec<T> dout(std::size_t(N * OC));
    k::linear_forward<T>(D, ws, dout.get(), dx.get(), dw.get(), with_bias ? dbias.get() : nullptr, N, C, OC);
    check(with_bias ? "linear_forward (bias epilogue)" : "linear_forward", dt, sh, rel_error(dout.host(), ref),
          tol_for<T>());
  }
  {  // out = gelu(pre), pre = linear: the GELU epilogue (bf16, fp16 with OC % 8 == 0) or the two kernels
    std::vector<T> pre(std::size_t(N * OC)), act(std::size_t(N * OC));
    ref_linear_forward(pre.data(), x.data(), w.data(), bias.data(), N, C, OC);
    k::gelu_forward(H, act.data(), pre.data(), N * OC);
    dvec<T> dpre(std::size_t(N * OC)), dact(std::size_t(N * OC));
    k::linear_gelu_forward<T>(D, ws, dact.get(), dpre.get(), dx.get(), dw.get(), dbias.get(), N, C, OC);
    check("linear_gelu_forward (pre)", dt, sh, rel_error(dpre.host(), pre), tol_for<T>());
    check("linear_gelu_forward (gelu)", dt, sh, rel_error(dact.host(), act), tol_for<T>());
    // Its backward: dpre = dact · gelu'(pre), and the bias gradient += dpre's column sums.
    const auto gact = random_vec<T>(std::size_t(N * OC), -1, 1, 27);
    auto db = random_vec<T>(std::size_t(OC), -1, 1, 28);
    std::vector<T> dpre_ref(std::size_t(N * OC)), db_ref = db;
    k::bias_gelu_backward(H, dpre_ref.data(), db_ref.data(), pre.data(), gact.data(), N, OC);
    dvec<T> dgact(gact), ddb(db), dpre_out(nan_vec<T>(std::size_t(N * OC))), dpre_in(pre);
    k::bias_gelu_backward(D, dpre_out.get(), ddb.get(), dpre_in.get(), dgact.get(), N, OC);
    check("bias_gelu_backward (dpre)", dt, sh, rel_error(dpre_out.host(), dpre_ref), tol_for<T>());
    check("bias_gelu_backward (dbias)", dt, sh, rel_error(ddb.host(), db_ref), tol_for<T>());
    // The exact form: never the epilogue (cuBLASLt's is tanh), the projection then the kernel.
    std::vector<T> act_exact(std::size_t(N * OC));
    k::gelu_forward(H, act_exact.data(), pre.data(), N * OC, st::gelu_form::exact);
    k::linear_gelu_forward<T>(D, ws, dact.get(), dpre.get(), dx.get(), dw.get(), dbias.get(), N, C, OC,
                              st::gelu_form::exact);
    check("linear_gelu_forward (exact gelu)", dt, sh, rel_error(dact.host(), act_exact), tol_for<T>());
    std::vector<T> dpre_exact(std::size_t(N * OC)), db_exact = db;
    k::bias_gelu_backward(H, dpre_exact.data(), db_exact.data(), pre.data(), gact.data(), N, OC, st::gelu_form::exact);
    dvec<T> ddb2(db);
    k::bias_gelu_backward(D, dpre_out.get(), ddb2.get(), dpre_in.get(), dgact.get(), N, OC, st::gelu_form::exact);
    check("bias_gelu_backward (exact, dpre)", dt, sh, rel_error(dpre_out.host(), dpre_exact), tol_for<T>());
    check("bias_gelu_backward (exact, dbias)", dt, sh, rel_error(ddb2.host(), db_exact), tol_for<T>());
  }
  // backward: the parameters' gradients accumulate, the input's is written
  const auto g = random_vec<T>(std::size_t(N * OC), -1, 1, 23);
  auto dinp = random_vec<T>(std::size_t(N * C), -1, 1, 24), dweight = random_vec<T>(std::size_t(OC * C), -1, 1, 25);
  auto dbias_ref = random_vec<T>(std::size_t(OC), -1, 1, 26);
  dvec<T> ddinp(nan_vec<T>(dinp.size())), ddw(dweight), ddb(dbias_ref), dg(g);
  ref_gemm<T>(false, false, N, C, OC, 1.0, g.data(), OC, w.data(), C, 0.0, dinp.data(), C);
  ref_gemm<T>(true, false, OC, C, N, 1.0, g.data(), OC, x.data(), C, 1.0, dweight.data(), C);
  for (std::int64_t o = 0; o < OC; ++o) {
    double s = st::convert<double>(dbias_ref[std::size_t(o)]);
    for (std::int64_t n = 0; n < N; ++n) s += st::convert<double>(g[std::size_t(n * OC + o)]);
    dbias_ref[std::size_t(o)] = st::convert<T>(float(s));
  }
  k::linear_backward<T>(D, ws, ddinp.get(), ddw.get(), ddb.get(), dg.get(), dx.get(), dw.get(), N, C, OC);
  check("linear_backward (dinp)", dt, sh, rel_error(ddinp.host(), dinp), tol_for<T>());
  check("linear_backward (dweight)", dt, sh, rel_error(ddw.host(), dweight), tol_for<T>());
  check("linear_backward (dbias)", dt, sh, rel_error(ddb.host(), dbias_ref), tol_for<T>());
}

// Every (trans_a, trans_b) with padded leading dimensions, alpha and beta: the row-major to
// column-major mapping end to end.
template <class T>
void test_gemm() {
  const std::string dt = st::dtype_name<T>();
  st::memory_ledger ledger;
  st::workspace ws(ledger);
  const std::int64_t M = 67, N = 45, K = 33;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const std::int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
      const std::int64_t lda = a_cols + 3, ldb = b_cols + 5, ldc = N + 2;
      const auto A = random_vec<T>(std::size_t(a_rows * lda), -1, 1, 30),
                 B = random_vec<T>(std::size_t(b_rows * ldb), -1, 1, 31);
      auto Cref = random_vec<T>(std::size_t(M * ldc), -1, 1, 32);
      dvec<T> dA(A), dB(B), dC(Cref);
      ref_gemm<T>(ta, tb, M, N, K, 0.5, A.data(), lda, B.data(), ldb, 0.25, Cref.data(), ldc);
      k::gemm<T>(D, ws, ta, tb, M, N, K, 0.5f, dA.get(), lda, dB.get(), ldb, 0.25f, dC.get(), ldc);
      check(std::string("gemm (") + (ta ? "T" : "N") + (tb ? "T" : "N") + ", padded ld)", dt, shape_str({M, N, K}),
            rel_error(dC.host(), Cref), tol_for<T>());
    }
}

// Which attention kernels run for T and head size hd: the register-fragment ones (bf16/fp16, head
// size 64 or 128, unless attention_kernel_choice() says tiled), else the tiled ones on tensor cores
// or scalar FMAs.
template <class T>
std::string attention_path(std::int64_t hd) {
  if (gpu::tensor_core_storage_v<T> && (hd == 64 || hd == 128) &&
      k::attention_kernel_choice().load() == k::attention_kernels::automatic)
    return "register fragments";
  const auto plan = gpu::plan_attention(hd, sizeof(T), gpu::tensor_core_storage_v<T>, 227 * 1024);
  return plan.tensor_cores ? "tiled, tensor cores" : "tiled, scalar";
}

template <class T>
void test_attention(std::int64_t B, std::int64_t T_, std::int64_t C, std::int64_t NH) {
  const std::string dt = st::dtype_name<T>(), sh = shape_str({B, T_, C, NH});
  const std::int64_t hs = C / NH;
  const std::string path = attention_path<T>(hs);
  const auto qkv = random_vec<T>(std::size_t(B * T_ * 3 * C), -1.5f, 1.5f, 40);
  std::vector<T> out(std::size_t(B * T_ * C));
  std::vector<float> att(std::size_t(B * NH * T_ * T_));
  k::attention_forward(H, out.data(), att.data(), qkv.data(), B, T_, C, NH);
  dvec<T> dqkv_in(qkv), dout_(std::size_t(B * T_ * C));
  dvec<float> dlse(std::size_t(B * NH * T_));
  k::attention_forward(D, dout_.get(), dlse.get(), dqkv_in.get(), B, T_, C, NH);
  check("attention_forward", dt, sh, rel_error(dout_.host(), out), tol_for<T>(), path);
  {  // logsumexp against a direct double computation
    std::vector<float> lse_ref(std::size_t(B * NH * T_));
    const double scale = 1.0 / std::sqrt(double(hs));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < NH; ++h)
        for (std::int64_t t = 0; t < T_; ++t) {
          std::vector<double> s(std::size_t(t + 1));
          double mx = -INFINITY;
          for (std::int64_t t2 = 0; t2 <= t; ++t2) {
            double d = 0;
            for (std::int64_t i = 0; i < hs; ++i)
              d += st::convert<double>(qkv[std::size_t((b * T_ + t) * 3 * C + h * hs + i)]) *
                   st::convert<double>(qkv[std::size_t((b * T_ + t2) * 3 * C + C + h * hs + i)]);
            s[std::size_t(t2)] = d * scale;
            mx = std::max(mx, s[std::size_t(t2)]);
          }
          double sum = 0;
          for (double v : s) sum += std::exp(v - mx);
          lse_ref[std::size_t((b * NH + h) * T_ + t)] = float(mx + std::log(sum));
        }
    check("attention_forward (logsumexp)", "fp32", sh, rel_error(dlse.host(), lse_ref), 1e-5, path);
  }
  // backward, writing dqkv (random on the host, NaN on the device: never read)
  const auto g = random_vec<T>(std::size_t(B * T_ * C), -1, 1, 41);
  auto dqkv = random_vec<T>(std::size_t(B * T_ * 3 * C), -1, 1, 42);
  const auto dqkv0 = nan_vec<T>(dqkv.size());
  k::attention_backward(H, dqkv.data(), g.data(), qkv.data(), att.data(), B, T_, C, NH);
  dvec<T> dg(g), dd1(dqkv0), dd2(dqkv0), dd3(dqkv0);
  k::attention_backward(D, dd1.get(), dg.get(), dqkv_in.get(), dlse.get(), B, T_, C, NH, dout_.get());
  check("attention_backward", dt, sh, rel_error(dd1.host(), dqkv), tol_for<T>(), path + ", out given");
  k::attention_backward(D, dd2.get(), dg.get(), dqkv_in.get(), dlse.get(), B, T_, C, NH);
  check("attention_backward (recompute out)", dt, sh, rel_error(dd2.host(), dqkv), tol_for<T>(), path);
  k::attention_backward(D, dd3.get(), dg.get(), dqkv_in.get(), dlse.get(), B, T_, C, NH, dout_.get());
  check_true("attention_backward (deterministic)", dt, sh, bitwise_equal(dd1.host(), dd3.host()),
             "two runs bitwise equal");
}

// Grouped-query / multi-query attention with an explicit softmax scale (attention_shape), fwd and
// bwd against the host, plus (fp32) against the CUDA multi-head kernel run on K and V repeated
// per query head: the contract's head mapping (query head h reads key/value head h / group)
// checked independently of the host code.
template <class T>
void test_attention_gqa(std::int64_t B, std::int64_t T_, std::int64_t heads, std::int64_t kv_heads, std::int64_t hd,
                        double scale) {
  const k::attention_shape s{B, T_, heads, kv_heads, hd, scale};
  const std::string dt = st::dtype_name<T>();
  const std::string sh = shape_str({B, T_, heads, kv_heads, hd});
  const std::string path = attention_path<T>(hd) +
                           (kv_heads == 1      ? ", MQA"
                            : kv_heads < heads ? ", GQA"
                                               : ", MHA") +
                           (scale != 0 ? ", scale " + fmt("%.3g", scale) : "");
  const std::int64_t W = s.row_width(), QW = s.q_width(), G = s.group();
  const std::size_t n_qkv = std::size_t(B * T_ * W), n_out = std::size_t(B * T_ * QW),
                    n_lse = std::size_t(B * heads * T_);
  const auto qkv = random_vec<T>(n_qkv, -1.5f, 1.5f, 140);
  std::vector<T> out(n_out);
  std::vector<float> lse(n_lse);
  k::attention_forward(H, out.data(), lse.data(), qkv.data(), s);
  dvec<T> dqkv_in(qkv), dout_(n_out);
  dvec<float> dlse(n_lse);
  k::attention_forward(D, dout_.get(), dlse.get(), dqkv_in.get(), s);
  const auto got_out = dout_.host();
  const auto got_lse = dlse.host();
  check("attention_forward (shape)", dt, sh, rel_error(got_out, out), tol_for<T>(), path);
  check("attention_forward (shape: logsumexp)", "fp32", sh, rel_error(got_lse, lse), 1e-5, path);

  // backward, writing dqkv (random on the host, NaN on the device: never read); each side uses
  // its own forward's out and lse
  const auto g = random_vec<T>(n_out, -1, 1, 141);
  auto dqkv = random_vec<T>(n_qkv, -1, 1, 142);
  const auto dqkv0 = nan_vec<T>(n_qkv);
  k::attention_backward(H, dqkv.data(), g.data(), qkv.data(), lse.data(), out.data(), s);
  dvec<T> dg(g), dd1(dqkv0), dd2(dqkv0), dd3(dqkv0);
  k::attention_backward(D, dd1.get(), dg.get(), dqkv_in.get(), dlse.get(), dout_.get(), s);
  const auto got1 = dd1.host();
  check("attention_backward (shape)", dt, sh, rel_error(got1, dqkv), tol_for<T>(), path);
  k::attention_backward(D, dd2.get(), dg.get(), dqkv_in.get(), dlse.get(), static_cast<const T*>(nullptr), s);
  check("attention_backward (shape, recompute out)", dt, sh, rel_error(dd2.host(), dqkv), tol_for<T>(), path);
  k::attention_backward(D, dd3.get(), dg.get(), dqkv_in.get(), dlse.get(), dout_.get(), s);
  check_true("attention_backward (shape, deterministic)", dt, sh, bitwise_equal(got1, dd3.host()),
             "two runs bitwise equal");

  if constexpr (std::is_same_v<T, float>) {
    if (G > 1) {
      // The same attention as multi-head attention over K and V repeated per query head.
      const k::attention_shape m{B, T_, heads, heads, hd, scale};
      const std::int64_t MW = m.row_width();
      std::vector<T> rep(std::size_t(B * T_ * MW));
      for (std::int64_t r = 0; r < B * T_; ++r)
        for (std::int64_t h = 0; h < heads; ++h)
          for (std::int64_t i = 0; i < hd; ++i) {
            const std::int64_t kvh = h / G;
            rep[std::size_t(r * MW + h * hd + i)] = qkv[std::size_t(r * W + h * hd + i)];
            rep[std::size_t(r * MW + QW + h * hd + i)] = qkv[std::size_t(r * W + QW + kvh * hd + i)];
            rep[std::size_t(r * MW + 2 * QW + h * hd + i)] = qkv[std::size_t(r * W + QW + s.kv_width() + kvh * hd + i)];
          }
      dvec<T> drep(rep), mout(n_out), mgrad(nan_vec<T>(rep.size()));
      dvec<float> mlse(n_lse);
      k::attention_forward(D, mout.get(), mlse.get(), drep.get(), m);
      check("attention_forward (shape vs repeated K/V)", dt, sh,
            std::max(rel_error(got_out, mout.host()), rel_error(got_lse, mlse.host())), 1e-5, path);
      k::attention_backward(D, mgrad.get(), dg.get(), drep.get(), mlse.get(), mout.get(), m);
      const auto mg = mgrad.host();
      // Fold the repeated heads' dK, dV back onto their key/value head (double).
      std::vector<double> fold(n_qkv, 0.0);
      for (std::int64_t r = 0; r < B * T_; ++r)
        for (std::int64_t h = 0; h < heads; ++h)
          for (std::int64_t i = 0; i < hd; ++i) {
            const std::int64_t kvh = h / G;
            fold[std::size_t(r * W + h * hd + i)] += mg[std::size_t(r * MW + h * hd + i)];
            fold[std::size_t(r * W + QW + kvh * hd + i)] += mg[std::size_t(r * MW + QW + h * hd + i)];
            fold[std::size_t(r * W + QW + s.kv_width() + kvh * hd + i)] +=
                mg[std::size_t(r * MW + 2 * QW + h * hd + i)];
          }
      std::vector<T> expect(n_qkv);
      for (std::size_t i = 0; i < n_qkv; ++i) expect[i] = st::convert<T>(float(fold[i]));
      check("attention_backward (shape vs repeated K/V)", dt, sh, rel_error(got1, expect), 1e-5, path);
    }
  }
}

// Logsumexps: the -inf entries (rows that see no key) must coincide; rel_error over the others.
double lse_error(const std::vector<float>& got, const std::vector<float>& ref) {
  if (got.size() != ref.size()) return NAN;
  std::vector<float> g, r;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (ref[i] == -INFINITY || got[i] == -INFINITY) {
      if (got[i] != ref[i]) return NAN;
      continue;
    }
    g.push_back(got[i]);
    r.push_back(ref[i]);
  }
  return rel_error(g, r);
}

// rel_error of what an accumulating (+=) kernel added to `start`, in double: sharper than
// comparing the sums, whose random start would dilute the error.
double increment_error(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<float>& start) {
  if (got.size() != start.size() || ref.size() != start.size()) return NAN;
  std::vector<double> g(start.size()), r(start.size());
  for (std::size_t i = 0; i < start.size(); ++i) {
    g[i] = double(got[i]) - double(start[i]);
    r[i] = double(ref[i]) - double(start[i]);
  }
  return rel_error(g, r);
}

// Context parallelism's positioned attention (kernels/positioned_attention.hpp): the query rows of
// rank rq of the load-balanced cp-way split (layers/context_split.hpp) against every rank's
// key/value block in turn, as the ring passes them: per block the kv packing, the forward (out,
// lse, work) and the merge into the running result; then D = rowsum(dout · out) and per block the
// backward (dq accumulated over the blocks, each block's dkv from random values). The CUDA kernels
// against the host ones on the same inputs (backward on each side's own lse and D), the work
// counts equal, the backward run twice and bitwise equal. Rank 0's first chunk sees nothing of the
// later ranks' blocks, so rows with lse -inf are covered.
template <class T>
void test_positioned_attention(std::int64_t B, std::int64_t seq, int cp, int rq, std::int64_t heads,
                               std::int64_t kv_heads, std::int64_t hd, double scale) {
  const auto split = st::context_split::checked(seq, cp, rq);
  const std::int64_t m = split.local_seq();
  const k::attention_shape s{B, m, heads, kv_heads, hd, scale};
  const std::string dt = st::dtype_name<T>();
  const std::string sh = shape_str({B, seq, heads, kv_heads, hd});
  const std::string note = "cp " + std::to_string(cp) + ", rank " + std::to_string(rq) +
                           (kv_heads == 1      ? ", MQA"
                            : kv_heads < heads ? ", GQA"
                                               : ", MHA") +
                           (scale != 0 ? ", scale " + fmt("%.3g", scale) : "");
  const std::int64_t W = s.row_width();
  const std::size_t n_qkv = std::size_t(B * m * W), n_out = std::size_t(B * m * s.q_width()),
                    n_lse = std::size_t(B * heads * m), n_kv = std::size_t(B * m * 2 * s.kv_width());
  const auto whole = random_vec<T>(std::size_t(B * seq * W), -1.5f, 1.5f, 240);
  std::vector<T> qkv(n_qkv);
  split.take(whole.data(), qkv.data(), B, W);
  std::vector<std::int64_t> q_pos(static_cast<std::size_t>(m));
  for (std::int64_t i = 0; i < m; ++i) q_pos[std::size_t(i)] = split.position(i);
  dvec<T> d_qkv(qkv);
  dvec<std::int64_t> d_qpos(q_pos);

  // Forward, block by block, merged.
  std::vector<float> out(n_out, 0.0f), lse(n_lse, -INFINITY);
  dvec<float> d_out(out), d_lse(lse);
  std::vector<std::vector<T>> kvs;
  std::vector<std::vector<std::int64_t>> k_poss;
  std::int64_t work = 0, d_work = 0;
  double part_err = 0, part_lse_err = 0;
  bool pack_ok = true;
  for (int rk = 0; rk < cp; ++rk) {
    const auto ks = st::context_split::checked(seq, cp, rk);
    std::vector<T> k_qkv(n_qkv), kv(n_kv);
    ks.take(whole.data(), k_qkv.data(), B, W);
    k::attention_kv_pack(H, kv.data(), k_qkv.data(), s);
    dvec<T> d_kqkv(k_qkv), d_kv(nan_vec<T>(n_kv));
    k::attention_kv_pack(D, d_kv.get(), d_kqkv.get(), s);
    pack_ok = pack_ok && bitwise_equal(d_kv.host(), kv);
    std::vector<std::int64_t> k_pos(static_cast<std::size_t>(m));
    for (std::int64_t j = 0; j < m; ++j) k_pos[std::size_t(j)] = ks.position(j);
    dvec<std::int64_t> d_kpos(k_pos);
    std::vector<float> part(n_out), part_lse(n_lse);
    work += k::positioned_attention_forward(H, part.data(), part_lse.data(), qkv.data(), q_pos.data(), kv.data(),
                                            k_pos.data(), m, s);
    dvec<float> d_part(nan_vec<float>(n_out)), d_part_lse(nan_vec<float>(n_lse));
    d_work += k::positioned_attention_forward(D, d_part.get(), d_part_lse.get(), d_qkv.get(), d_qpos.get(), d_kv.get(),
                                              d_kpos.get(), m, s);
    part_err = std::max(part_err, rel_error(d_part.host(), part));
    part_lse_err = std::max(part_lse_err, lse_error(d_part_lse.host(), part_lse));
    k::attention_merge(H, out.data(), lse.data(), part.data(), part_lse.data(), s);
    k::attention_merge(D, d_out.get(), d_lse.get(), d_part.get(), d_part_lse.get(), s);
    kvs.push_back(std::move(kv));
    k_poss.push_back(std::move(k_pos));
  }
  check_true("attention_kv_pack", dt, sh, pack_ok, "bitwise, " + note);
  check("positioned_attention_forward", dt, sh, part_err, tol_for<T>(), "each block, " + note);
  check("positioned_attention_forward (lse)", "fp32", sh, part_lse_err, 1e-5, "each block, " + note);
  check_true("positioned_attention_forward (work)", dt, sh, d_work == work,
             "B·H·visible pairs " + std::to_string(d_work) + " vs " + std::to_string(work));
  check("attention_merge", dt, sh, rel_error(d_out.host(), out), tol_for<T>(), "all blocks, " + note);
  const auto got_lse = d_lse.host();
  check("attention_merge (lse)", "fp32", sh, lse_error(got_lse, lse), 1e-5, "all blocks, " + note);

  // Backward: D from the final output as a layer keeps it (rounded to T), then block by block.
  std::vector<T> out_t(n_out);
  for (std::size_t i = 0; i < n_out; ++i) out_t[i] = st::convert<T>(out[i]);
  const auto dout = random_vec<T>(n_out, -1, 1, 241);
  std::vector<float> delta(n_lse);
  k::attention_delta(H, delta.data(), dout.data(), out_t.data(), s);
  dvec<T> d_dout(dout), d_outt(out_t);
  dvec<float> d_delta(nan_vec<float>(n_lse));
  k::attention_delta(D, d_delta.get(), d_dout.get(), d_outt.get(), s);
  check("attention_delta", "fp32", sh, rel_error(d_delta.host(), delta), 1e-5, note);

  const auto dq0 = random_vec<float>(n_out, -1, 1, 242);
  auto dq = dq0;
  dvec<float> d_dq(dq0), d_dq2(dq0);
  std::vector<float> dkv0_all, dkv_all, d_dkv_all, d_dkv2_all;
  std::int64_t bwork = 0, d_bwork = 0;
  for (int rk = 0; rk < cp; ++rk) {
    const auto dkv0 = random_vec<float>(n_kv, -1, 1, std::uint64_t(243 + rk));
    auto dkv = dkv0;
    dvec<float> d_dkv(dkv0), d_dkv2(dkv0);
    dvec<T> d_kv(kvs[std::size_t(rk)]);
    dvec<std::int64_t> d_kpos(k_poss[std::size_t(rk)]);
    bwork += k::positioned_attention_backward(H, dq.data(), dkv.data(), dout.data(), lse.data(), delta.data(),
                                              qkv.data(), q_pos.data(), kvs[std::size_t(rk)].data(),
                                              k_poss[std::size_t(rk)].data(), m, s);
    d_bwork += k::positioned_attention_backward(D, d_dq.get(), d_dkv.get(), d_dout.get(), d_lse.get(), d_delta.get(),
                                                d_qkv.get(), d_qpos.get(), d_kv.get(), d_kpos.get(), m, s);
    k::positioned_attention_backward(D, d_dq2.get(), d_dkv2.get(), d_dout.get(), d_lse.get(), d_delta.get(),
                                     d_qkv.get(), d_qpos.get(), d_kv.get(), d_kpos.get(), m, s);
    const auto got = d_dkv.host(), got2 = d_dkv2.host();
    dkv0_all.insert(dkv0_all.end(), dkv0.begin(), dkv0.end());
    dkv_all.insert(dkv_all.end(), dkv.begin(), dkv.end());
    d_dkv_all.insert(d_dkv_all.end(), got.begin(), got.end());
    d_dkv2_all.insert(d_dkv2_all.end(), got2.begin(), got2.end());
  }
  const auto got_dq = d_dq.host();
  check("positioned_attention_backward (dq)", dt, sh, increment_error(got_dq, dq, dq0), tol_for<T>(),
        "added over all blocks, " + note);
  check("positioned_attention_backward (dkv)", dt, sh, increment_error(d_dkv_all, dkv_all, dkv0_all), tol_for<T>(),
        "added, each block, " + note);
  check_true("positioned_attention_backward (work)", dt, sh, d_bwork == bwork,
             "B·H·visible pairs " + std::to_string(d_bwork) + " vs " + std::to_string(bwork));
  check_true("positioned_attention_backward (deterministic)", dt, sh,
             bitwise_equal(got_dq, d_dq2.host()) && bitwise_equal(d_dkv_all, d_dkv2_all), "two runs bitwise equal");
}

template <class T>
void test_rmsnorm(std::int64_t N, std::int64_t C) {
  const std::string dt = st::dtype_name<T>(), sh = shape_str({N, C});
  const auto x = random_vec<T>(std::size_t(N * C), -2, 2, 150);
  const auto w = random_vec<T>(std::size_t(C), 0.5f, 1.5f, 151);
  const float eps = 1e-5f;
  std::vector<T> out(std::size_t(N * C));
  std::vector<float> rstd(static_cast<std::size_t>(N));
  k::rmsnorm_forward(H, out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  dvec<T> dx(x), dw(w), dout(std::size_t(N * C)), dout2(std::size_t(N * C));
  dvec<float> drstd(static_cast<std::size_t>(N));
  k::rmsnorm_forward(D, dout.get(), drstd.get(), dx.get(), dw.get(), N, C, eps);
  check("rmsnorm_forward", dt, sh, rel_error(dout.host(), out), tol_for<T>());
  check("rmsnorm_forward (rstd)", "fp32", sh, rel_error(drstd.host(), rstd), 1e-5);
  k::rmsnorm_forward(D, dout2.get(), static_cast<float*>(nullptr), dx.get(), dw.get(), N, C, eps);
  check_true("rmsnorm_forward (no rstd)", dt, sh, bitwise_equal(dout2.host(), dout.host()),
             "equal to the run with rstd");

  // backward: dweight accumulates into random starting values, dinp is written over NaN
  const auto g = random_vec<T>(std::size_t(N * C), -1, 1, 152);
  auto dinp = random_vec<T>(std::size_t(N * C), -1, 1, 153);
  auto dweight = random_vec<T>(std::size_t(C), -1, 1, 154);
  dvec<T> ddinp(nan_vec<T>(std::size_t(N * C))), ddw(dweight), dg(g);
  k::rmsnorm_backward(H, dinp.data(), dweight.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
  k::rmsnorm_backward(D, ddinp.get(), ddw.get(), dg.get(), dx.get(), dw.get(), drstd.get(), N, C);
  const auto got_dinp = ddinp.host(), got_dw = ddw.host();
  check("rmsnorm_backward (dinp)", dt, sh, rel_error(got_dinp, dinp), tol_for<T>());
  check("rmsnorm_backward (dweight)", dt, sh, rel_error(got_dw, dweight), tol_for<T>());
  dvec<T> e1(nan_vec<T>(std::size_t(N * C))), w1(random_vec<T>(std::size_t(C), -1, 1, 154));
  k::rmsnorm_backward(D, e1.get(), w1.get(), dg.get(), dx.get(), dw.get(), drstd.get(), N, C);
  check_true("rmsnorm_backward (deterministic)", dt, sh,
             bitwise_equal(e1.host(), got_dinp) && bitwise_equal(w1.host(), got_dw), "two runs bitwise equal");
  {  // fused residual + rmsnorm against the host's fused one (itself residual_forward then rmsnorm_forward)
    const auto a = random_vec<T>(std::size_t(N * C), -1, 1, 155);
    std::vector<T> resid(std::size_t(N * C)), normed(std::size_t(N * C));
    std::vector<float> r2(static_cast<std::size_t>(N));
    k::residual_rmsnorm_forward(H, resid.data(), normed.data(), r2.data(), x.data(), a.data(), w.data(), N, C, eps);
    dvec<T> da(a), dresid(std::size_t(N * C)), dnormed(std::size_t(N * C));
    dvec<float> dr2(static_cast<std::size_t>(N));
    k::residual_rmsnorm_forward(D, dresid.get(), dnormed.get(), dr2.get(), dx.get(), da.get(), dw.get(), N, C, eps);
    check("residual_rmsnorm_forward", dt, sh,
          std::max(rel_error(dresid.host(), resid), rel_error(dnormed.host(), normed)), tol_for<T>());
  }
}

template <class T>
void test_rope(std::int64_t B, std::int64_t T_, std::int64_t heads, std::int64_t kv_heads, std::int64_t hd,
               double theta, std::int64_t pos0, std::int64_t rotary = 0) {
  const k::attention_shape s{B, T_, heads, kv_heads, hd, 0};
  const std::string dt = st::dtype_name<T>();
  const std::string sh = shape_str({B, T_, heads, kv_heads, hd}) + (pos0 ? " @" + std::to_string(pos0) : "") +
                         (rotary ? " rotary " + std::to_string(rotary) : "");
  const std::size_t n = std::size_t(B * T_ * s.row_width());
  const auto qkv = random_vec<T>(n, -2, 2, 160);
  auto ref = qkv;
  k::rope_forward(H, ref.data(), s, theta, pos0, rotary);
  dvec<T> dq(qkv);
  k::rope_forward(D, dq.get(), s, theta, pos0, rotary);
  const auto got = dq.host();
  check("rope_forward", dt, sh, rel_error(got, ref), tol_for<T>());
  bool v_untouched = true;  // the value heads are left bit for bit
  for (std::int64_t r = 0; r < B * T_; ++r)
    for (std::int64_t c = s.q_width() + s.kv_width(); c < s.row_width(); ++c) {
      const std::size_t i = std::size_t(r * s.row_width() + c);
      v_untouched = v_untouched && std::memcmp(&got[i], &qkv[i], sizeof(T)) == 0;
    }
  check_true("rope_forward (v untouched)", dt, sh, v_untouched, "value heads bitwise unchanged");

  const auto g = random_vec<T>(n, -1, 1, 161);
  auto gref = g;
  k::rope_backward(H, gref.data(), s, theta, pos0, rotary);
  dvec<T> dgr(g);
  k::rope_backward(D, dgr.get(), s, theta, pos0, rotary);
  check("rope_backward", dt, sh, rel_error(dgr.host(), gref), tol_for<T>());
  if constexpr (std::is_same_v<T, float>) {  // backward undoes forward
    k::rope_backward(D, dq.get(), s, theta, pos0, rotary);
    check("rope_backward(rope_forward(x)) = x", dt, sh, rel_error(dq.host(), qkv), 1e-5);
  }
}

// Every activation, element-wise and gated (kernels/activation.hpp), on the device against the host.
template <class T>
void test_activations(std::int64_t N, std::int64_t H_) {
  const std::string dt = st::dtype_name<T>(), sh = shape_str({N, H_});
  const std::size_t n = std::size_t(N * H_);
  const auto x = random_vec<T>(n, -4, 4, 190), g = random_vec<T>(n, -1, 1, 191);
  const auto gu = random_vec<T>(2 * n, -4, 4, 192);
  for (const auto a : {st::activation::gelu_tanh, st::activation::gelu_exact, st::activation::silu,
                       st::activation::relu, st::activation::relu_squared}) {
    const std::string name = st::activation_name(a);
    std::vector<T> ref(n), dref(n), gref(n), dgref(2 * n);
    k::activation_forward(H, ref.data(), x.data(), std::int64_t(n), a);
    k::activation_backward(H, dref.data(), x.data(), g.data(), std::int64_t(n), a);
    k::glu_forward(H, gref.data(), gu.data(), N, H_, a);
    k::glu_backward(H, dgref.data(), g.data(), gu.data(), N, H_, a);
    dvec<T> dx(x), dg(g), dgu(gu), dy(n), ddx(nan_vec<T>(n)), dgy(n), ddgu(nan_vec<T>(2 * n));
    k::activation_forward(D, dy.get(), dx.get(), std::int64_t(n), a);
    k::activation_backward(D, ddx.get(), dx.get(), dg.get(), std::int64_t(n), a);
    k::glu_forward(D, dgy.get(), dgu.get(), N, H_, a);
    k::glu_backward(D, ddgu.get(), dg.get(), dgu.get(), N, H_, a);
    check("activation_forward " + name, dt, sh, rel_error(dy.host(), ref), tol_for<T>());
    check("activation_backward " + name, dt, sh, rel_error(ddx.host(), dref), tol_for<T>());
    check("glu_forward " + name, dt, sh, rel_error(dgy.host(), gref), tol_for<T>());
    check("glu_backward " + name, dt, sh, rel_error(ddgu.host(), dgref), tol_for<T>());
  }
}

// The per-head fused QKV regrouped on the device: exactly the host's permutation, both ways.
template <class T>
void test_qkv_layout(std::int64_t rows, std::int64_t heads, std::int64_t hd) {
  const std::string dt = st::dtype_name<T>(), sh = shape_str({rows, heads, hd});
  const std::size_t n = std::size_t(rows * 3 * heads * hd);
  const auto x = random_vec<T>(n, -2, 2, 165);
  std::vector<T> ref(n), back(n);
  k::qkv_from_per_head(H, ref.data(), x.data(), rows, heads, hd);
  dvec<T> dx(x), dout(n), dback(n);
  k::qkv_from_per_head(D, dout.get(), dx.get(), rows, heads, hd);
  const auto got = dout.host();
  check_true("qkv_from_per_head", dt, sh, std::memcmp(got.data(), ref.data(), n * sizeof(T)) == 0,
             "bitwise the host's permutation");
  k::qkv_to_per_head(D, dback.get(), dout.get(), rows, heads, hd);
  const auto round = dback.host();
  check_true("qkv_to_per_head", dt, sh, std::memcmp(round.data(), x.data(), n * sizeof(T)) == 0,
             "undoes qkv_from_per_head bitwise");
}

template <class T>
void test_swiglu(std::int64_t N, std::int64_t H_) {
  const std::string dt = st::dtype_name<T>(), sh = shape_str({N, H_});
  const auto gu = random_vec<T>(std::size_t(N * 2 * H_), -6, 6, 170);
  std::vector<T> out(std::size_t(N * H_));
  k::swiglu_forward(H, out.data(), gu.data(), N, H_);
  dvec<T> dgu(gu), dout(std::size_t(N * H_));
  k::swiglu_forward(D, dout.get(), dgu.get(), N, H_);
  check("swiglu_forward", dt, sh, rel_error(dout.host(), out), tol_for<T>());
  // backward writes: the host starts from garbage, the device from NaN, both overwritten
  const auto g = random_vec<T>(std::size_t(N * H_), -1, 1, 171);
  auto dref = random_vec<T>(std::size_t(N * 2 * H_), -50, 50, 172);
  k::swiglu_backward(H, dref.data(), g.data(), gu.data(), N, H_);
  dvec<T> dd(nan_vec<T>(std::size_t(N * 2 * H_))), dg(g);
  k::swiglu_backward(D, dd.get(), dg.get(), dgu.get(), N, H_);
  check("swiglu_backward", dt, sh, rel_error(dd.host(), dref), tol_for<T>());
}

// The device-neutral building blocks (kernels/elementwise.hpp, kernels/rowwise.hpp): functors
// written once, run on both devices, the GPU's results against the host's.
struct bb_gate {  // y = z · e^u over strided halves; its gradient into two strided outputs
  template <class A>
  STRATA_HD void operator()(A& y, A z, A u) const {
    y = z * k::hd_exp(u);
  }
};
struct bb_gate_backward {
  template <class A>
  STRATA_HD void operator()(A& dz, A& du, A dy, A z, A u) const {
    const A e = k::hd_exp(u);
    dz = dy * e;
    du = dy * z * e;
  }
};
template <class T>
struct bb_rms {  // y = x · w / rms(x); rstd kept
  const T* x;
  const T* w;
  T* y;
  float* rstd;
  std::int64_t C;
  STRATA_HD float term(std::int64_t r, std::int64_t c) const {
    const float v = st::convert<float>(x[r * C + c]);
    return v * v;
  }
  STRATA_HD float finish(std::int64_t r, float s) const { return rstd[r] = 1.0f / st::hd::sqrt(s / float(C) + 1e-5f); }
  STRATA_HD void write(std::int64_t r, std::int64_t c, float s) const {
    y[r * C + c] = st::convert<T>(st::convert<float>(x[r * C + c]) * s * st::convert<float>(w[c]));
  }
};
template <class T>
struct bb_column_term {
  const T* dy;
  const T* x;
  const float* rstd;
  std::int64_t C;
  STRATA_HD float operator()(std::int64_t r, std::int64_t c) const {
    return st::convert<float>(dy[r * C + c]) * st::convert<float>(x[r * C + c]) * rstd[r];
  }
};
template <class T>
struct bb_reverse {
  const T* in;
  T* out;
  std::int64_t n;
  STRATA_HD void operator()(std::int64_t i) const { out[i] = in[n - 1 - i]; }
};

template <class T>
void test_building_blocks(std::int64_t N, std::int64_t C) {
  const std::string dt = st::dtype_name<T>(), sh = shape_str({N, C});
  // elementwise: strided forward and a two-output strided backward
  const auto zu = random_vec<T>(std::size_t(N * 2 * C), -2, 2, 180);
  const auto g = random_vec<T>(std::size_t(N * C), -1, 1, 181);
  std::vector<T> y(std::size_t(N * C)), dzu(std::size_t(N * 2 * C));
  auto fwd = [&](auto dev, T* out, const T* in) {
    k::elementwise(dev, N, C, k::outputs(out), k::inputs(k::strided(in, 2 * C), k::strided(in + C, 2 * C)), bb_gate{});
  };
  auto bwd = [&](auto dev, T* d, const T* dy, const T* in) {
    k::elementwise(dev, N, C, k::outputs(k::strided(d, 2 * C), k::strided(d + C, 2 * C)),
                   k::inputs(dy, k::strided(in, 2 * C), k::strided(in + C, 2 * C)), bb_gate_backward{});
  };
  fwd(H, y.data(), zu.data());
  bwd(H, dzu.data(), g.data(), zu.data());
  dvec<T> dzu_d(zu), dg(g), dy(std::size_t(N * C)), ddzu(nan_vec<T>(std::size_t(N * 2 * C)));
  fwd(D, dy.get(), dzu_d.get());
  bwd(D, ddzu.get(), dg.get(), dzu_d.get());
  check("elementwise (strided)", dt, sh, rel_error(dy.host(), y), tol_for<T>());
  check("elementwise (two outputs)", dt, sh, rel_error(ddzu.host(), dzu), tol_for<T>());
  // row_reduce and sum_columns: an RMS norm and its gain's gradient; twice, bitwise equal
  const auto x = random_vec<T>(std::size_t(N * C), -2, 2, 182);
  const auto w = random_vec<T>(std::size_t(C), 0.5f, 1.5f, 183);
  std::vector<T> out(std::size_t(N * C));
  std::vector<float> rstd(static_cast<std::size_t>(N));
  auto dw = random_vec<T>(std::size_t(C), -1, 1, 184);
  dvec<T> dx(x), dwt(w), dout(nan_vec<T>(std::size_t(N * C))), ddw(dw), ddw2(dw);
  dvec<float> drstd(static_cast<std::size_t>(N));
  k::row_reduce(H, N, C, bb_rms<T>{x.data(), w.data(), out.data(), rstd.data(), C});
  k::sum_columns(H, N, C, dw.data(), bb_column_term<T>{g.data(), x.data(), rstd.data(), C});
  k::row_reduce(D, N, C, bb_rms<T>{dx.get(), dwt.get(), dout.get(), drstd.get(), C});
  k::sum_columns(D, N, C, ddw.get(), bb_column_term<T>{dg.get(), dx.get(), drstd.get(), C});
  k::sum_columns(D, N, C, ddw2.get(), bb_column_term<T>{dg.get(), dx.get(), drstd.get(), C});
  check("row_reduce", dt, sh, rel_error(dout.host(), out), tol_for<T>());
  check("row_reduce (per-row value)", "fp32", sh, rel_error(drstd.host(), rstd), 1e-5);
  check("sum_columns", dt, sh, rel_error(ddw.host(), dw), tol_for<T>());
  check_true("sum_columns (deterministic)", dt, sh, bitwise_equal(ddw.host(), ddw2.host()), "two runs bitwise equal");
  // for_each_index: a gather
  dvec<T> rev(std::size_t(N * C));
  k::for_each_index(D, N * C, bb_reverse<T>{dx.get(), rev.get(), N * C});
  auto expect = x;
  std::reverse(expect.begin(), expect.end());
  check_true("for_each_index", dt, sh, bitwise_equal(rev.host(), expect), "the reversed input, bitwise");
}

template <class T>
void test_embedding(std::int64_t B, std::int64_t T_, std::int64_t C, std::int64_t V) {
  const std::string dt = st::dtype_name<T>(), sh = shape_str({B, T_, C, V});
  rng r(50);
  std::vector<std::int32_t> tokens(std::size_t(B * T_));
  for (auto& t : tokens) t = std::int32_t(r.next() % 37);  // few distinct ids: long runs
  tokens[3] = std::int32_t(V - 1);
  const auto wte = random_vec<T>(std::size_t(V * C), -1, 1, 51), wpe = random_vec<T>(std::size_t(T_ * C), -1, 1, 52);
  std::vector<T> out(std::size_t(B * T_ * C));
  k::embedding_forward(H, out.data(), tokens.data(), wte.data(), wpe.data(), B, T_, C, V);
  dvec<std::int32_t> dtok(tokens);
  dvec<T> dwte(wte), dwpe(wpe), dout(std::size_t(B * T_ * C));
  k::embedding_forward(D, dout.get(), dtok.get(), dwte.get(), dwpe.get(), B, T_, C, V);
  check("embedding_forward", dt, sh, rel_error(dout.host(), out), tol_for<T>());

  const auto g = random_vec<T>(std::size_t(B * T_ * C), -1, 1, 53);
  auto gwte = random_vec<T>(std::size_t(V * C), -1, 1, 54), gwpe = random_vec<T>(std::size_t(T_ * C), -1, 1, 55);
  dvec<T> dgwte(gwte), dgwpe(gwpe), dgwte2(gwte), dg(g);
  k::embedding_backward(H, gwte.data(), gwpe.data(), g.data(), tokens.data(), B, T_, C);
  k::embedding_backward(D, dgwte.get(), dgwpe.get(), dg.get(), dtok.get(), B, T_, C);
  const auto got_wte = dgwte.host();
  // fp32: the same per-token order as the host, so bitwise equal is expected; the check stays relative.
  check("embedding_backward (dwte)", dt, sh, rel_error(got_wte, gwte), tol_for<T>(),
        bitwise_equal(got_wte, gwte) ? "bitwise equal to the host" : "");
  check("embedding_backward (dwpe)", dt, sh, rel_error(dgwpe.host(), gwpe), tol_for<T>());
  dvec<T> dgwpe2(random_vec<T>(std::size_t(T_ * C), -1, 1, 55));
  k::embedding_backward(D, dgwte2.get(), dgwpe2.get(), dg.get(), dtok.get(), B, T_, C);
  check_true("embedding_backward (deterministic)", dt, sh, bitwise_equal(dgwte2.host(), got_wte),
             "two runs bitwise equal");

  // A token out of range is reported by the next check, naming it.
  std::vector<std::int32_t> badtok = tokens;
  badtok[5] = std::int32_t(V + 7);
  dvec<std::int32_t> dbad(badtok);
  k::embedding_forward(D, dout.get(), dbad.get(), dwte.get(), dwpe.get(), B, T_, C, V);
  std::string msg;
  try {
    gpu::check_device_errors();
  } catch (const st::error& e) { msg = e.what(); }
  check_true(
      "embedding_forward (bad token reported)", dt, sh,
      msg.find("token id " + std::to_string(V + 7)) != std::string::npos && msg.find("position 5") != std::string::npos,
      msg.empty() ? "no error raised" : msg);
}

template <class T>
void test_cross_entropy(std::int64_t N, std::int64_t V, std::int64_t Vp) {
  const std::string dt = st::dtype_name<T>(), sh = shape_str({N, V, Vp});
  const auto logits = random_vec<T>(std::size_t(N * Vp), -4, 4, 60);
  rng r(61);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(N));
  for (auto& t : targets) t = std::int32_t(r.next() % std::uint64_t(V));
  targets[0] = std::int32_t(V - 1);
  std::vector<float> losses(static_cast<std::size_t>(N));
  k::cross_entropy_forward(H, losses.data(), logits.data(), targets.data(), N, V, Vp);
  dvec<T> dl(logits);
  dvec<std::int32_t> dt_(targets);
  dvec<float> dloss(static_cast<std::size_t>(N));
  k::cross_entropy_forward(D, dloss.get(), dl.get(), dt_.get(), N, V, Vp);
  check("cross_entropy_forward", dt, sh, rel_error(dloss.host(), losses), tol_for<T>() < 1e-4 ? 1e-5 : 1e-3);

  auto grad = logits;
  const float scale = 1.0f / float(N);
  k::cross_entropy_forward_backward(H, losses.data(), grad.data(), targets.data(), N, V, Vp, scale);
  k::cross_entropy_forward_backward(D, dloss.get(), dl.get(), dt_.get(), N, V, Vp, scale);
  check("cross_entropy_forward_backward (loss)", dt, sh, rel_error(dloss.host(), losses),
        tol_for<T>() < 1e-4 ? 1e-5 : 1e-3);
  check("cross_entropy_forward_backward (dlogits)", dt, sh, rel_error(dl.host(), grad), tol_for<T>());

  // With the loss scale read from a device step_state.
  gpu::amp amp(st::step_rules{.dynamic = true}, 8.0);
  auto grad8 = logits;
  k::cross_entropy_forward_backward(H, losses.data(), grad8.data(), targets.data(), N, V, Vp, scale * 8.0f);
  dvec<T> dl8(logits);
  k::cross_entropy_forward_backward(D, dloss.get(), dl8.get(), dt_.get(), N, V, Vp, scale, amp.state());
  check("cross_entropy_forward_backward (amp scale)", dt, sh, rel_error(dl8.host(), grad8), tol_for<T>());
}

// Tensor-parallel embedding pieces: the table split into R shards of ceil(V / R) rows (the last
// shorter), each shard's kernels run on both sides. The lookup is a copy and must be bitwise
// equal; the rest against the host within tol_for<T>() (fp32 1e-5, bf16/fp16 1e-2), the token
// backward also run twice for determinism.
template <class T>
void test_embedding_tp(std::int64_t B, std::int64_t T_, std::int64_t C, std::int64_t V, std::int64_t R) {
  const std::string dt = st::dtype_name<T>(), sh = shape_str({B, T_, C, V, R});
  const std::int64_t count = B * T_, Vl = (V + R - 1) / R;
  rng r(150);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < tokens.size(); ++i)  // half from a few ids (long runs), half spread over V
    tokens[i] = std::int32_t(i % 2 ? r.next() % 37 : r.next() % std::uint64_t(V));
  tokens[3] = std::int32_t(V - 1);
  dvec<std::int32_t> dtok(tokens);
  const auto g = random_vec<T>(std::size_t(count * C), -1, 1, 151);
  dvec<T> dg(g);

  bool lookup_bitwise = true;
  double bwd_rel = 0;
  bool bwd_bitwise = true, bwd_deterministic = true;
  for (std::int64_t shard = 0; shard < R; ++shard) {
    const std::int64_t v_begin = shard * Vl, rows_here = std::min(Vl, V - v_begin);
    const auto wte_local = random_vec<T>(std::size_t(rows_here * C), -1, 1, std::uint64_t(152 + shard));
    std::vector<T> out(std::size_t(count * C));
    k::embedding_lookup_range(H, out.data(), tokens.data(), wte_local.data(), count, C, v_begin, rows_here, V);
    dvec<T> dwte(wte_local), dout(random_vec<T>(std::size_t(count * C), -1, 1, 160));  // overwritten
    k::embedding_lookup_range(D, dout.get(), dtok.get(), dwte.get(), count, C, v_begin, rows_here, V);
    lookup_bitwise = lookup_bitwise && bitwise_equal(dout.host(), out);

    auto gw = random_vec<T>(std::size_t(rows_here * C), -1, 1, std::uint64_t(170 + shard));
    dvec<T> dgw(gw), dgw2(gw);
    k::token_embedding_backward(H, gw.data(), g.data(), tokens.data(), count, C, v_begin, rows_here);
    k::token_embedding_backward(D, dgw.get(), dg.get(), dtok.get(), count, C, v_begin, rows_here);
    k::token_embedding_backward(D, dgw2.get(), dg.get(), dtok.get(), count, C, v_begin, rows_here);
    const auto got = dgw.host();
    bwd_rel = std::max(bwd_rel, rel_error(got, gw));
    bwd_bitwise = bwd_bitwise && bitwise_equal(got, gw);
    bwd_deterministic = bwd_deterministic && bitwise_equal(dgw2.host(), got);
  }
  check_true("embedding_lookup_range", dt, sh, lookup_bitwise, "every shard bitwise equal to the host");
  check("token_embedding_backward", dt, sh, bwd_rel, tol_for<T>(),
        bwd_bitwise ? "every shard bitwise equal to the host" : "max over shards");
  check_true("token_embedding_backward (deterministic)", dt, sh, bwd_deterministic, "two runs bitwise equal");

  // Positions: the whole batch, and a sequence-parallel piece starting mid-sequence.
  const auto wpe = random_vec<T>(std::size_t(T_ * C), -1, 1, 180);
  dvec<T> dwpe(wpe);
  for (const auto& [first, n] : {std::pair<std::int64_t, std::int64_t>{0, count},
                                 std::pair<std::int64_t, std::int64_t>{T_ / 2 + 1, count / 2}}) {
    auto x = random_vec<T>(std::size_t(n * C), -1, 1, 181);
    dvec<T> dx(x);
    k::position_embedding_add(H, x.data(), wpe.data(), n, T_, first, C);
    k::position_embedding_add(D, dx.get(), dwpe.get(), n, T_, first, C);
    const auto got = dx.host();
    check(first == 0 ? "position_embedding_add" : "position_embedding_add (piece)", dt, shape_str({n, T_, first, C}),
          rel_error(got, x), tol_for<T>(), bitwise_equal(got, x) ? "bitwise equal to the host" : "");
  }
  {
    auto gp = random_vec<T>(std::size_t(T_ * C), -1, 1, 182);
    dvec<T> dgp(gp);
    k::position_embedding_backward(H, gp.data(), g.data(), B, T_, C);
    k::position_embedding_backward(D, dgp.get(), dg.get(), B, T_, C);
    const auto got = dgp.host();
    check("position_embedding_backward", dt, sh, rel_error(got, gp), tol_for<T>(),
          bitwise_equal(got, gp) ? "bitwise equal to the host" : "");
  }

  // Bad ids are reported by the next check, naming them.
  auto reported = [](const std::string& want, const std::string& where) {
    std::string msg;
    try {
      gpu::check_device_errors();
    } catch (const st::error& e) { msg = e.what(); }
    return std::pair<bool, std::string>{msg.find(want) != std::string::npos && msg.find(where) != std::string::npos,
                                        msg.empty() ? "no error raised" : msg};
  };
  {
    std::vector<std::int32_t> bad = tokens;
    bad[5] = std::int32_t(V + 7);
    dvec<std::int32_t> dbad(bad);
    dvec<T> dwte(random_vec<T>(std::size_t(Vl * C), -1, 1, 183)), dout(std::size_t(count * C));
    k::embedding_lookup_range(D, dout.get(), dbad.get(), dwte.get(), count, C, 0, Vl, V);
    const auto [ok, msg] = reported("token id " + std::to_string(V + 7), "position 5");
    check_true("embedding_lookup_range (bad token reported)", dt, sh, ok, msg);
  }
  {
    std::vector<std::int32_t> bad = tokens;
    bad[6] = -2;
    dvec<std::int32_t> dbad(bad);
    dvec<T> dgw(std::size_t(Vl * C));
    k::token_embedding_backward(D, dgw.get(), dg.get(), dbad.get(), count, C, 0, Vl);
    const auto [ok, msg] = reported("token id -2", "position 6");
    check_true("token_embedding_backward (negative token reported)", dt, sh, ok, msg);
  }
}

// Vocabulary-parallel cross-entropy with R shards of Vl columns (R * Vl >= V; a shard may hold
// only padding). The all-reduces between the steps are done here on the host (max, then sums in
// shard order), for the host and the CUDA pieces alike. Checks: row_max bitwise equal (a max is
// exact); sums and losses within 1e-5 (fp32) / 1e-3 (bf16, fp16; the same float arithmetic, only
// the summation order differs); the gradient within tol_for<T>(); and the assembled CUDA loss
// and gradient against the whole-row host cross_entropy_forward_backward over [N, R * Vl].
template <class T>
void test_vocab_parallel_cross_entropy(std::int64_t N, std::int64_t V, std::int64_t Vl, std::int64_t R) {
  const std::string dt = st::dtype_name<T>(), sh = shape_str({N, V, Vl, R});
  const std::int64_t Vp = R * Vl;
  const double loss_tol = tol_for<T>() < 1e-4 ? 1e-5 : 1e-3;
  const auto logits = random_vec<T>(std::size_t(N * Vp), -4, 4, 260);
  rng r(261);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(N));
  for (auto& t : targets) t = std::int32_t(r.next() % std::uint64_t(V));
  targets[0] = std::int32_t(V - 1);
  targets[std::size_t(N - 1)] = 0;
  dvec<std::int32_t> dtargets(targets);
  const float dloss = 1.0f / float(N);

  // Shard s of the logits: columns [s * Vl, (s + 1) * Vl) of every row, as [N, Vl].
  std::vector<std::vector<T>> shard(static_cast<std::size_t>(R));
  for (std::int64_t s = 0; s < R; ++s) {
    auto& x = shard[std::size_t(s)];
    x.resize(std::size_t(N * Vl));
    for (std::int64_t i = 0; i < N; ++i)
      std::memcpy(x.data() + i * Vl, logits.data() + i * Vp + s * Vl, std::size_t(Vl) * sizeof(T));
  }
  std::vector<dvec<T>> dshard;
  for (const auto& x : shard) dshard.emplace_back(x);

  const std::size_t n = static_cast<std::size_t>(N);
  // 1. max
  std::vector<float> hmax(n, -INFINITY), dmax(n, -INFINITY);
  bool max_bitwise = true;
  dvec<float> dm(n);
  for (std::int64_t s = 0; s < R; ++s) {
    std::vector<float> h(n);
    k::vocab_parallel_max(H, h.data(), shard[std::size_t(s)].data(), targets.data(), N, Vl, s * Vl, V);
    k::vocab_parallel_max(D, dm.get(), dshard[std::size_t(s)].get(), dtargets.get(), N, Vl, s * Vl, V);
    const auto d = dm.host();
    max_bitwise = max_bitwise && bitwise_equal(d, h);
    for (std::size_t i = 0; i < n; ++i) {
      hmax[i] = std::max(hmax[i], h[i]);
      dmax[i] = std::max(dmax[i], d[i]);
    }
  }
  check_true("vocab_parallel_max", dt, sh, max_bitwise, "every shard bitwise equal to the host");

  // 2. sums
  std::vector<float> hsum(2 * n, 0.0f), dsum(2 * n, 0.0f);
  double sums_rel = 0;
  dvec<float> dmax_d(dmax), ds(2 * n);
  for (std::int64_t s = 0; s < R; ++s) {
    std::vector<float> h(2 * n);
    k::vocab_parallel_sums(H, h.data(), shard[std::size_t(s)].data(), hmax.data(), targets.data(), N, Vl, s * Vl, V);
    k::vocab_parallel_sums(D, ds.get(), dshard[std::size_t(s)].get(), dmax_d.get(), dtargets.get(), N, Vl, s * Vl, V);
    const auto d = ds.host();
    sums_rel = std::max(sums_rel, rel_error(d, h));
    for (std::size_t i = 0; i < 2 * n; ++i) {
      hsum[i] += h[i];
      dsum[i] += d[i];
    }
  }
  check("vocab_parallel_sums", dt, sh, sums_rel, loss_tol, "max over shards");

  // 3. finish: losses only, then losses and the gradient in place.
  dvec<float> dsum_d(dsum), dlosses(n);
  std::vector<float> hlosses(n);
  double loss_rel = 0, grad_rel = 0;
  std::vector<T> assembled(std::size_t(N * Vp));
  for (std::int64_t s = 0; s < R; ++s) {
    k::vocab_parallel_finish<T>(H, hlosses.data(), nullptr, hmax.data(), hsum.data(), targets.data(), N, Vl, s * Vl, V,
                                dloss);
    k::vocab_parallel_finish<T>(D, dlosses.get(), nullptr, dmax_d.get(), dsum_d.get(), dtargets.get(), N, Vl, s * Vl, V,
                                dloss);
    loss_rel = std::max(loss_rel, rel_error(dlosses.host(), hlosses));
    auto grad = shard[std::size_t(s)];
    k::vocab_parallel_finish(H, hlosses.data(), grad.data(), hmax.data(), hsum.data(), targets.data(), N, Vl, s * Vl, V,
                             dloss);
    k::vocab_parallel_finish(D, dlosses.get(), dshard[std::size_t(s)].get(), dmax_d.get(), dsum_d.get(), dtargets.get(),
                             N, Vl, s * Vl, V, dloss);
    const auto got = dshard[std::size_t(s)].host();
    loss_rel = std::max(loss_rel, rel_error(dlosses.host(), hlosses));
    grad_rel = std::max(grad_rel, rel_error(got, grad));
    for (std::int64_t i = 0; i < N; ++i)
      std::memcpy(assembled.data() + i * Vp + s * Vl, got.data() + i * Vl, std::size_t(Vl) * sizeof(T));
  }
  check("vocab_parallel_finish (loss)", dt, sh, loss_rel, loss_tol, "with and without logits, max over shards");
  check("vocab_parallel_finish (dlogits)", dt, sh, grad_rel, tol_for<T>(), "max over shards");

  // End to end against the whole-row host kernel.
  auto whole = logits;
  std::vector<float> whole_losses(n);
  k::cross_entropy_forward_backward(H, whole_losses.data(), whole.data(), targets.data(), N, V, Vp, dloss);
  check("vocab_parallel (loss vs whole rows)", dt, sh, rel_error(dlosses.host(), whole_losses), loss_tol);
  check("vocab_parallel (dlogits vs whole rows)", dt, sh, rel_error(assembled, whole), tol_for<T>());

  // A target outside [0, V): reported by the next check (vocab_parallel_max records it), NaN loss.
  auto bad = targets;
  bad[2] = std::int32_t(V + 3);
  dvec<std::int32_t> dbad(bad);
  k::vocab_parallel_max(D, dm.get(), dshard[0].get(), dbad.get(), N, Vl, 0, V);
  std::string msg;
  try {
    gpu::check_device_errors();
  } catch (const st::error& e) { msg = e.what(); }
  k::vocab_parallel_finish<T>(D, dlosses.get(), nullptr, dmax_d.get(), dsum_d.get(), dbad.get(), N, Vl, 0, V, dloss);
  const bool nan_loss = std::isnan(dlosses.host()[2]);
  check_true("vocab_parallel_max (bad target reported)", dt, sh,
             msg.find("target " + std::to_string(V + 3)) != std::string::npos &&
                 msg.find("position 2") != std::string::npos && nan_loss,
             (msg.empty() ? "no error raised" : msg) + (nan_loss ? "; NaN loss" : "; loss not NaN"));
}

template <class T, class M>
void test_adamw(std::int64_t n) {
  const std::string dt = std::string(st::dtype_name<T>()) + "/" + st::dtype_name<M>();
  const std::string sh = shape_str({n});
  const auto master0 = random_vec<M>(std::size_t(n), -1, 1, 70);
  const auto grad = random_vec<T>(std::size_t(n), -1, 1, 71);
  const auto m0 = random_vec<M>(std::size_t(n), -0.1f, 0.1f, 72), v0 = random_vec<M>(std::size_t(n), 0.0f, 0.01f, 73);
  std::vector<T> w0(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < w0.size(); ++i) w0[i] = st::convert<T>(master0[i]);
  const k::adamw_hyper h{1e-3, 0.9, 0.95, 1e-8, 0.1};
  auto master = master0, m = m0, v = v0;
  auto w = w0;
  k::adamw_update(H, master.data(), w.data(), grad.data(), m.data(), v.data(), n, h, 3, 0.5);
  dvec<M> dmaster(master0), dm(m0), dv(v0);
  dvec<T> dw(w0), dg(grad);
  k::adamw_update(D, dmaster.get(), dw.get(), dg.get(), dm.get(), dv.get(), n, h, 3, 0.5);
  const double rel = std::max({rel_error(dmaster.host(), master), rel_error(dm.host(), m), rel_error(dv.host(), v)});
  check("adamw_update (master, m, v)", dt, sh, rel, 1e-5);
  check("adamw_update (weights)", dt, sh, rel_error(dw.host(), w), tol_for<T>());
}

// The device-driven step: grad norm -> advance_step on the GPU -> AdamW reading the state; the host
// runs advance_step (the same function) and the host AdamW with the resulting scalars.
template <class T>
void test_amp(std::int64_t n) {
  const std::string dt = std::string(st::dtype_name<T>()) + "/fp32", sh = shape_str({n});
  const double loss_scale = 1024.0;
  st::step_rules opt;
  opt.dynamic = true;
  opt.max_norm = 1.0;
  opt.growth_interval = 2;
  const auto master0 = random_vec<float>(std::size_t(n), -1, 1, 80);
  auto grad = random_vec<T>(std::size_t(n), -0.5f, 0.5f, 81);
  const auto m0 = random_vec<float>(std::size_t(n), -0.1f, 0.1f, 82),
             v0 = random_vec<float>(std::size_t(n), 0, 0.01f, 83);
  std::vector<T> w0(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < w0.size(); ++i) w0[i] = st::convert<T>(master0[i]);
  const k::adamw_hyper h{6e-4, opt.beta1, opt.beta2, 1e-8, 0.1};

  for (bool overflow : {false, true}) {
    if (overflow) grad[std::size_t(n / 3)] = st::convert<T>(INFINITY);
    gpu::amp amp(opt, loss_scale);
    dvec<float> dmaster(master0), dm(m0), dv(v0);
    dvec<T> dw(w0), dg(grad);
    k::grad_norm_squared(D, dg.get(), n, amp.state());
    k::advance_step(D, amp.state(), amp.options());
    k::adamw_update(D, dmaster.get(), dw.get(), dg.get(), dm.get(), dv.get(), n, h, amp.state());
    const st::step_state got = amp.read();

    st::step_state ref;
    ref.scale = loss_scale;
    ref.sumsq = k::sum_of_squares(H, grad.data(), n);
    st::advance_step(ref, opt);
    auto master = master0, m = m0, v = v0;
    auto w = w0;
    if (ref.apply)
      k::adamw_update(H, master.data(), w.data(), grad.data(), m.data(), v.data(), n, h, ref.step, ref.grad_mult);
    const bool state_ok = got.apply == ref.apply && got.step == ref.step && got.scale == ref.scale &&
                          got.skipped == ref.skipped && got.found_inf == ref.found_inf &&
                          (overflow || std::abs(got.norm - ref.norm) <= 1e-10 * ref.norm);
    check_true(overflow ? "amp step (overflow: skipped, scale halved)" : "amp step (state)", dt, sh, state_ok,
               "scale " + std::to_string(got.scale) + ", step " + std::to_string(got.step) + ", apply " +
                   std::to_string(got.apply));
    if (!overflow) {
      check("amp step + adamw_update (master)", dt, sh, rel_error(dmaster.host(), master), 1e-5);
      check("amp step + adamw_update (weights)", dt, sh, rel_error(dw.host(), w), tol_for<T>());
    } else {
      check_true("amp step + adamw_update (skipped)", dt, sh,
                 bitwise_equal(dmaster.host(), master0) && bitwise_equal(dw.host(), w0), "weights unchanged");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Benchmarks at GPT-2 124M shapes (bf16).
struct ceilings {
  double copy_gbs = 0, gemm_tflops = 0;
};

ceilings measure_ceilings() {
  ceilings c;
  const std::size_t bytes = std::size_t(1) << 30;
  dvec<unsigned char> a(bytes), b(bytes);
  const cudaStream_t s = gpu::current_stream();
  const double ms =
      time_ms([&] { STRATA_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, s)); }, 10);
  c.copy_gbs = 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
  const std::int64_t n = 8192;
  // Random operands: a GEMM on zeros runs faster than on data (the tensor cores draw less power).
  dvec<bf16> A(random_vec<bf16>(std::size_t(n * n), -1, 1, 80)), B(random_vec<bf16>(std::size_t(n * n), -1, 1, 81)),
      C(std::size_t(n * n));
  const double gms = time_ms(
      [&] {
        k::cuda_detail::lt_matmul<bf16>("gemm ceiling", false, true, n, n, n, 1.0f, A.get(), n, B.get(), n, 0.0f,
                                        C.get(), n);
      },
      10);
  c.gemm_tflops = 2.0 * double(n) * n * n / (gms * 1e-3) / 1e12;
  result_row r1;
  r1.section = "ceiling";
  r1.name = "ceiling: device-to-device copy";
  r1.dtype = "-";
  r1.shape = "1 GiB";
  r1.perf = c.copy_gbs;
  r1.unit = "GB/s";
  r1.of_ceiling = 1.0;
  r1.note = "read + write bytes / time";
  rows.push_back(r1);
  result_row r2 = r1;
  r2.name = "ceiling: cuBLASLt bf16 GEMM";
  r2.dtype = "bf16";
  r2.shape = "8192^3";
  r2.perf = c.gemm_tflops;
  r2.unit = "TFLOP/s";
  r2.note = "fp32 accumulate";
  rows.push_back(r2);
  return c;
}

void bench_row(const std::string& name, const std::string& shape, double ms, double amount, bool flops,
               const ceilings& c, const std::string& note = "") {
  result_row r;
  r.section = "bench";
  r.name = name;
  r.dtype = "bf16";
  r.shape = shape;
  if (flops) {
    r.perf = amount / (ms * 1e-3) / 1e12;
    r.unit = "TFLOP/s";
    r.of_ceiling = r.perf / c.gemm_tflops;
  } else {
    r.perf = amount / (ms * 1e-3) / 1e9;
    r.unit = "GB/s";
    r.of_ceiling = r.perf / c.copy_gbs;
  }
  char t[32];
  std::snprintf(t, sizeof t, "%.3f ms", ms);
  r.note = std::string(t) + (note.empty() ? "" : "; " + note);
  rows.push_back(r);
}

void run_benchmarks() {
  const ceilings c = measure_ceilings();
  using T = bf16;
  const std::int64_t B = 16, T_ = 1024, C = 768, NH = 12, V = 50257, Vp = 50304, N = B * T_;
  const double e = 2;  // bytes per bf16
  st::memory_ledger ledger;
  st::workspace ws(ledger);
  dvec<T> x(random_vec<T>(std::size_t(N * C), -1, 1, 90)), y(std::size_t(N * C)), z(std::size_t(N * C));
  dvec<T> big(random_vec<T>(std::size_t(N * 4 * C), -1, 1, 91)), big2(std::size_t(N * 4 * C)),
      big3(std::size_t(N * 4 * C));
  dvec<T> w(random_vec<T>(std::size_t(4 * C * C), -0.05f, 0.05f, 92)), bias(std::size_t(4 * C)),
      dwt(std::size_t(4 * C * C));
  dvec<T> lnw(random_vec<T>(std::size_t(C), 0.5f, 1.5f, 93)), lnb(static_cast<std::size_t>(C)),
      dlnw(static_cast<std::size_t>(C)), dlnb(static_cast<std::size_t>(C));
  dvec<float> mean(static_cast<std::size_t>(N)), rstd(static_cast<std::size_t>(N));
  const std::string nc = shape_str({N, C});

  // GEMMs (linear layers of one GPT-2 block, and the LM head)
  auto lin = [&](const char* name, std::int64_t OC, const T* b) {
    const double ms = time_ms([&] { k::linear_forward<T>(D, ws, big2.get(), x.get(), w.get(), b, N, C, OC); });
    bench_row(name, shape_str({N, C, OC}), ms, 2.0 * N * C * OC, true, c);
  };
  lin("linear_forward (qkv, bias)", 3 * C, bias.get());
  lin("linear_forward (fc, bias)", 4 * C, bias.get());
  {
    const double ms = time_ms(
        [&] { k::linear_gelu_forward<T>(D, ws, big2.get(), big3.get(), x.get(), w.get(), bias.get(), N, C, 4 * C); });
    bench_row("linear_gelu_forward (fc)", shape_str({N, C, 4 * C}), ms, 2.0 * N * C * 4 * C, true, c);
    const double ms2 =
        time_ms([&] { k::linear_forward<T>(D, ws, y.get(), big.get(), w.get(), bias.get(), N, 4 * C, C); });
    bench_row("linear_forward (proj, bias)", shape_str({N, 4 * C, C}), ms2, 2.0 * N * C * 4 * C, true, c);
    const double ms3 = time_ms([&] {
      k::linear_backward<T>(D, ws, big2.get(), dwt.get(), bias.get(), x.get(), big.get(), w.get(), N, 4 * C, C);
    });
    bench_row("linear_backward (proj: dinp, dw, db)", shape_str({N, 4 * C, C}), ms3, 4.0 * N * C * 4 * C, true, c);
  }
  {
    dvec<T> wte(random_vec<T>(std::size_t(Vp * C), -0.05f, 0.05f, 94)), logits(std::size_t(N * Vp));
    const double ms =
        time_ms([&] { k::linear_forward<T>(D, ws, logits.get(), x.get(), wte.get(), nullptr, N, C, Vp); }, 5);
    bench_row("linear_forward (lm head)", shape_str({N, C, Vp}), ms, 2.0 * N * C * Vp, true, c);
    dvec<std::int32_t> targets(std::vector<std::int32_t>(std::size_t(N), 11));
    dvec<float> losses(static_cast<std::size_t>(N));
    const double ms2 = time_ms(
        [&] {
          k::cross_entropy_forward_backward(D, losses.get(), logits.get(), targets.get(), N, V, Vp, 1.0f / float(N));
        },
        5);
    bench_row("cross_entropy_forward_backward", shape_str({N, Vp}), ms2, 2.0 * N * Vp * e, false, c,
              "bytes: logits read + written once");
  }
  // attention
  {
    dvec<T> qkv(random_vec<T>(std::size_t(N * 3 * C), -1, 1, 95)), dqkv(std::size_t(N * 3 * C));
    dvec<float> lse(std::size_t(B * NH * T_));
    const double hs = double(C / NH);
    const double fwd_flops = 2.0 * B * NH * double(T_) * T_ * hs;  // 2 GEMMs x 2 flops x T^2/2 (causal)
    const double ms = time_ms([&] { k::attention_forward(D, y.get(), lse.get(), qkv.get(), B, T_, C, NH); });
    bench_row("attention_forward", shape_str({B, T_, C, NH}), ms, fwd_flops, true, c, "causal flops");
    const double ms2 =
        time_ms([&] { k::attention_backward(D, dqkv.get(), x.get(), qkv.get(), lse.get(), B, T_, C, NH, y.get()); });
    bench_row("attention_backward", shape_str({B, T_, C, NH}), ms2, 2.5 * fwd_flops, true, c, "causal flops (5 GEMMs)");
    k::attention_kernel_choice() = k::attention_kernels::tiled;  // the tiled kernels, side by side
    const double tms = time_ms([&] { k::attention_forward(D, y.get(), lse.get(), qkv.get(), B, T_, C, NH); });
    const double tms2 =
        time_ms([&] { k::attention_backward(D, dqkv.get(), x.get(), qkv.get(), lse.get(), B, T_, C, NH, y.get()); });
    k::attention_kernel_choice() = k::attention_kernels::automatic;
    bench_row("attention_forward (tiled kernels)", shape_str({B, T_, C, NH}), tms, fwd_flops, true, c,
              fmt("causal flops; register fragments %.2fx faster", tms / ms));
    bench_row("attention_backward (tiled kernels)", shape_str({B, T_, C, NH}), tms2, 2.5 * fwd_flops, true, c,
              fmt("register fragments %.2fx faster", tms2 / ms2));
  }
  {  // grouped-query attention at a Llama-like shape: 32 query heads on 8 key/value heads, hd 128
    const k::attention_shape s{4, 2048, 32, 8, 128, 0};
    const std::size_t n_qkv = std::size_t(s.batch * s.seq * s.row_width()),
                      n_out = std::size_t(s.batch * s.seq * s.q_width());
    dvec<T> qkv(random_vec<T>(n_qkv, -1, 1, 99)), dqkv(n_qkv), o(n_out), g(random_vec<T>(n_out, -1, 1, 100));
    dvec<float> lse(std::size_t(s.batch * s.heads * s.seq));
    const double fwd_flops = 2.0 * double(s.batch * s.heads) * double(s.seq) * double(s.seq) * double(s.head_dim);
    const std::string gsh = shape_str({s.batch, s.seq, s.heads, s.kv_heads, s.head_dim});
    const double ms = time_ms([&] { k::attention_forward(D, o.get(), lse.get(), qkv.get(), s); });
    bench_row("attention_forward (GQA)", gsh, ms, fwd_flops, true, c, "causal flops");
    const double ms2 =
        time_ms([&] { k::attention_backward(D, dqkv.get(), g.get(), qkv.get(), lse.get(), o.get(), s); });
    bench_row("attention_backward (GQA)", gsh, ms2, 2.5 * fwd_flops, true, c, "causal flops (5 GEMMs)");
    k::attention_kernel_choice() = k::attention_kernels::tiled;
    const double tms = time_ms([&] { k::attention_forward(D, o.get(), lse.get(), qkv.get(), s); });
    const double tms2 =
        time_ms([&] { k::attention_backward(D, dqkv.get(), g.get(), qkv.get(), lse.get(), o.get(), s); });
    k::attention_kernel_choice() = k::attention_kernels::automatic;
    bench_row("attention_forward (GQA, tiled kernels)", gsh, tms, fwd_flops, true, c,
              fmt("register fragments %.2fx faster", tms / ms));
    bench_row("attention_backward (GQA, tiled kernels)", gsh, tms2, 2.5 * fwd_flops, true, c,
              fmt("register fragments %.2fx faster", tms2 / ms2));
  }
  // memory-bound kernels
  {
    double ms = time_ms(
        [&] { k::layernorm_forward(D, y.get(), mean.get(), rstd.get(), x.get(), lnw.get(), lnb.get(), N, C, 1e-5f); });
    bench_row("layernorm_forward", nc, ms, 2.0 * N * C * e, false, c);
    ms = time_ms([&] {
      k::residual_layernorm_forward(D, z.get(), y.get(), mean.get(), rstd.get(), x.get(), y.get(), lnw.get(), lnb.get(),
                                    N, C, 1e-5f);
    });
    bench_row("residual_layernorm_forward", nc, ms, 4.0 * N * C * e, false, c);
    ms = time_ms([&] {
      k::layernorm_backward(D, z.get(), dlnw.get(), dlnb.get(), y.get(), x.get(), lnw.get(), mean.get(), rstd.get(), N,
                            C);
    });
    bench_row("layernorm_backward", nc, ms, 4.0 * N * C * e, false, c, "bytes: dout, inp, dinp read + dinp written");
    const std::int64_t n4 = N * 4 * C;
    ms = time_ms([&] { k::gelu_forward(D, big2.get(), big.get(), n4); });
    bench_row("gelu_forward", shape_str({N, 4 * C}), ms, 2.0 * n4 * e, false, c);
    ms = time_ms([&] { k::gelu_backward(D, big2.get(), big.get(), big3.get(), n4); });
    bench_row("gelu_backward", shape_str({N, 4 * C}), ms, 3.0 * n4 * e, false, c);
    ms = time_ms([&] { k::residual_forward(D, z.get(), x.get(), y.get(), N * C); });
    bench_row("residual_forward", nc, ms, 3.0 * N * C * e, false, c);
  }
  {
    dvec<T> wte(random_vec<T>(std::size_t(V * C), -1, 1, 96)), wpe(random_vec<T>(std::size_t(T_ * C), -1, 1, 97));
    dvec<T> dwte(std::size_t(V * C)), dwpe(std::size_t(T_ * C));
    rng r(98);
    std::vector<std::int32_t> tok(static_cast<std::size_t>(N));
    for (auto& t : tok) t = std::int32_t(r.next() % std::uint64_t(V));
    dvec<std::int32_t> dtok(tok);
    double ms = time_ms([&] { k::embedding_forward(D, y.get(), dtok.get(), wte.get(), wpe.get(), B, T_, C, V); });
    bench_row("embedding_forward", shape_str({B, T_, C}), ms, 3.0 * N * C * e, false, c);
    ms = time_ms([&] { k::embedding_backward(D, dwte.get(), dwpe.get(), x.get(), dtok.get(), B, T_, C); });
    bench_row("embedding_backward", shape_str({B, T_, C}), ms, 4.0 * N * C * e, false, c,
              "bytes: dout read twice, dwte rows read + written");
  }
  {
    const std::int64_t P = 124475904;  // GPT-2 124M with the vocabulary padded to 50304
    dvec<float> master(static_cast<std::size_t>(P)), m(static_cast<std::size_t>(P)), v(static_cast<std::size_t>(P));
    dvec<T> wts(static_cast<std::size_t>(P)), g(static_cast<std::size_t>(P));
    const k::adamw_hyper h{6e-4, 0.9, 0.95, 1e-8, 0.1};
    double ms = time_ms([&] { k::adamw_update(D, master.get(), wts.get(), g.get(), m.get(), v.get(), P, h, 1, 1.0); });
    bench_row("adamw_update", shape_str({P}), ms, 28.0 * double(P), false, c,
              "bytes: 3 fp32 rw + bf16 grad r + bf16 w");
    gpu::amp amp(st::step_rules{}, 1.0);
    ms = time_ms([&] { k::grad_norm_squared(D, g.get(), P, amp.state()); });
    bench_row("grad_norm_squared (sum_of_squares)", shape_str({P}), ms, 2.0 * double(P), false, c);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool bench = false;
  const char* tsv = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--bench") bench = true;
    else if (a == "--tsv" && i + 1 < argc) tsv = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--bench] [--tsv FILE]\n", argv[0]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("strata GPU tests: no CUDA device found; nothing to run\n");
    return 2;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("strata GPU tests on %s (sm_%d%d, %d SMs, %.0f GiB)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, double(prop.totalGlobalMem) / (1 << 30));
  try {
    test_elementwise<float>((1 << 20) + 3);
    test_elementwise<bf16>((1 << 20) + 3);
    test_elementwise<fp16>((1 << 16) + 5);
    test_layernorm<float>(1000, 768);
    test_layernorm<bf16>(1000, 768);
    test_layernorm<bf16>(333, 100);  // C not a multiple of the pack: the scalar path
    test_layernorm<fp16>(257, 256);
    test_gemm<float>();
    test_gemm<bf16>();
    test_gemm<fp16>();
    test_linear<float>(256, 384, 1152);
    test_linear<bf16>(256, 384, 1152);
    test_linear<bf16>(100, 72, 30);  // odd sizes, OC not a multiple of 8
    test_linear<fp16>(128, 256, 512);
    test_attention<float>(2, 200, 256, 4);              // scalar path, ragged last tile
    test_attention<bf16>(2, 256, 256, 4);               // tensor cores, hs = 64
    test_attention<bf16>(2, 200, 384, 4);               // tensor cores, hs = 96, ragged
    test_attention<bf16>(2, 77, 160, 4);                // hs = 40: scalar path for bf16
    test_attention<fp16>(1, 130, 512, 4);               // tensor cores, hs = 128
    test_attention_gqa<float>(2, 200, 8, 2, 32, 0);     // GQA, scalar path, ragged last tile
    test_attention_gqa<float>(2, 130, 8, 1, 32, 0.3);   // MQA, custom scale
    test_attention_gqa<float>(1, 96, 4, 4, 24, 0.125);  // MHA through attention_shape, custom scale
    test_attention_gqa<bf16>(2, 256, 8, 2, 64, 0);      // GQA, tensor cores
    test_attention_gqa<bf16>(2, 200, 8, 1, 64, 0.2);    // MQA, tensor cores, custom scale, ragged
    test_attention_gqa<bf16>(1, 77, 8, 2, 40, 0.15);    // GQA, hd = 40: scalar path for bf16
    test_attention_gqa<fp16>(1, 130, 8, 2, 128, 0);     // GQA, tensor cores, hd = 128
    test_attention_gqa<bf16>(1, 333, 4, 2, 128, 0);     // hd = 128: several query and key tiles, ragged
    test_attention_gqa<fp16>(2, 100, 4, 4, 64, 0.1);    // fp16, hd = 64, ragged
    // The tiled kernels at the head sizes the register-fragment ones take by default.
    k::attention_kernel_choice() = k::attention_kernels::tiled;
    test_attention<bf16>(2, 256, 256, 4);
    test_attention<fp16>(1, 130, 512, 4);
    test_attention_gqa<bf16>(2, 200, 8, 1, 64, 0.2);
    test_attention_gqa<bf16>(1, 333, 4, 2, 128, 0);
    k::attention_kernel_choice() = k::attention_kernels::automatic;
    // context parallelism's positioned attention: query rows of one rank against every rank's block
    test_positioned_attention<float>(2, 256, 2, 0, 8, 2, 64, 0);    // cp 2, rank 0, GQA
    test_positioned_attention<float>(2, 200, 4, 3, 4, 2, 33, 0.2);  // cp 4, last rank: ragged tiles, odd hd
    test_positioned_attention<float>(1, 200, 4, 0, 4, 1, 24, 0);    // cp 4, rank 0, MQA
    test_positioned_attention<bf16>(2, 256, 2, 1, 8, 2, 64, 0);     // cp 2, last rank, GQA
    test_positioned_attention<bf16>(2, 200, 4, 0, 4, 4, 40, 0.15);  // cp 4, rank 0, MHA, ragged
    test_positioned_attention<fp16>(1, 256, 4, 3, 8, 2, 128, 0);    // cp 4, last rank, hd = 128
    test_rmsnorm<float>(1000, 768);
    test_rmsnorm<bf16>(1000, 768);
    test_rmsnorm<bf16>(333, 100);  // C not a multiple of the pack: the scalar path
    test_rmsnorm<fp16>(257, 256);
    test_rope<float>(2, 100, 8, 2, 64, 10000.0, 0);
    test_rope<float>(1, 64, 4, 1, 128, 500000.0, 4093);  // Llama 3 theta, a late start position
    test_rope<bf16>(2, 100, 8, 2, 64, 10000.0, 0);
    test_rope<fp16>(2, 33, 6, 3, 18, 10000.0, 7);      // odd half size
    test_rope<float>(2, 50, 4, 4, 32, 10000.0, 3, 8);  // partial rotary (GPT-NeoX's quarter)
    test_rope<bf16>(2, 50, 4, 4, 32, 10000.0, 0, 8);
    test_qkv_layout<float>(100, 4, 32);
    test_activations<float>(64, 96);
    test_activations<bf16>(33, 40);
    test_qkv_layout<bf16>(37, 6, 16);
    test_swiglu<float>(300, 1024);
    test_swiglu<bf16>(300, 1024);
    test_swiglu<bf16>(77, 130);  // H not a multiple of the pack: the scalar path
    test_swiglu<fp16>(64, 512);
    test_building_blocks<float>(300, 768);
    test_building_blocks<bf16>(1000, 768);
    test_building_blocks<bf16>(77, 130);  // rows not a multiple of the pack: element by element
    test_building_blocks<fp16>(64, 512);
    test_embedding<float>(4, 64, 768, 1000);
    test_embedding<bf16>(4, 64, 768, 1000);
    test_embedding<bf16>(3, 50, 100, 77);  // C not a multiple of the pack
    test_cross_entropy<float>(64, 50257, 50304);
    test_cross_entropy<bf16>(64, 50257, 50304);
    test_cross_entropy<bf16>(33, 1001, 1003);  // Vp not a multiple of the pack: the scalar path
    test_cross_entropy<fp16>(16, 5000, 5008);
    test_embedding_tp<float>(4, 64, 768, 1000, 2);
    test_embedding_tp<bf16>(4, 64, 768, 1000, 3);
    test_embedding_tp<bf16>(3, 50, 100, 77, 4);  // C not a multiple of the pack: the scalar path
    test_vocab_parallel_cross_entropy<float>(64, 50257, 25152, 2);
    test_vocab_parallel_cross_entropy<bf16>(64, 50257, 25152, 2);
    test_vocab_parallel_cross_entropy<bf16>(33, 1001, 251, 5);  // scalar path; the last shard is all padding
    test_vocab_parallel_cross_entropy<fp16>(16, 5000, 1256, 4);
    test_adamw<float, float>(100003);
    test_adamw<bf16, float>(100003);
    test_adamw<fp16, float>(4099);
    test_amp<bf16>(200000);
    test_amp<float>(50000);
    if (bench) run_benchmarks();
  } catch (const std::exception& e) {
    std::printf("strata GPU tests: aborted: %s\n", e.what());
    print_table(rows);
    if (tsv) write_tsv(rows, tsv);
    return 1;
  }
  print_table(rows);
  if (tsv) write_tsv(rows, tsv);
  int failed = 0;
  for (const auto& r : rows) failed += r.pass ? 0 : 1;
  std::printf("%d checks, %d failed\n", int(rows.size()), failed);
  return failed == 0 ? 0 : 1;
}
