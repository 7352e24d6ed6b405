// tests/cuda/test_launch_config.cpp - the CUDA backend's host-side decisions, tested on the CPU
// (no GPU, no nvcc): launch arithmetic, the deterministic reduction splits, the row-major to
// cuBLASLt column-major GEMM mapping, the precision rules, the attention tiling and its shared
// memory layout, and the device-resident mixed-precision step rule (advance_step), which the
// GPU runs as is.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/step_state.hpp"
#include "strata/kernels/cuda/launch_config.hpp"
#include "strata/kernels/host/adamw.hpp"
#include "strata/optim/loss_scaler.hpp"

namespace gpu = strata::gpu;
using strata::bf16;
using strata::fp16;

TEST_CASE("cuda launch: pack widths and alignment") {
  CHECK(gpu::pack_width<bf16> == 8);
  CHECK(gpu::pack_width<fp16> == 8);
  CHECK(gpu::pack_width<float> == 4);
  CHECK(gpu::pack_width<double> == 2);
  alignas(16) unsigned char buf[64];
  CHECK(gpu::aligned16(buf));
  CHECK_FALSE(gpu::aligned16(buf + 2));
  CHECK(gpu::all_aligned16(buf, buf + 16, buf + 32));
  CHECK_FALSE(gpu::all_aligned16(buf, buf + 8));
  CHECK(gpu::aligned16(nullptr));
  alignas(256) unsigned char big[512];
  CHECK(gpu::pointer_alignment(big) == 256);
  CHECK(gpu::pointer_alignment(big + 2) == 2);
  CHECK(gpu::pointer_alignment(big + 48) == 16);
  CHECK(gpu::pointer_alignment(big + 129) == 1);
  CHECK(gpu::pointer_alignment(nullptr) == 256);
}

TEST_CASE("cuda launch: element-wise and row grids cover the work") {
  CHECK(gpu::ceil_div(0, 4) == 0);
  CHECK(gpu::ceil_div(9, 4) == 3);
  const auto empty = gpu::elementwise_launch(0, 8);
  CHECK(empty.grid == 1);
  CHECK(empty.block == 256);
  for (std::int64_t n : {1LL, 7LL, 255LL, 256LL, 257LL, 2048LL, 1000003LL, 124475904LL, 1LL << 33}) {
    for (int width : {1, 2, 4, 8}) {
      const auto d = gpu::elementwise_launch(n, width);
      CAPTURE(n);
      CAPTURE(width);
      // one thread per pack: every element is reached, and no block is wholly idle
      CHECK(std::int64_t(d.grid) * d.block * width >= n);
      CHECK(std::int64_t(d.grid - 1) * d.block * width < std::max<std::int64_t>(n, 1));
    }
  }
  const auto r = gpu::rows_launch(1001, 8);
  CHECK(r.block == 256);
  CHECK(r.grid == 126);
  CHECK_THROWS_AS(gpu::elementwise_launch(-1, 8), strata::error);
  CHECK_THROWS_AS(gpu::elementwise_launch(10, 8, 100), strata::error);
}

TEST_CASE("cuda reductions: a row_reduce block is a whole number of warps, 32 to 256, from the row length alone") {
  // About four columns a thread: 128 columns or fewer take one warp, each further 128 another,
  // up to eight warps (1024 columns and more).
  const std::pair<std::int64_t, int> expected[] = {{1, 32},     {128, 32},   {129, 64},   {256, 64},       {257, 96},
                                                   {1000, 256}, {1024, 256}, {4096, 256}, {1LL << 40, 256}};
  for (const auto& [cols, block] : expected) {
    CAPTURE(cols);
    CHECK(gpu::row_reduce_block(cols) == block);
  }
  for (std::int64_t cols = 1; cols <= 2048; ++cols) {
    const int b = gpu::row_reduce_block(cols);
    CHECK((b % 32 == 0 && b >= 32 && b <= 256));
  }
  CHECK_THROWS_AS(gpu::row_reduce_block(0), strata::error);
}

