// Finite-difference checks of every host kernel's backward pass, in double.
//
// For each op: random inputs and a random output weighting g, the scalar L = sum(g * out),
// the analytic gradients from the backward kernel (dout = g), and a numerical gradient of L
// for every element of every differentiable input. Each backward is also called a second time,
// on parameter gradients holding the first call's (they must double: accumulated) and on input
// gradients holding NaN (they must come out equal: written, never read).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <vector>

#include "strata/core/init.hpp"
#include "strata/core/memory.hpp"
#include "strata/kernels/all.hpp"
#include "finite_difference.hpp"
#include "max_error.hpp"

namespace {

namespace k = strata::kernels;
using strata::host;
using namespace finite_difference;

}  // namespace

TEST_CASE("linear: gradients of inp, weight, bias match finite differences") {
  const std::int64_t N = 10, C = 8, OC = 12;
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  vec inp = randn(N * C, 1), weight = randn(OC * C, 2, 0.5), bias = randn(OC, 3), g = randn(N * OC, 4);
  vec out(N * OC);
  auto loss = [&] {
    k::linear_forward(host{}, ws, out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    return weighted_sum(g, out);
  };
  loss();
  auto backward = [&](vec& dinp, vec& dweight, vec& dbias) {
    k::linear_backward(host{}, ws, dinp.data(), dweight.data(), dbias.data(), g.data(), inp.data(), weight.data(), N, C,
                       OC);
  };
  vec dinp(N * C), dweight(OC * C), dbias(OC);
  backward(dinp, dweight, dbias);
  check_gradient("linear dinp", dinp, inp, loss);
  check_gradient("linear dweight", dweight, weight, loss);
  check_gradient("linear dbias", dbias, bias, loss);
  loss();  // the differences leave a perturbed output behind

  // The parameters' gradients accumulate; the input's is written (its old values, NaN here, are
  // not read).
  vec dinp2(dinp.size(), std::numeric_limits<double>::quiet_NaN()), dweight2 = dweight, dbias2 = dbias;
  backward(dinp2, dweight2, dbias2);
  CHECK(dinp2 == dinp);
  check_doubled("linear dweight", dweight, dweight2);
  check_doubled("linear dbias", dbias, dbias2);

  {  // null dinp and dbias are skipped; dweight is unchanged
    vec dweight3(OC * C);
    k::linear_backward(host{}, ws, nullptr, dweight3.data(), nullptr, g.data(), inp.data(), weight.data(), N, C, OC);
    CHECK(dweight3 == dweight);
  }
  {  // no bias: out is the plain product
    vec out_nb(N * OC);
    k::linear_forward(host{}, ws, out_nb.data(), inp.data(), weight.data(), nullptr, N, C, OC);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t o = 0; o < OC; ++o) CHECK(out_nb[n * OC + o] == doctest::Approx(out[n * OC + o] - bias[o]));
  }
}

TEST_CASE("layernorm: gradients of inp, weight, bias match finite differences") {
  const std::int64_t N = 10, C = 8;
  vec inp = randn(N * C, 11, 1.5, 0.3), weight = randn(C, 12, 0.3, 1.0), bias = randn(C, 13, 0.2), g = randn(N * C, 14);
  vec out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    k::layernorm_forward(host{}, out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C,
                         1e-5);
    return weighted_sum(g, out);
  };
  loss();
  auto backward = [&](vec& dinp, vec& dweight, vec& dbias) {
    k::layernorm_backward(host{}, dinp.data(), dweight.data(), dbias.data(), g.data(), inp.data(), weight.data(),
                          mean.data(), rstd.data(), N, C);
  };
  vec dinp(N * C), dweight(C), dbias(C);
  backward(dinp, dweight, dbias);
  check_gradient("layernorm dinp", dinp, inp, loss);
  check_gradient("layernorm dweight", dweight, weight, loss);
  check_gradient("layernorm dbias", dbias, bias, loss);

  vec dinp2(dinp.size(), std::numeric_limits<double>::quiet_NaN()), dweight2 = dweight, dbias2 = dbias;
  backward(dinp2, dweight2, dbias2);
  CHECK(dinp2 == dinp);
  check_doubled("layernorm dweight", dweight, dweight2);
  check_doubled("layernorm dbias", dbias, dbias2);

  // Each output row is normalised: mean 0 and variance 1 before the affine part.
  for (std::int64_t n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (std::int64_t c = 0; c < C; ++c) m += inp[n * C + c];
    m /= double(C);
    for (std::int64_t c = 0; c < C; ++c) v += (inp[n * C + c] - m) * (inp[n * C + c] - m);
    v /= double(C);
    CHECK(mean[n] == doctest::Approx(m).epsilon(1e-14));
    CHECK(rstd[n] == doctest::Approx(1.0 / std::sqrt(v + 1e-5)).epsilon(1e-14));
  }
}

