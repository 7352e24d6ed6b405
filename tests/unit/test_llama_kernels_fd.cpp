// The Llama family's host kernels: RMSNorm, RoPE, SwiGLU and grouped-query causal attention.
//
// Each backward against float64 fourth-order finite differences (as in test_kernels_fd.cpp:
// random inputs, a random output weighting g, L = sum(g * out), and the numerical gradient of L
// for every element of every differentiable input; max relative error <= 1e-6 with a 1e-3
// floor), each backward called a second time: the parameter gradients must double (accumulated),
// the input gradients, given NaN, must come out the same (written, never read). Forwards against direct
// float64 references: RoPE against rotate-half written out, attention against a naive version
// that repeats K and V per query head and materialises the full probabilities. Attention also:
// its logsumexp, causality, the same bits with 1, 2 and 3 OpenMP threads, the GPT-2 overloads,
// and float / bf16 / fp16 against double.
#include <doctest/doctest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "strata/core/init.hpp"
#include "strata/kernels/all.hpp"
#include "finite_difference.hpp"
#include "rope_reference.hpp"

namespace {

namespace k = strata::kernels;
using k::attention_shape;
using strata::bf16;
using strata::convert;
using strata::fp16;
using strata::host;
using namespace finite_difference;

constexpr std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

// max |a - b| / max |b|: the tensor-relative error against a reference b.
template <class X>
double tensor_relative_error(const std::vector<X>& a, const vec& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(convert<double>(a[i]) - b[i]));
    ref = std::max(ref, std::fabs(b[i]));
  }
  return diff / ref;
}

template <class X>
bool bit_identical(const std::vector<X>& a, const std::vector<X>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(X)) == 0;
}

// Sets the OpenMP team size for one scope and restores it after.
struct omp_threads {
  int saved = omp_get_max_threads();
  explicit omp_threads(int n) { omp_set_num_threads(n); }
  ~omp_threads() { omp_set_num_threads(saved); }
};

}  // namespace

// --- RMSNorm ---------------------------------------------------------------------------------

TEST_CASE("rmsnorm: gradients of inp and weight match finite differences; backward writes dinp, accumulates dweight") {
  const std::int64_t N = 10, C = 12;  // C = 12: one full 8-lane block and a tail
  const double eps = 1e-5;
  vec inp = randn(sz(N * C), 1, 1.5, 0.3), weight = randn(sz(C), 2, 0.3, 1.0), g = randn(sz(N * C), 3);
  vec out(sz(N * C)), rstd(sz(N));
  auto loss = [&] {
    k::rmsnorm_forward(host{}, out.data(), rstd.data(), inp.data(), weight.data(), N, C, eps);
    return weighted_sum(g, out);
  };
  loss();
  auto backward = [&](vec& dinp, vec& dweight) {
    k::rmsnorm_backward(host{}, dinp.data(), dweight.data(), g.data(), inp.data(), weight.data(), rstd.data(), N, C);
  };
  vec dinp(sz(N * C)), dweight(sz(C));
  backward(dinp, dweight);
  check_gradient("rmsnorm dinp", dinp, inp, loss);
  check_gradient("rmsnorm dweight", dweight, weight, loss);
  loss();  // the differences leave a perturbed output behind

  vec dinp2(dinp.size(), std::numeric_limits<double>::quiet_NaN()), dweight2 = dweight;
  backward(dinp2, dweight2);
  CHECK(dinp2 == dinp);
  check_doubled("rmsnorm dweight", dweight, dweight2);

  // rstd = 1 / sqrt(mean(x²) + eps) and out = x · rstd · w, directly.
  for (std::int64_t n = 0; n < N; ++n) {
    double ms = 0;
    for (std::int64_t c = 0; c < C; ++c) ms += inp[sz(n * C + c)] * inp[sz(n * C + c)];
    const double r = 1.0 / std::sqrt(ms / double(C) + eps);
    CHECK(rstd[sz(n)] == doctest::Approx(r).epsilon(1e-14));
    for (std::int64_t c = 0; c < C; ++c)
      CHECK(out[sz(n * C + c)] == doctest::Approx(inp[sz(n * C + c)] * r * weight[sz(c)]).epsilon(1e-14));
  }
  {  // rstd is optional in the forward (inference): the same output
    vec out2(out.size());
    k::rmsnorm_forward(host{}, out2.data(), static_cast<double*>(nullptr), inp.data(), weight.data(), N, C, eps);
    CHECK(out2 == out);
  }
  CHECK_THROWS_AS(k::rmsnorm_backward(host{}, dinp.data(), dweight.data(), g.data(), inp.data(), weight.data(),
                                      static_cast<const double*>(nullptr), N, C),
                  strata::error);
  CHECK_THROWS_AS(k::rmsnorm_forward(host{}, out.data(), rstd.data(), inp.data(), weight.data(), N, 0, eps),
                  strata::error);
}