TEST_CASE("cuda reductions: column chunks depend on N only and cover every row once") {
  for (std::int64_t N : {1LL, 31LL, 32LL, 33LL, 1000LL, 2048LL, 16384LL, 16385LL, 1000000LL}) {
    const auto p = gpu::plan_column_sums(N, 768);
    CAPTURE(N);
    CHECK(p.rows_per_chunk >= 32);
    CHECK(p.chunks * p.rows_per_chunk >= N);
    CHECK((p.chunks - 1) * p.rows_per_chunk < N);
    CHECK(p.col_strips == 24);
    CHECK(p.chunks <= 65535);
    const auto again = gpu::plan_column_sums(N, 100);  // the split of rows ignores C
    CHECK(again.chunks == p.chunks);
    CHECK(again.col_strips == 4);
  }
  CHECK(gpu::plan_column_sums(16384, 768).rows_per_chunk == 256);
  CHECK(gpu::plan_column_sums(16384, 768).chunks == 64);
  CHECK(gpu::plan_column_sums(0, 768).chunks == 0);
  CHECK(gpu::reduce_partials(0) == 0);
  CHECK(gpu::reduce_partials(8192) == 1);
  CHECK(gpu::reduce_partials(8193) == 2);
  CHECK(gpu::reduce_partials(124475904) == 15195);
}

// cuBLAS semantics: column-major, D = op(A) op(B) with the stored shapes the mapping declares.
template <class F>
static void colmajor_gemm_ref(const gpu::colmajor_gemm& g, const float* A, const float* B, float* C,
                              F&& check_in_bounds) {
  for (std::int64_t j = 0; j < g.n; ++j)
    for (std::int64_t i = 0; i < g.m; ++i) {
      double s = 0;
      for (std::int64_t p = 0; p < g.k; ++p) {
        // op(A)[i, p]: A stored a_rows x a_cols column-major with lda
        const std::int64_t ar = g.trans_a ? p : i, ac = g.trans_a ? i : p;
        const std::int64_t br = g.trans_b ? j : p, bc = g.trans_b ? p : j;
        check_in_bounds(ar < g.a_rows && ac < g.a_cols && br < g.b_rows && bc < g.b_cols);
        s += double(A[ar + ac * g.lda]) * double(B[br + bc * g.ldb]);
      }
      C[i + j * g.ldc] = float(s);
    }
}

TEST_CASE("cuda gemm: the row-major call maps onto cuBLASLt's column-major one") {
  const std::int64_t M = 5, N = 7, K = 3;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      CAPTURE(ta);
      CAPTURE(tb);
      const std::int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
      const std::int64_t lda = a_cols + 2, ldb = b_cols + 1, ldc = N + 3;
      std::vector<float> A(std::size_t(a_rows * lda)), B(std::size_t(b_rows * ldb));
      for (std::size_t i = 0; i < A.size(); ++i) A[i] = float(int(i * 7 % 11) - 5);
      for (std::size_t i = 0; i < B.size(); ++i) B[i] = float(int(i * 5 % 13) - 6);
      // row-major reference
      std::vector<float> ref(std::size_t(M * ldc), 0.0f);
      for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (std::int64_t p = 0; p < K; ++p)
            s += double(ta ? A[std::size_t(p * lda + i)] : A[std::size_t(i * lda + p)]) *
                 double(tb ? B[std::size_t(j * ldb + p)] : B[std::size_t(p * ldb + j)]);
          ref[std::size_t(i * ldc + j)] = float(s);
        }
      const auto g = gpu::to_colmajor(ta, tb, M, N, K, lda, ldb, ldc);
      CHECK(g.m == N);
      CHECK(g.n == M);
      CHECK(g.k == K);
      CHECK(g.c_rows == N);
      CHECK(g.c_cols == M);
      CHECK(g.lda >= g.a_rows);  // cuBLASLt's rule for column-major layouts
      CHECK(g.ldb >= g.b_rows);
      CHECK(g.ldc >= g.c_rows);
      std::vector<float> got(std::size_t(M * ldc), 0.0f);
      bool in_bounds = true;
      // cuBLASLt's A is strata's B, its B strata's A
      colmajor_gemm_ref(g, B.data(), A.data(), got.data(), [&](bool ok) { in_bounds = in_bounds && ok; });
      CHECK(in_bounds);
      CHECK(got == ref);
    }
}

