// The kernels behind the model variants (GPT-NeoX, Pythia and others): exact GELU, rotary
// embedding over part of each head, the per-head fused QKV layout, and the feed-forward
// activations (kernels/activation.hpp), element-wise and gated.
//
// Backwards against float64 fourth-order finite differences (finite_difference.hpp: random
// inputs, a random weighting g of the output, L = sum(g * out); max relative error <= 1e-6 with a
// 1e-3 floor). Forwards against direct float64 references written from the definitions: x·Φ(x)
// through std::erf, rotate-half on the first r elements, the layout's index formula.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "strata/kernels/all.hpp"
#include "finite_difference.hpp"
#include "rope_reference.hpp"

namespace {
namespace k = strata::kernels;
using k::attention_shape;
using strata::bf16;
using strata::convert;
using strata::gelu_form;
using strata::host;
using namespace finite_difference;
std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

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
}  // namespace

// --- exact GELU ---------------------------------------------------------------------------------

TEST_CASE("exact gelu: x·Φ(x) through erf; gradient matches finite differences; tanh stays the default") {
  const std::int64_t n = 41;
  vec inp = randn(sz(n), 31, 2.5), g = randn(sz(n), 32), out(sz(n));
  k::gelu_forward(host{}, out.data(), inp.data(), n, gelu_form::exact);
  double worst = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = inp[sz(i)], ref = 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    worst = std::max(worst, std::fabs(out[sz(i)] - ref));
  }
  INFO("max |gelu_exact - x·(1 + erf(x/√2))/2| = ", worst);
  CHECK(worst <= 1e-15);

  auto loss = [&] {
    k::gelu_forward(host{}, out.data(), inp.data(), n, gelu_form::exact);
    return weighted_sum(g, out);
  };
  vec dinp(sz(n));
  k::gelu_backward(host{}, dinp.data(), inp.data(), g.data(), n, gelu_form::exact);
  check_gradient("exact gelu dinp", dinp, inp, loss);
  vec dinp2(sz(n), std::numeric_limits<double>::quiet_NaN());  // written, not accumulated into
  k::gelu_backward(host{}, dinp2.data(), inp.data(), g.data(), n, gelu_form::exact);
  CHECK(dinp2 == dinp);

  // The two forms differ where Pythia's gradients noticed (|x| ~ 1-3): by 4.4e-4 at x = 2.5.
  vec x{2.5}, tanh_form(1), exact(1);
  k::gelu_forward(host{}, tanh_form.data(), x.data(), 1);
  k::gelu_forward(host{}, exact.data(), x.data(), 1, gelu_form::exact);
  CHECK(std::fabs(tanh_form[0] - exact[0]) > 4e-4);
  CHECK(exact[0] == doctest::Approx(2.4844758366855597).epsilon(1e-15));
  // Far on the negative side Φ comes from erfc: no cancellation, the value stays relative-exact.
  vec far{-10.0}, far_out(1);
  k::gelu_forward(host{}, far_out.data(), far.data(), 1, gelu_form::exact);
  CHECK(far_out[0] == doctest::Approx(-10.0 * 0.5 * std::erfc(10.0 / std::sqrt(2.0))).epsilon(1e-13));
  CHECK(far_out[0] != 0.0);
}