TEST_CASE("rmsnorm: dweight sums rows in a fixed order, the same bits with 1 and 2 threads") {
  const std::int64_t N = 300, C = 200;  // above the kernels' parallel threshold
  const auto x = randn(sz(N * C), 4), w = randn(sz(C), 5, 0.2, 1.0), dy = randn(sz(N * C), 6);
  std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()), dyf(dy.begin(), dy.end());
  auto run = [&](int threads) {
    omp_threads scope(threads);
    std::vector<float> out(xf.size()), rstd(sz(N)), dx(xf.size()), dw(wf.size());
    k::rmsnorm_forward(host{}, out.data(), rstd.data(), xf.data(), wf.data(), N, C, 1e-6f);
    k::rmsnorm_backward(host{}, dx.data(), dw.data(), dyf.data(), xf.data(), wf.data(), rstd.data(), N, C);
    out.insert(out.end(), dx.begin(), dx.end());
    out.insert(out.end(), dw.begin(), dw.end());
    return out;
  };
  CHECK(bit_identical(run(1), run(2)));
}

TEST_CASE("residual_rmsnorm_forward: the numbers of residual_forward then rmsnorm_forward, in float and bf16") {
  const std::int64_t N = 37, C = 70;
  const auto a = randn(sz(N * C), 7), b = randn(sz(N * C), 8), w = randn(sz(C), 9, 0.2, 1.0);
  auto same = [&]<class T>(T) {
    const auto rounded = [](const vec& v) {
      std::vector<T> r(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) r[i] = convert<T>(v[i]);
      return r;
    };
    const std::vector<T> at = rounded(a), bt = rounded(b), wt = rounded(w);
    std::vector<T> resid(at.size()), out(at.size()), resid2(at.size()), out2(at.size());
    std::vector<float> rstd(sz(N)), rstd2(sz(N));
    k::residual_forward(host{}, resid.data(), at.data(), bt.data(), N * C);
    k::rmsnorm_forward(host{}, out.data(), rstd.data(), resid.data(), wt.data(), N, C, 1e-5f);
    k::residual_rmsnorm_forward(host{}, resid2.data(), out2.data(), rstd2.data(), at.data(), bt.data(), wt.data(), N, C,
                                1e-5f);
    return bit_identical(resid, resid2) && bit_identical(out, out2) && bit_identical(rstd, rstd2);
  };
  CHECK(same(float{}));
  CHECK(same(bf16{}));
}

// --- RoPE (against rope_reference.hpp) ----------------------------------------------------------