TEST_CASE("cuda precision rules") {
  using gpu::compute_kind;
  using gpu::scalar_kind;
  constexpr auto b = gpu::gemm_types_for<bf16>();
  static_assert(b.storage == scalar_kind::bf16 && b.compute == compute_kind::f32 && b.scale == scalar_kind::f32 &&
                b.tensor_cores);
  constexpr auto h = gpu::gemm_types_for<fp16>();
  static_assert(h.storage == scalar_kind::f16 && h.compute == compute_kind::f32 && h.tensor_cores);
  constexpr auto f = gpu::gemm_types_for<float>();
  static_assert(f.compute == compute_kind::f32 && !f.tensor_cores, "fp32 is true fp32 unless TF32 is asked for");
  constexpr auto tf = gpu::gemm_types_for<float>(true);
  static_assert(tf.compute == compute_kind::f32_fast_tf32 && tf.tensor_cores);
  constexpr auto d = gpu::gemm_types_for<double>();
  static_assert(d.compute == compute_kind::f64 && d.scale == scalar_kind::f64);
  static_assert(gpu::cuda_storage_v<float> && gpu::cuda_storage_v<bf16> && gpu::cuda_storage_v<fp16> &&
                !gpu::cuda_storage_v<double>);
  static_assert(gpu::tensor_core_storage_v<bf16> && !gpu::tensor_core_storage_v<float>);
  static_assert(std::is_same_v<strata::acc_t<bf16>, float> && std::is_same_v<strata::acc_t<fp16>, float>);

  CHECK(gpu::linear_epilogue(scalar_kind::bf16, true, false) == gpu::epilogue_kind::bias);
  CHECK(gpu::linear_epilogue(scalar_kind::bf16, false, false) == gpu::epilogue_kind::none);
  CHECK(gpu::linear_epilogue(scalar_kind::f32, true, true) == gpu::epilogue_kind::gelu_aux_bias);
  CHECK(gpu::linear_epilogue(scalar_kind::f64, true, false) == gpu::epilogue_kind::none);
  CHECK_THROWS_AS(gpu::linear_epilogue(scalar_kind::bf16, false, true), strata::error);
  CHECK(gpu::gemm_workspace_bytes(9) == std::size_t(32) << 20);
  CHECK(gpu::gemm_workspace_bytes(10) == std::size_t(32) << 20);
  CHECK(gpu::gemm_workspace_bytes(8) == std::size_t(4) << 20);

  // The GPU narrows with cvt.rn (round to nearest, ties to even), as strata's host conversion
  // does; the GPU tests check the two bit for bit. Known answers at the tie points:
  CHECK(bf16(1.00390625f).bits == 0x3f80);              // 1 + 2^-8 is halfway: ties to the even 1.0
  CHECK(bf16(1.01171875f).bits == 0x3f82);              // 1 + 3*2^-8: ties to the even 1 + 2^-6
  CHECK(fp16(1.00048828125f).bits == 0x3c00);           // 1 + 2^-11 halfway: even
  CHECK(fp16(65520.0f).bits == 0x7c00);                 // rounds past the largest finite: inf
  CHECK(fp16(5.9604644775390625e-08f).bits == 0x0001);  // the smallest subnormal
}

TEST_CASE("cuda attention tiling: tensor-core plan for GPT-2's head size") {
  const std::size_t smem = 227 * 1024;
  const auto p = gpu::plan_attention(64, 2, true, smem);
  CHECK(p.tensor_cores);
  CHECK(p.br == 64);
  CHECK(p.bc == 64);
  CHECK(p.threads == 256);
  CHECK(p.ld_t == 72);
  CHECK(p.ld_s == 68);
  CHECK(p.ld_p == 72);
  CHECK(p.ld_o == 68);
  // Q, K, V (64 x 72 bf16 = 9216 B each), S and O (64 x 68 fp32 = 17408 B), P (9216 B), m, l.
  CHECK(p.smem_forward == 3 * 9216 + 17408 + 9216 + 17408 + 256 + 256);
  CHECK(p.smem_max() <= smem);
}