TEST_CASE("exact gelu fused with the projection: linear_gelu_forward and bias_gelu_backward") {
  const std::int64_t N = 5, C = 6, OC = 7;
  vec inp = randn(sz(N * C), 41), weight = randn(sz(OC * C), 42, 0.5), bias = randn(sz(OC), 43, 0.5);
  vec g = randn(sz(N * OC), 44), out(sz(N * OC)), pre(sz(N * OC));
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  auto loss = [&] {
    k::linear_gelu_forward(host{}, ws, out.data(), pre.data(), inp.data(), weight.data(), bias.data(), N, C, OC,
                           gelu_form::exact);
    return weighted_sum(g, out);
  };
  loss();
  // Unfused: the projection, then exact GELU: the same values.
  vec pre2(sz(N * OC)), out2(sz(N * OC));
  k::linear_forward(host{}, ws, pre2.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  k::gelu_forward(host{}, out2.data(), pre2.data(), N * OC, gelu_form::exact);
  for (std::size_t i = 0; i < out.size(); ++i) CHECK(out[i] == doctest::Approx(out2[i]).epsilon(1e-14));

  vec dpre(sz(N * OC)), dbias(sz(OC), 0.0), dinp(sz(N * C)), dweight(sz(OC * C), 0.0);
  k::bias_gelu_backward(host{}, dpre.data(), dbias.data(), pre.data(), g.data(), N, OC, gelu_form::exact);
  k::linear_backward(host{}, ws, dinp.data(), dweight.data(), nullptr, dpre.data(), inp.data(), weight.data(), N, C,
                     OC);
  check_gradient("exact linear_gelu dinp", dinp, inp, loss);
  check_gradient("exact linear_gelu dweight", dweight, weight, loss);
  check_gradient("exact linear_gelu dbias", dbias, bias, loss);
}

// --- partial rotary (against rope_reference.hpp) --------------------------------------------------

TEST_CASE("partial rotary: the first r elements of each q and k head turn, the rest are kept") {
  const attention_shape s{.batch = 2, .seq = 5, .heads = 2, .kv_heads = 2, .head_dim = 16};
  const double theta = 100.0;
  const std::int64_t n = s.batch * s.seq * s.row_width();
  const vec qkv = randn(sz(n), 51), g = randn(sz(n), 52);
  for (std::int64_t r : {std::int64_t(4), std::int64_t(8), std::int64_t(16)}) {
    for (std::int64_t pos0 : {std::int64_t(0), std::int64_t(6)}) {
      vec y = qkv;
      k::rope_forward(host{}, y.data(), s, theta, pos0, r);
      const vec ref = rope_test::reference(qkv, s, theta, pos0, r);
      double worst = 0;
      for (std::size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::fabs(y[i] - ref[i]));
      INFO("r = ", r, ", pos0 = ", pos0, ": max |rope - reference| = ", worst);
      CHECK(worst <= 1e-14);
      if (pos0 == 6) CHECK(y != qkv);  // it did turn something
    }
    vec x = qkv, y(x.size());
    auto loss = [&] {
      y = x;
      k::rope_forward(host{}, y.data(), s, theta, 3, r);
      return weighted_sum(g, y);
    };
    vec dx = g;
    k::rope_backward(host{}, dx.data(), s, theta, 3, r);
    check_gradient("partial rope dqkv", dx, x, loss);
  }
  // r = d is the whole-head rotation, the default.
  vec whole = qkv, full = qkv;
  k::rope_forward(host{}, whole.data(), s, theta, 2);
  k::rope_forward(host{}, full.data(), s, theta, 2, s.head_dim);
  CHECK(whole == full);
  // Odd, or wider than the head: refused, naming the number.
  vec q = qkv;
  CHECK_THROWS_WITH_AS(k::rope_forward(host{}, q.data(), s, theta, 0, 5),
                       doctest::Contains("rotary size must be even and within the head (16), got 5"), strata::error);
  CHECK_THROWS_AS(k::rope_backward(host{}, q.data(), s, theta, 0, 18), strata::error);
}

TEST_CASE("partial rotary in float and bf16 is the double rotation rounded") {
  const attention_shape s{.batch = 1, .seq = 32, .heads = 2, .kv_heads = 2, .head_dim = 16};
  const vec x = randn(sz(s.seq * s.row_width()), 53);
  vec ref = x;
  k::rope_forward(host{}, ref.data(), s, 10000.0, 500, 4);
  std::vector<float> xf(x.begin(), x.end());
  std::vector<bf16> xb(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xb[i] = convert<bf16>(x[i]);
  k::rope_forward(host{}, xf.data(), s, 10000.0, 500, 4);
  k::rope_forward(host{}, xb.data(), s, 10000.0, 500, 4);
  CHECK(tensor_relative_error(xf, ref) <= 1e-6);
  CHECK(tensor_relative_error(xb, ref) <= 2.0 / 256);
}

// --- per-head fused QKV -------------------------------------------------------------------------

TEST_CASE("qkv layout: per-head [H, 3, d] to grouped [3, H, d] by the index formula, and back") {
  const std::int64_t rows = 3, H = 4, d = 5, W = 3 * H * d;
  vec per_head(sz(rows * W));
  for (std::size_t i = 0; i < per_head.size(); ++i) per_head[i] = double(i);
  vec grouped(per_head.size(), -1.0), back(per_head.size(), -1.0);
  k::qkv_from_per_head(host{}, grouped.data(), per_head.data(), rows, H, d);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t part = 0; part < 3; ++part)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < d; ++i)
          CHECK(grouped[sz(r * W + (part * H + h) * d + i)] == per_head[sz(r * W + (3 * h + part) * d + i)]);
  k::qkv_to_per_head(host{}, back.data(), grouped.data(), rows, H, d);
  CHECK(back == per_head);
  // A permutation: its gradient is the inverse permutation, <P x, g> = <x, Pᵀ g>.
  const vec x = randn(sz(rows * W), 61), g = randn(sz(rows * W), 62);
  vec px(x.size()), ptg(x.size());
  k::qkv_from_per_head(host{}, px.data(), x.data(), rows, H, d);
  k::qkv_to_per_head(host{}, ptg.data(), g.data(), rows, H, d);
  CHECK(weighted_sum(g, px) == doctest::Approx(weighted_sum(ptg, x)).epsilon(1e-14));
  CHECK_THROWS_AS(k::qkv_from_per_head(host{}, grouped.data(), per_head.data(), rows, 0, d), strata::error);
}