TEST_CASE("rope: forward is rotate-half; backward is its gradient and its transpose; pos0 shifts") {
  const attention_shape s{.batch = 2, .seq = 5, .heads = 4, .kv_heads = 2, .head_dim = 8};
  const double theta = 100.0;  // small, so even the last pair turns visibly over 5 positions
  const std::int64_t n = s.batch * s.seq * s.row_width(), v_off = s.q_width() + s.kv_width();
  vec qkv = randn(sz(n), 11), g = randn(sz(n), 12);

  SUBCASE("forward equals the direct rotate-half reference; value heads untouched") {
    for (std::int64_t pos0 : {std::int64_t(0), std::int64_t(7)}) {
      vec y = qkv;
      k::rope_forward(host{}, y.data(), s, theta, pos0);
      const vec ref = rope_test::reference(qkv, s, theta, pos0);
      double worst = 0;
      for (std::size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::fabs(y[i] - ref[i]));
      INFO("pos0 = ", pos0, ": max |rope - reference| = ", worst);
      CHECK(worst <= 1e-14);
      for (std::int64_t r = 0; r < s.batch * s.seq; ++r)
        for (std::int64_t c = v_off; c < s.row_width(); ++c)
          CHECK(y[sz(r * s.row_width() + c)] == qkv[sz(r * s.row_width() + c)]);
      // Position 0 of a call from pos0 = 0 is the identity.
      if (pos0 == 0)
        for (std::int64_t c = 0; c < s.row_width(); ++c) CHECK(y[sz(c)] == qkv[sz(c)]);
    }
  }

  SUBCASE("backward is the finite-difference gradient, v included (identity there)") {
    for (std::int64_t pos0 : {std::int64_t(0), std::int64_t(3)}) {
      vec x = qkv, y(x.size());
      auto loss = [&] {
        y = x;
        k::rope_forward(host{}, y.data(), s, theta, pos0);
        return weighted_sum(g, y);
      };
      vec dx = g;
      k::rope_backward(host{}, dx.data(), s, theta, pos0);
      check_gradient(pos0 == 0 ? "rope dqkv" : "rope dqkv (pos0 = 3)", dx, x, loss);
    }
  }

  SUBCASE("backward undoes forward and is its transpose: <rope(x), g> = <x, rope_backward(g)>") {
    vec y = qkv;
    k::rope_forward(host{}, y.data(), s, theta, 5);
    vec back = y;
    k::rope_backward(host{}, back.data(), s, theta, 5);
    double worst = 0;
    for (std::size_t i = 0; i < back.size(); ++i) worst = std::max(worst, std::fabs(back[i] - qkv[i]));
    CHECK(worst <= 1e-14);
    vec gt = g;
    k::rope_backward(host{}, gt.data(), s, theta, 5);
    CHECK(weighted_sum(g, y) == doctest::Approx(weighted_sum(gt, qkv)).epsilon(1e-13));
  }

  SUBCASE("pos0 continues a sequence: rows from pos0 = 3 equal rows 3.. of a longer call") {
    const attention_shape one{.batch = 1, .seq = 5, .heads = 4, .kv_heads = 2, .head_dim = 8};
    const attention_shape longer{.batch = 1, .seq = 8, .heads = 4, .kv_heads = 2, .head_dim = 8};
    const std::int64_t W = one.row_width();
    vec all = randn(sz(8 * W), 13);
    vec tail(all.begin() + 3 * W, all.end());
    k::rope_forward(host{}, all.data(), longer, theta, 0);
    k::rope_forward(host{}, tail.data(), one, theta, 3);
    CHECK(std::equal(tail.begin(), tail.end(), all.begin() + 3 * W));
  }

  SUBCASE("bad shapes throw") {
    attention_shape odd = s;
    odd.head_dim = 7;
    CHECK_THROWS_AS(k::rope_forward(host{}, qkv.data(), odd, theta), strata::error);
    attention_shape bad_group = s;
    bad_group.kv_heads = 3;
    CHECK_THROWS_AS(k::rope_backward(host{}, qkv.data(), bad_group, theta), strata::error);
    CHECK_THROWS_AS(k::rope_forward(host{}, qkv.data(), s, -1.0), strata::error);
  }
}