TEST_CASE("cuda attention tiling: WMMA constraints and disjoint regions for every plan") {
  for (std::int64_t hs : {16, 32, 40, 48, 64, 80, 96, 128, 160, 256}) {
    for (bool tc_type : {true, false}) {
      for (std::size_t elem : {std::size_t(2), std::size_t(4)}) {
        if (tc_type && elem != 2) continue;
        for (std::size_t limit : {std::size_t(227 * 1024), std::size_t(100 * 1024)}) {
          CAPTURE(hs);
          CAPTURE(tc_type);
          CAPTURE(elem);
          CAPTURE(limit);
          gpu::attention_plan p;
          try {
            p = gpu::plan_attention(hs, elem, tc_type, limit);
          } catch (const strata::error&) {
            CHECK(hs >= 160);  // only big heads may not fit
            continue;
          }
          CHECK(p.tensor_cores == (tc_type && hs % 16 == 0));
          CHECK(p.smem_max() <= limit);
          CHECK(p.threads % 32 == 0);
          if (p.tensor_cores) {
            CHECK(p.br % 16 == 0);
            CHECK(p.bc % 16 == 0);
            CHECK(p.ld_t % 8 == 0);  // 16-bit operand ld: a multiple of 8 elements
            CHECK(p.ld_p % 8 == 0);
            CHECK(p.ld_s % 4 == 0);  // fp32 accumulator ld: a multiple of 4
            CHECK(p.ld_o % 4 == 0);
          } else {
            CHECK(p.br <= 32);
          }
          CHECK(p.ld_t >= hs);
          CHECK(p.ld_o >= hs);
          CHECK(p.ld_s >= p.bc);
          CHECK(p.ld_p >= p.bc);
          const std::size_t pb = p.tensor_cores ? elem : sizeof(float);
          for (auto pass :
               {gpu::attention_pass::forward, gpu::attention_pass::backward_kv, gpu::attention_pass::backward_q}) {
            const auto L = gpu::attention_layout(pass, p.br, p.bc, p.ld_t, p.ld_s, p.ld_p, p.ld_o, elem, pb);
            // every region starts 128-byte aligned (WMMA needs 32) and ends before the next
            for (std::size_t off : {L.q, L.dout, L.k, L.v, L.s, L.dp, L.p, L.ds, L.acc0, L.acc1, L.row0, L.row1})
              CHECK(off % 128 == 0);
            const std::size_t tq = std::size_t(p.br) * p.ld_t * elem, tk = std::size_t(p.bc) * p.ld_t * elem;
            CHECK(L.k >= L.q + tq);
            CHECK(L.v >= L.k + tk);
            CHECK(L.s >= L.v + tk);
            CHECK(L.row1 >= L.row0 + std::size_t(p.br) * 4);
            CHECK(L.total >= L.row1 + std::size_t(p.br) * 4);
            if (pass == gpu::attention_pass::backward_kv) {
              CHECK(L.dout >= L.q + tq);
              CHECK(L.k >= L.dout + tq);
              CHECK(L.acc1 >= L.acc0 + std::size_t(p.bc) * p.ld_o * 4);
            }
          }
        }
      }
    }
  }
  CHECK_THROWS_AS(gpu::plan_attention(0, 2, true, 227 * 1024), strata::error);
  CHECK_THROWS_AS(gpu::plan_attention(300, 2, true, 227 * 1024), strata::error);
  CHECK_THROWS_AS(gpu::plan_attention(256, 4, false, 8 * 1024), strata::error);
  const auto f32 = gpu::plan_attention(64, 4, false, 227 * 1024);
  CHECK_FALSE(f32.tensor_cores);
  CHECK(f32.br == 32);
  CHECK(f32.ld_t == 65);  // odd stride: no bank conflicts in the scalar products
  CHECK_FALSE(gpu::plan_attention(40, 2, true, 227 * 1024).tensor_cores);
}