// --- activations, element-wise and gated ----------------------------------------------------------

namespace {
// Random inputs kept 0.05 away from 0, where ReLU's derivative jumps.
vec away_from_zero(std::size_t n, std::uint64_t stream) {
  vec v = randn(n, stream, 2.0);
  for (auto& x : v) x = x < 0 ? x - 0.05 : x + 0.05;
  return v;
}
double reference(strata::activation a, double x) {
  switch (a) {
    case strata::activation::gelu_tanh:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case strata::activation::gelu_exact: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case strata::activation::silu: return x / (1 + std::exp(-x));
    case strata::activation::relu: return x > 0 ? x : 0;
    case strata::activation::relu_squared: return x > 0 ? x * x : 0;
  }
  return 0;
}
constexpr strata::activation all_activations[] = {strata::activation::gelu_tanh, strata::activation::gelu_exact,
                                                  strata::activation::silu, strata::activation::relu,
                                                  strata::activation::relu_squared};
}  // namespace

TEST_CASE("activations: each one's value from its definition, its backward against finite differences") {
  const std::int64_t n = 37;
  for (const auto a : all_activations) {
    CAPTURE(std::string(strata::activation_name(a)));
    vec x = away_from_zero(sz(n), 71), g = randn(sz(n), 72), y(sz(n));
    k::activation_forward(host{}, y.data(), x.data(), n, a);
    double worst = 0;
    for (std::int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(y[sz(i)] - reference(a, x[sz(i)])));
    CHECK(worst <= 1e-13);
    auto loss = [&] {
      k::activation_forward(host{}, y.data(), x.data(), n, a);
      return weighted_sum(g, y);
    };
    vec dx(sz(n), std::numeric_limits<double>::quiet_NaN());  // written, not read
    k::activation_backward(host{}, dx.data(), x.data(), g.data(), n, a);
    check_gradient(strata::activation_name(a), dx, x, loss);
  }
  // The tanh and exact GELU kernels behind a projection's fused GELU give the same values.
  const vec x = randn(41, 73, 2.0);
  vec ours(x.size()), theirs(x.size());
  k::activation_forward(host{}, ours.data(), x.data(), 41, strata::activation::gelu_exact);
  k::gelu_forward(host{}, theirs.data(), x.data(), 41, strata::gelu_form::exact);
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(ours[i] == doctest::Approx(theirs[i]).epsilon(1e-14));
}

TEST_CASE("gated activations (GLU): a(z)·u and both halves' gradients against finite differences") {
  const std::int64_t N = 5, H = 7;
  for (const auto a : all_activations) {
    CAPTURE(std::string(strata::activation_name(a)));
    vec gu = away_from_zero(sz(N * 2 * H), 81), g = randn(sz(N * H), 82), y(sz(N * H));
    k::glu_forward(host{}, y.data(), gu.data(), N, H, a);
    double worst = 0;
    for (std::int64_t r = 0; r < N; ++r)
      for (std::int64_t c = 0; c < H; ++c)
        worst = std::max(worst,
                         std::fabs(y[sz(r * H + c)] - reference(a, gu[sz(r * 2 * H + c)]) * gu[sz(r * 2 * H + H + c)]));
    CHECK(worst <= 1e-13);
    auto loss = [&] {
      k::glu_forward(host{}, y.data(), gu.data(), N, H, a);
      return weighted_sum(g, y);
    };
    vec dgu(sz(N * 2 * H), std::numeric_limits<double>::quiet_NaN());
    k::glu_backward(host{}, dgu.data(), g.data(), gu.data(), N, H, a);
    check_gradient(strata::activation_name(a), dgu, gu, loss);
  }
  // SiLU's GLU is the SwiGLU kernel.
  const vec gu = randn(sz(N * 2 * H), 83, 2.0);
  vec glu(sz(N * H)), swiglu(sz(N * H));
  k::glu_forward(host{}, glu.data(), gu.data(), N, H, strata::activation::silu);
  k::swiglu_forward(host{}, swiglu.data(), gu.data(), N, H);
  CHECK(glu == swiglu);
}