TEST_CASE("rope in float and bf16 is the double rotation rounded") {
  const attention_shape s{.batch = 1, .seq = 64, .heads = 2, .kv_heads = 1, .head_dim = 16};
  const vec x = randn(sz(s.seq * s.row_width()), 14);
  vec ref = x;
  k::rope_forward(host{}, ref.data(), s, 10000.0, 1000);
  std::vector<float> xf(x.begin(), x.end());
  std::vector<bf16> xb(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xb[i] = convert<bf16>(x[i]);
  k::rope_forward(host{}, xf.data(), s, 10000.0, 1000);
  k::rope_forward(host{}, xb.data(), s, 10000.0, 1000);
  CHECK(tensor_relative_error(xf, ref) <= 1e-6);
  CHECK(tensor_relative_error(xb, ref) <= 2.0 / 256);  // input and output rounded to bf16
}

// --- SwiGLU ----------------------------------------------------------------------------------

TEST_CASE("swiglu: gradients of the gate and up halves match finite differences; backward writes") {
  const std::int64_t N = 6, H = 7;
  vec gate_up = randn(sz(N * 2 * H), 21, 2.0), g = randn(sz(N * H), 22), out(sz(N * H));
  auto loss = [&] {
    k::swiglu_forward(host{}, out.data(), gate_up.data(), N, H);
    return weighted_sum(g, out);
  };
  loss();
  vec dgate_up(gate_up.size(), 123.0);  // garbage: backward writes, it does not add
  k::swiglu_backward(host{}, dgate_up.data(), g.data(), gate_up.data(), N, H);
  {  // the two halves separately, so a failure names the half
    vec dgate(sz(N * H)), dup(sz(N * H)), gate(sz(N * H)), up(sz(N * H));
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t i = 0; i < H; ++i) {
        dgate[sz(n * H + i)] = dgate_up[sz(n * 2 * H + i)], dup[sz(n * H + i)] = dgate_up[sz(n * 2 * H + H + i)];
        gate[sz(n * H + i)] = gate_up[sz(n * 2 * H + i)], up[sz(n * H + i)] = gate_up[sz(n * 2 * H + H + i)];
      }
    auto loss_of_halves = [&] {  // gate_up assembled from the two halves
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t i = 0; i < H; ++i)
          gate_up[sz(n * 2 * H + i)] = gate[sz(n * H + i)], gate_up[sz(n * 2 * H + H + i)] = up[sz(n * H + i)];
      return loss();
    };
    check_gradient("swiglu dgate", dgate, gate, loss_of_halves);
    check_gradient("swiglu dup", dup, up, loss_of_halves);
    loss_of_halves();  // the differences leave a perturbed gate_up behind
  }
  vec again(gate_up.size(), -5.0);
  k::swiglu_backward(host{}, again.data(), g.data(), gate_up.data(), N, H);
  CHECK(again == dgate_up);

  // silu(z) · u directly, and the far tails: no NaN where exp(-z) overflows.
  loss();
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t i = 0; i < H; ++i) {
      const double z = gate_up[sz(n * 2 * H + i)], u = gate_up[sz(n * 2 * H + H + i)];
      CHECK(out[sz(n * H + i)] == doctest::Approx(z / (1 + std::exp(-z)) * u).epsilon(1e-14));
    }
  std::vector<float> gu{-1000.f, 0.f, 1000.f, 2.f, 2.f, 2.f}, y(3), dy{1.f, 1.f, 1.f}, dgu(6);
  k::swiglu_forward(host{}, y.data(), gu.data(), 1, 3);
  k::swiglu_backward(host{}, dgu.data(), dy.data(), gu.data(), 1, 3);
  CHECK(y == std::vector<float>{-0.f, 0.f, 2000.f});
  CHECK(dgu == std::vector<float>{0.f, 1.f, 2.f, -0.f, 0.f, 1000.f});
}

// --- Attention -------------------------------------------------------------------------------