TEST_CASE("step state: the rule the trainer runs on every device equals strata::loss_scaler") {
  strata::step_rules o;
  o.dynamic = true;
  o.growth_interval = 3;
  o.max_norm = 1.0;
  strata::loss_scaler::options lo;
  lo.enabled = true;
  lo.initial_scale = 1024;
  lo.growth_interval = 3;
  strata::loss_scaler host(lo);
  strata::step_state s;
  s.scale = 1024;
  // finite, finite, inf, finite x4, NaN, finite
  const std::vector<double> sumsq = {4.0, 9.0e6, INFINITY, 1.0, 2.0, 3.0, 4.0, NAN, 16.0};
  int applied = 0;
  for (double q : sumsq) {
    const double used = s.scale;
    CHECK(used == host.scale());
    s.sumsq = q;
    strata::advance_step(s, o);
    const bool finite = std::isfinite(std::sqrt(q));
    const bool apply = host.update(finite);
    CHECK(bool(s.apply) == apply);
    CHECK(bool(s.found_inf) == !finite);
    CHECK(s.scale == host.scale());
    CHECK(s.skipped == host.skipped_steps());
    if (apply) {
      ++applied;
      const double norm = std::sqrt(q) / used;
      CHECK(s.norm == doctest::Approx(norm));
      const double clip = norm > o.max_norm ? o.max_norm / (norm + 1e-6) : 1.0;
      CHECK(s.grad_mult == doctest::Approx(clip / used));
      CHECK(s.step == applied);
      CHECK(s.bias_correction1 == doctest::Approx(1 - std::pow(o.beta1, applied)));
      CHECK(s.bias_correction2 == doctest::Approx(1 - std::pow(o.beta2, applied)));
    }
  }
  CHECK(applied == 7);

  // Without dynamic scaling a non-finite norm is counted (the host trainer throws) and skipped.
  strata::step_rules plain;
  strata::step_state p;
  p.sumsq = INFINITY;
  strata::advance_step(p, plain);
  CHECK(p.apply == 0);
  CHECK(p.nonfinite_unscaled == 1);
  CHECK(p.scale == 1.0);
  // Backing off stops at min_scale.
  strata::step_rules lowest = o;
  lowest.min_scale = 256;
  strata::step_state q;
  q.scale = 300;
  q.sumsq = NAN;
  strata::advance_step(q, lowest);
  CHECK(q.scale == 256);
  CHECK(strata::clip_coefficient(0.5, 1.0) == 1.0);
  CHECK(strata::clip_coefficient(2.0, 0.0) == 1.0);
  CHECK(strata::clip_coefficient(4.0, 1.0) == doctest::Approx(1.0 / (4.0 + 1e-6)));
  CHECK(strata::hd::is_finite(1e308));
  CHECK_FALSE(strata::hd::is_finite(INFINITY));
  CHECK_FALSE(strata::hd::is_finite(-INFINITY));
  CHECK_FALSE(strata::hd::is_finite(NAN));
}

TEST_CASE("cuda adamw: the shared step scalars reproduce the host AdamW") {
  const strata::kernels::adamw_hyper h{1e-3, 0.9, 0.95, 1e-8, 0.1};
  const int step = 4;
  const double grad_scale = 0.25;
  const std::int64_t n = 1000;
  const std::size_t count = std::size_t(n);
  std::vector<float> master(count), m(count), v(count), g(count);
  for (std::int64_t i = 0; i < n; ++i) {
    master[std::size_t(i)] = float(std::sin(0.1 * double(i)));
    m[std::size_t(i)] = float(0.01 * std::cos(0.3 * double(i)));
    v[std::size_t(i)] = float(1e-4 * (1.0 + std::sin(0.7 * double(i))));
    g[std::size_t(i)] = float(std::cos(0.05 * double(i)));
  }
  std::vector<bf16> gb(count), w(count);
  for (std::int64_t i = 0; i < n; ++i) gb[std::size_t(i)] = bf16(g[std::size_t(i)]);
  auto hm = master, hmm = m, hv = v;
  strata::kernels::adamw_update(strata::host{}, hm.data(), w.data(), gb.data(), hmm.data(), hv.data(), n, h, step,
                                grad_scale);
  // The CUDA kernel's per-element arithmetic, with gpu::make_adamw_scalars.
  const auto s =
      gpu::make_adamw_scalars<float>(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, 1.0 - std::pow(h.beta1, step),
                                     1.0 - std::pow(h.beta2, step), grad_scale);
  for (std::int64_t i = 0; i < n; ++i) {
    const float gi = float(gb[std::size_t(i)]) * s.scale;
    float p = master[std::size_t(i)] * s.decay;
    const float mi = s.lerp_from_start ? m[std::size_t(i)] + s.one_minus_b1 * (gi - m[std::size_t(i)])
                                       : gi - (gi - m[std::size_t(i)]) * s.one_minus_w;
    const float vi = v[std::size_t(i)] * s.b2 + s.one_minus_b2 * gi * gi;
    const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
    p = p - s.step_size * (mi / denom);
    CHECK(p == doctest::Approx(hm[std::size_t(i)]).epsilon(1e-6));
    CHECK(mi == doctest::Approx(hmm[std::size_t(i)]).epsilon(1e-6));
    CHECK(vi == doctest::Approx(hv[std::size_t(i)]).epsilon(1e-6));
    CHECK(w[std::size_t(i)].bits == bf16(hm[std::size_t(i)]).bits);
  }
}