TEST_CASE("gelu: gradient matches finite differences") {
  const std::int64_t n = 41;
  vec inp = randn(n, 21, 2.0), g = randn(n, 22), out(n);
  auto loss = [&] {
    k::gelu_forward(host{}, out.data(), inp.data(), n);
    return weighted_sum(g, out);
  };
  loss();
  vec dinp(n);
  k::gelu_backward(host{}, dinp.data(), inp.data(), g.data(), n);
  check_gradient("gelu dinp", dinp, inp, loss);
  vec dinp2(n, std::numeric_limits<double>::quiet_NaN());  // written, not accumulated into
  k::gelu_backward(host{}, dinp2.data(), inp.data(), g.data(), n);
  CHECK(dinp2 == dinp);

  // Spot values of the tanh form: gelu(0) = 0, gelu(1) = 0.8411919906082768.
  vec x{0.0, 1.0, -3.0}, y(3);
  k::gelu_forward(host{}, y.data(), x.data(), 3);
  CHECK(y[0] == 0.0);
  CHECK(y[1] == doctest::Approx(0.8411919906082768).epsilon(1e-15));
  CHECK(y[2] == doctest::Approx(-0.0036373920817729).epsilon(1e-12));
}

// The MLP's first projection with its GELU (linear_gelu_forward) and the fused backward
// (bias_gelu_backward, then linear_backward without the bias): finite differences through both,
// and the same numbers as the unfused kernels. 150 rows: three chunks of the bias sum.
TEST_CASE("linear_gelu_forward and bias_gelu_backward: gradients match finite differences") {
  const std::int64_t N = 150, C = 6, OC = 10;
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  vec inp = randn(N * C, 41), weight = randn(OC * C, 42, 0.5), bias = randn(OC, 43), g = randn(N * OC, 44);
  vec out(N * OC), pre(N * OC);
  auto loss = [&] {
    k::linear_gelu_forward(host{}, ws, out.data(), pre.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    return weighted_sum(g, out);
  };
  loss();
  vec unfused_pre(N * OC), unfused_out(N * OC);
  k::linear_forward(host{}, ws, unfused_pre.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  k::gelu_forward(host{}, unfused_out.data(), unfused_pre.data(), N * OC);
  CHECK(strata_test::max_diff(pre, unfused_pre) <= 1e-14);
  CHECK(strata_test::max_diff(out, unfused_out) <= 1e-14);

  vec dpre(N * OC, std::numeric_limits<double>::quiet_NaN()), dinp(N * C), dweight(OC * C), dbias(OC);
  k::bias_gelu_backward(host{}, dpre.data(), dbias.data(), pre.data(), g.data(), N, OC);
  k::linear_backward(host{}, ws, dinp.data(), dweight.data(), nullptr, dpre.data(), inp.data(), weight.data(), N, C,
                     OC);
  check_gradient("linear_gelu dinp", dinp, inp, loss);
  check_gradient("linear_gelu dweight", dweight, weight, loss);
  check_gradient("linear_gelu dbias", dbias, bias, loss);
  loss();

  // dpre is gelu_backward's, bit for bit; the bias gradient accumulates, and equals the column
  // sums linear_backward would take of dpre.
  vec unfused_dpre(N * OC);
  k::gelu_backward(host{}, unfused_dpre.data(), pre.data(), g.data(), N * OC);
  CHECK(dpre == unfused_dpre);
  vec dbias2 = dbias;
  k::bias_gelu_backward(host{}, dpre.data(), dbias2.data(), pre.data(), g.data(), N, OC);
  check_doubled("linear_gelu dbias", dbias, dbias2);
  vec column_sums(OC), scratch_dinp(N * C), scratch_dweight(OC * C);
  k::linear_backward(host{}, ws, scratch_dinp.data(), scratch_dweight.data(), column_sums.data(), dpre.data(),
                     inp.data(), weight.data(), N, C, OC);
  CHECK(strata_test::max_diff(dbias, column_sums) <= 1e-12);

  // Without a bias: GELU of the plain product, and no bias gradient.
  k::linear_gelu_forward(host{}, ws, out.data(), pre.data(), inp.data(), weight.data(), nullptr, N, C, OC);
  k::linear_forward(host{}, ws, unfused_pre.data(), inp.data(), weight.data(), nullptr, N, C, OC);
  CHECK(strata_test::max_diff(pre, unfused_pre) <= 1e-14);
  k::bias_gelu_backward(host{}, dpre.data(), nullptr, pre.data(), g.data(), N, OC);
  k::gelu_backward(host{}, unfused_dpre.data(), pre.data(), g.data(), N * OC);
  CHECK(dpre == unfused_dpre);
}

TEST_CASE("residual: gradients of both inputs match finite differences") {
  const std::int64_t n = 23;
  vec a = randn(n, 31), b = randn(n, 32), g = randn(n, 33), out(n);
  auto loss = [&] {
    k::residual_forward(host{}, out.data(), a.data(), b.data(), n);
    return weighted_sum(g, out);
  };
  loss();
  vec da(n), db(n);
  k::residual_backward(host{}, da.data(), db.data(), g.data(), n);
  check_gradient("residual da", da, a, loss);
  check_gradient("residual db", db, b, loss);
  vec da2(n, std::numeric_limits<double>::quiet_NaN()), db2 = da2;  // written, not read
  k::residual_backward(host{}, da2.data(), db2.data(), g.data(), n);
  CHECK(da2 == da);
  CHECK(db2 == db);
}

TEST_CASE("attention: gradient of qkv matches finite differences; masking and causality") {
  const std::int64_t B = 2, T = 5, C = 8, NH = 2, C3 = 3 * C;
  vec qkv = randn(B * T * C3, 41), g = randn(B * T * C, 42);
  vec out(B * T * C), att(B * NH * T);  // one logsumexp per query row
  auto loss = [&] {
    k::attention_forward(host{}, out.data(), att.data(), qkv.data(), B, T, C, NH);
    return weighted_sum(g, out);
  };
  loss();
  vec dqkv(B * T * C3);
  k::attention_backward(host{}, dqkv.data(), g.data(), qkv.data(), att.data(), B, T, C, NH);
  check_gradient("attention dqkv", dqkv, qkv, loss);
  loss();  // the differences leave a perturbed out and att behind
  vec dqkv2(dqkv.size(), std::numeric_limits<double>::quiet_NaN());  // written, not read
  k::attention_backward(host{}, dqkv2.data(), g.data(), qkv.data(), att.data(), B, T, C, NH);
  CHECK(dqkv2 == dqkv);
  {  // the forward's output, last: without it backward redoes the forward (the same in double)
    vec with_out(B * T * C3), without_out(B * T * C3);
    k::attention_backward(host{}, with_out.data(), g.data(), qkv.data(), att.data(), B, T, C, NH, out.data());
    k::attention_backward(host{}, without_out.data(), g.data(), qkv.data(), att.data(), B, T, C, NH);
    CHECK(with_out == without_out);
  }

  {  // att holds each row's logsumexp of the scaled causal scores, log sum_{t2 <= t} exp(q.k / sqrt(hs))
    const std::int64_t hs = C / NH;
    for (std::int64_t r = 0; r < B * NH * T; ++r) {
      const std::int64_t t = r % T, h = (r / T) % NH, b = r / (T * NH);
      long double z = 0;
      for (std::int64_t t2 = 0; t2 <= t; ++t2) {
        double dot = 0;
        for (std::int64_t i = 0; i < hs; ++i)
          dot += qkv[(b * T + t) * C3 + h * hs + i] * qkv[(b * T + t2) * C3 + C + h * hs + i];
        z += std::exp((long double)(dot / std::sqrt(double(hs))));
      }
      CHECK(att[r] == doctest::Approx(double(std::log(z))).epsilon(1e-14));
    }
  }
  {  // changing a later position's k and v leaves earlier outputs bit-identical
    const std::int64_t b = 1, t_changed = 3;
    const vec before = out;
    for (std::int64_t c = C; c < C3; ++c) qkv[(b * T + t_changed) * C3 + c] += 0.75;
    loss();
    for (std::int64_t bb = 0; bb < B; ++bb)
      for (std::int64_t t = 0; t < T; ++t) {
        bool same = true;
        for (std::int64_t c = 0; c < C; ++c) same = same && out[(bb * T + t) * C + c] == before[(bb * T + t) * C + c];
        if (bb == b && t >= t_changed) CHECK_FALSE(same);
        else CHECK(same);
      }
  }
  {  // a single position attends only to itself: out = its v
    vec out1(C), att1(NH), q1(C3);
    for (std::int64_t c = 0; c < C3; ++c) q1[c] = qkv[c];
    k::attention_forward(host{}, out1.data(), att1.data(), q1.data(), 1, 1, C, NH);
    for (std::int64_t c = 0; c < C; ++c) CHECK(out1[c] == q1[2 * C + c]);
  }
}

TEST_CASE("embedding: gradients of wte and wpe with repeated tokens match finite differences") {
  const std::int64_t B = 2, T = 5, C = 8, V = 11, maxT = 7;
  const std::vector<std::int32_t> tokens{3, 3, 7, 0, 3, 10, 7, 7, 1, 3};
  vec wte = randn(V * C, 51), wpe = randn(maxT * C, 52), g = randn(B * T * C, 53), out(B * T * C);
  auto loss = [&] {
    k::embedding_forward(host{}, out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, V);
    return weighted_sum(g, out);
  };
  loss();
  vec dwte(V * C), dwpe(maxT * C);
  k::embedding_backward(host{}, dwte.data(), dwpe.data(), g.data(), tokens.data(), B, T, C);
  check_gradient("embedding dwte", dwte, wte, loss);
  check_gradient("embedding dwpe", dwpe, wpe, loss);
  vec dwte2 = dwte, dwpe2 = dwpe;
  k::embedding_backward(host{}, dwte2.data(), dwpe2.data(), g.data(), tokens.data(), B, T, C);
  check_doubled("embedding dwte", dwte, dwte2);
  check_doubled("embedding dwpe", dwpe, dwpe2);

  // Rows of absent tokens and positions >= T get exactly nothing.
  for (std::int32_t v : {2, 4, 5, 6, 8, 9})
    for (std::int64_t c = 0; c < C; ++c) CHECK(dwte[v * C + c] == 0.0);
  for (std::int64_t t = T; t < maxT; ++t)
    for (std::int64_t c = 0; c < C; ++c) CHECK(dwpe[t * C + c] == 0.0);
}

TEST_CASE("cross-entropy: fused gradient matches finite differences of dloss * sum(losses)") {
  const std::int64_t N = 6, V = 11, Vp = 16;
  const double dloss = 1.0 / double(N);
  const std::vector<std::int32_t> targets{0, 10, 4, 4, 7, 2};
  vec logits = randn(N * Vp, 61, 2.0);
  for (std::int64_t i = 0; i < N; ++i)
    for (std::int64_t v = V; v < Vp; ++v) logits[i * Vp + v] = 1e30;  // padding must be ignored
  vec losses(N);
  auto loss = [&] {
    k::cross_entropy_forward(host{}, losses.data(), logits.data(), targets.data(), N, V, Vp);
    long double s = 0;
    for (double l : losses) s += l;
    return double(s) * dloss;
  };
  loss();
  const vec forward_losses = losses;

  vec dlogits = logits, fused_losses(N);
  k::cross_entropy_forward_backward(host{}, fused_losses.data(), dlogits.data(), targets.data(), N, V, Vp, dloss);
  CHECK(fused_losses == forward_losses);
  for (std::int64_t i = 0; i < N; ++i)
    for (std::int64_t v = V; v < Vp; ++v) CHECK(dlogits[i * Vp + v] == 0.0);

  // Differentiate with respect to the real columns only (the padding holds 1e30).
  vec real(N * V), real_grad(N * V);
  for (std::int64_t i = 0; i < N; ++i)
    for (std::int64_t v = 0; v < V; ++v) {
      real[i * V + v] = logits[i * Vp + v];
      real_grad[i * V + v] = dlogits[i * Vp + v];
    }
  auto loss_of_real = [&] {
    for (std::int64_t i = 0; i < N; ++i)
      for (std::int64_t v = 0; v < V; ++v) logits[i * Vp + v] = real[i * V + v];
    return loss();
  };
  check_gradient("cross_entropy dlogits", real_grad, real, loss_of_real);
  loss_of_real();  // the differences leave a perturbed row behind

  // Each row of the gradient sums to zero, and the loss is -log softmax[target].
  for (std::int64_t i = 0; i < N; ++i) {
    double row_sum = 0, max_l = -1e300, z = 0;
    for (std::int64_t v = 0; v < V; ++v) {
      row_sum += dlogits[i * Vp + v];
      max_l = std::max(max_l, logits[i * Vp + v]);
    }
    for (std::int64_t v = 0; v < V; ++v) z += std::exp(logits[i * Vp + v] - max_l);
    CHECK(std::fabs(row_sum) < 1e-15);
    CHECK(forward_losses[i] == doctest::Approx(max_l + std::log(z) - logits[i * Vp + targets[i]]).epsilon(1e-14));
  }
}