namespace {
// The naive float64 reference: K and V repeated per query head into [B, H, T, d], the full
// [B, H, T, T] probabilities (zero above the diagonal), out = P V. Also the row logsumexps.
struct attention_reference {
  vec out, lse;
};
attention_reference naive_attention(const vec& qkv, const attention_shape& s) {
  const std::int64_t B = s.batch, T = s.seq, H = s.heads, d = s.head_dim, W = s.row_width();
  vec q(sz(B * H * T * d)), kr(q.size()), vr(q.size()), P(sz(B * H * T * T));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t i = 0; i < d; ++i) {
          const std::int64_t kvh = h / s.group(), row = (b * T + t) * W, at = ((b * H + h) * T + t) * d + i;
          q[sz(at)] = qkv[sz(row + h * d + i)];
          kr[sz(at)] = qkv[sz(row + s.q_width() + kvh * d + i)];
          vr[sz(at)] = qkv[sz(row + s.q_width() + s.kv_width() + kvh * d + i)];
        }
  attention_reference r{vec(sz(B * T * H * d)), vec(sz(B * H * T))};
  const double scale = s.softmax_scale();
  for (std::int64_t bh = 0; bh < B * H; ++bh)
    for (std::int64_t t = 0; t < T; ++t) {
      double* p = P.data() + (bh * T + t) * T;
      double m = -INFINITY;
      for (std::int64_t t2 = 0; t2 <= t; ++t2) {
        double dot = 0;
        for (std::int64_t i = 0; i < d; ++i) dot += q[sz((bh * T + t) * d + i)] * kr[sz((bh * T + t2) * d + i)];
        p[t2] = dot * scale;
        m = std::max(m, p[t2]);
      }
      double z = 0;
      for (std::int64_t t2 = 0; t2 <= t; ++t2) z += std::exp(p[t2] - m);
      for (std::int64_t t2 = 0; t2 < T; ++t2) p[t2] = t2 <= t ? std::exp(p[t2] - m) / z : 0.0;
      r.lse[sz(bh * T + t)] = m + std::log(z);
    }
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t i = 0; i < d; ++i) {
          double acc = 0;
          for (std::int64_t t2 = 0; t2 < T; ++t2)
            acc += P[sz(((b * H + h) * T + t) * T + t2)] * vr[sz(((b * H + h) * T + t2) * d + i)];
          r.out[sz((b * T + t) * H * d + h * d + i)] = acc;
        }
  return r;
}

struct attention_case {
  const char* name;
  attention_shape s;
};
}  // namespace

TEST_CASE("attention (MHA, GQA, MQA, custom scale): dqkv matches finite differences; forward, lse, causality") {
  const attention_case cases[] = {
      {"MHA heads 2 kv 2 d 4", {.batch = 2, .seq = 5, .heads = 2, .kv_heads = 2, .head_dim = 4}},
      {"GQA heads 4 kv 2 d 9", {.batch = 2, .seq = 5, .heads = 4, .kv_heads = 2, .head_dim = 9}},
      {"MQA heads 4 kv 1 d 4", {.batch = 2, .seq = 5, .heads = 4, .kv_heads = 1, .head_dim = 4}},
      {"GQA scale 0.3", {.batch = 1, .seq = 4, .heads = 4, .kv_heads = 2, .head_dim = 4, .scale = 0.3}},
  };
  for (const attention_case& c : cases) {
    const attention_shape& s = c.s;
    const char* name = c.name;
    CAPTURE(name);
    const std::int64_t B = s.batch, T = s.seq, W = s.row_width(), OW = s.q_width();
    vec qkv = randn(sz(B * T * W), 41), g = randn(sz(B * T * OW), 42);
    vec out(sz(B * T * OW)), lse(sz(B * s.heads * T));
    auto loss = [&] {
      k::attention_forward(host{}, out.data(), lse.data(), qkv.data(), s);
      return weighted_sum(g, out);
    };
    loss();

    {  // forward and lse against the naive reference with repeated K/V and full probabilities
      const attention_reference ref = naive_attention(qkv, s);
      double out_err = 0, lse_err = 0;
      for (std::size_t i = 0; i < out.size(); ++i) out_err = std::max(out_err, std::fabs(out[i] - ref.out[i]));
      for (std::size_t i = 0; i < lse.size(); ++i) lse_err = std::max(lse_err, std::fabs(lse[i] - ref.lse[i]));
      INFO("max |out - ref| = ", out_err, ", max |lse - ref| = ", lse_err);
      CHECK(out_err <= 1e-14);
      CHECK(lse_err <= 1e-14);
    }

    vec dqkv(qkv.size());
    k::attention_backward(host{}, dqkv.data(), g.data(), qkv.data(), lse.data(), out.data(), s);
    const std::string what = std::string("attention dqkv, ") + name;
    check_gradient(what.c_str(), dqkv, qkv, loss);
    loss();  // the differences leave a perturbed out and lse behind
    vec dqkv2(dqkv.size(), std::numeric_limits<double>::quiet_NaN());  // written, not read
    k::attention_backward(host{}, dqkv2.data(), g.data(), qkv.data(), lse.data(), out.data(), s);
    CHECK(dqkv2 == dqkv);

    {  // changing every part of a later token leaves earlier outputs bit-identical
      const std::int64_t b = B - 1, t_changed = 2;
      const vec before = out, saved = qkv;
      for (std::int64_t c = 0; c < W; ++c) qkv[sz((b * T + t_changed) * W + c)] += 0.75;
      loss();
      for (std::int64_t bb = 0; bb < B; ++bb)
        for (std::int64_t t = 0; t < T; ++t) {
          bool same = true;
          for (std::int64_t c = 0; c < OW; ++c)
            same = same && out[sz((bb * T + t) * OW + c)] == before[sz((bb * T + t) * OW + c)];
          if (bb == b && t >= t_changed) CHECK_FALSE(same);
          else CHECK(same);
        }
      qkv = saved;
    }
  }
}

TEST_CASE("attention: the same bits with 1, 2 and 3 OpenMP threads (GQA and MQA, float and bf16)") {
  // Large enough for the kernels' parallel branches: B·H·T·T·d = 175,232 > 65,536.
  const attention_shape shapes[] = {{.batch = 2, .seq = 37, .heads = 4, .kv_heads = 2, .head_dim = 16},
                                    {.batch = 3, .seq = 37, .heads = 4, .kv_heads = 1, .head_dim = 12}};
  for (const auto& s : shapes) {
    CAPTURE(s.kv_heads);
    const vec qkv = randn(sz(s.batch * s.seq * s.row_width()), 51), dy = randn(sz(s.batch * s.seq * s.q_width()), 52);
    auto run = [&]<class T>(T, int threads) {
      omp_threads scope(threads);
      std::vector<T> x(qkv.size()), g(dy.size()), out(dy.size()), dx(qkv.size());
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = convert<T>(qkv[i]);
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = convert<T>(dy[i]);
      std::vector<strata::acc_t<T>> lse(sz(s.batch * s.heads * s.seq));
      k::attention_forward(host{}, out.data(), lse.data(), x.data(), s);
      k::attention_backward(host{}, dx.data(), g.data(), x.data(), lse.data(), out.data(), s);
      return std::tuple{out, lse, dx};
    };
    for (int threads : {2, 3}) {
      CAPTURE(threads);
      const auto [o1, l1, d1] = run(float{}, 1);
      const auto [o2, l2, d2] = run(float{}, threads);
      CHECK(bit_identical(o1, o2));
      CHECK(bit_identical(l1, l2));
      CHECK(bit_identical(d1, d2));
      const auto [b1, bl1, bd1] = run(bf16{}, 1);
      const auto [b2, bl2, bd2] = run(bf16{}, threads);
      CHECK(bit_identical(b1, b2));
      CHECK(bit_identical(bl1, bl2));
      CHECK(bit_identical(bd1, bd2));
    }
  }
}

TEST_CASE("attention: the GPT-2 overloads are multi-head attention with one logsumexp per row") {
  const std::int64_t B = 2, T = 6, C = 12, NH = 3;
  const attention_shape s = attention_shape::multi_head(B, T, C, NH);
  const vec qkv = randn(sz(B * T * 3 * C), 61), g = randn(sz(B * T * C), 62);
  vec out_old(sz(B * T * C)), att(sz(B * NH * T)), out_new(out_old.size()), lse(att.size());
  k::attention_forward(host{}, out_old.data(), att.data(), qkv.data(), B, T, C, NH);
  k::attention_forward(host{}, out_new.data(), lse.data(), qkv.data(), s);
  CHECK(out_old == out_new);
  CHECK(att == lse);
  vec d_old(qkv.size()), d_old_no_out(qkv.size()), d_new(qkv.size());
  k::attention_backward(host{}, d_old.data(), g.data(), qkv.data(), att.data(), B, T, C, NH, out_old.data());
  k::attention_backward(host{}, d_old_no_out.data(), g.data(), qkv.data(), att.data(), B, T, C, NH);
  k::attention_backward(host{}, d_new.data(), g.data(), qkv.data(), lse.data(), out_new.data(), s);
  CHECK(d_old == d_new);
  CHECK(d_old_no_out == d_new);  // in double the recomputed output is the same
  CHECK_THROWS_WITH_AS(k::attention_forward(host{}, out_old.data(), att.data(), qkv.data(), B, T, 10, 3),
                       "attention_forward: heads = 3 does not divide channels C = 10", strata::error);
  attention_shape bad = s;
  bad.kv_heads = 2;  // does not divide 3 heads
  CHECK_THROWS_AS(k::attention_forward(host{}, out_new.data(), lse.data(), qkv.data(), bad), strata::error);
}

TEST_CASE_TEMPLATE("attention in float, bf16 and fp16 is close to double (GQA)", T, float, bf16, fp16) {
  const attention_shape s{.batch = 2, .seq = 24, .heads = 4, .kv_heads = 2, .head_dim = 16};
  // Inputs the narrow type holds exactly, so the comparison measures the kernel alone.
  vec qkv = randn(sz(s.batch * s.seq * s.row_width()), 71), dy = randn(sz(s.batch * s.seq * s.q_width()), 72);
  for (double& x : qkv) x = convert<double>(convert<T>(x));
  for (double& x : dy) x = convert<double>(convert<T>(x));
  vec out(dy.size()), lse(sz(s.batch * s.heads * s.seq)), dqkv(qkv.size());
  k::attention_forward(host{}, out.data(), lse.data(), qkv.data(), s);
  k::attention_backward(host{}, dqkv.data(), dy.data(), qkv.data(), lse.data(), out.data(), s);

  std::vector<T> x(qkv.size()), g(dy.size()), o(dy.size()), dx(qkv.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = convert<T>(qkv[i]);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = convert<T>(dy[i]);
  std::vector<float> l(lse.size());
  k::attention_forward(host{}, o.data(), l.data(), x.data(), s);
  k::attention_backward(host{}, dx.data(), g.data(), x.data(), l.data(), o.data(), s);
  // float: fp32 sums of a few dozen terms, ~1e-7; bf16/fp16: one rounding of each output (u =
  // 2^-8, 2^-11), and in backward the rounded `out` inside D = rowsum(dout · out) as well.
  const double u = std::is_same_v<T, float> ? 1e-6 : std::is_same_v<T, bf16> ? 1.0 / 256 : 1.0 / 2048;
  const double out_err = tensor_relative_error(o, out), lse_err = tensor_relative_error(l, lse),
               d_err = tensor_relative_error(dx, dqkv);
  if (std::getenv("STRATA_TEST_VERBOSE"))
    std::printf("  %s attention vs double: out %.2e lse %.2e dqkv %.2e\n", strata::dtype_name<T>(), out_err, lse_err,
                d_err);
  INFO("out ", out_err, ", lse ", lse_err, ", dqkv ", d_err);
  CHECK(out_err <= 2 * u);
  CHECK(lse_err <= 1e-6);
  CHECK(d_err <= 4 * u);
}
