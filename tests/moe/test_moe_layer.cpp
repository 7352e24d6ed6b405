// The mixture-of-experts layer (layers/moe.hpp) in float64 against central finite differences:
// its input and every parameter, with the load-balancing and z-losses in the objective, for
// SwiGLU and GELU experts, with and without renormalised weights, a shared expert, and a capacity
// that drops pairs. Also its statistics against a direct count, and its plan against its allocator.
//
// Objective: L = sum(r * y) + balance_coef · balance + z_coef · z, the two terms as the layer
// reports them (statistics()); the layer's backward takes their gradients itself.
// Error measure: max_i |analytic_i - numeric_i| over a tensor, divided by the largest gradient of
// the layer (an expert few tokens reach has small gradients, where the differences' rounding noise
// would dominate a per-tensor ratio), required <= 1e-7; an expert no token reaches gets exactly zero.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include <strata/strata.hpp>

namespace st = strata;
using P64 = st::policy<st::host, st::serial, st::fp64>;

namespace {

double max_difference(const std::vector<double>& analytic, const std::vector<double>& numeric) {
  double worst = 0;
  for (std::size_t i = 0; i < analytic.size(); ++i) worst = std::max(worst, std::abs(analytic[i] - numeric[i]));
  return worst;
}
double max_magnitude(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

std::vector<double> random_vector(std::size_t n, std::uint64_t stream, double scale = 1.0) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * st::counter_normal(77, stream, i);
  return v;
}

constexpr double fd_step = 1e-6;

void check_layer_gradients(const st::moe<P64>::config& cfg, std::int64_t B, std::int64_t T) {
  st::memory_ledger ledger;
  st::model_context<P64> ctx(ledger, st::seed{11});
  st::moe<P64> layer(st::module_scope<P64>(ctx, "mlp"), cfg);
  auto& params = ctx.params();
  params.materialize();
  // A wide router: the top-k choices sit far apart, so no finite-difference step changes them.
  for (const auto& e : params.entries())
    if (e.name == "mlp.router.weight")
      for (std::int64_t i = 0; i < e.numel; ++i) params.weights_data()[e.offset + i] *= 10.0;

  const std::int64_t C = cfg.channels;
  std::vector<double> x = random_vector(std::size_t(B * T * C), 1);
  const std::vector<double> r = random_vector(std::size_t(B * T * C), 2);
  std::vector<double> first_counts;
  auto loss = [&] {
    auto y = layer.forward({x.data(), {B, T, C}});
    double s = 0;
    for (std::int64_t i = 0; i < y.numel(); ++i) s += r[std::size_t(i)] * y.data[i];
    const auto row = layer.statistics();
    // The routing never changes under the steps: the same pairs per expert each time.
    const std::vector<double> counts(row.begin() + st::moe_row_tokens, row.end());
    if (first_counts.empty()) first_counts = counts;
    REQUIRE(counts == first_counts);
    return s + cfg.options.balance_coef * row[st::moe_row_balance] + cfg.options.z_coef * row[st::moe_row_z];
  };

  params.zero_grads();
  loss();
  st::buffer<double> dy(ledger, st::memory_category::activations, r.size());
  std::copy(r.begin(), r.end(), dy.data());
  st::buffer<double> dx = layer.backward(dy);
  const auto taken = ctx.auxiliary().take();
  const auto row = layer.statistics();
  CHECK(taken.objective ==
        doctest::Approx(cfg.options.balance_coef * row[st::moe_row_balance] + cfg.options.z_coef * row[st::moe_row_z]));

  auto numeric_of = [&](double* v, std::size_t n) {
    std::vector<double> num(n);
    for (std::size_t i = 0; i < n; ++i) {
      const double keep = v[i];
      v[i] = keep + fd_step;
      const double up = loss();
      v[i] = keep - fd_step;
      const double down = loss();
      v[i] = keep;
      num[i] = (up - down) / (2 * fd_step);
    }
    return num;
  };
  const std::vector<double> dx_numeric = numeric_of(x.data(), x.size());
  const double input_err = max_difference({dx.data(), dx.data() + dx.size()}, dx_numeric) / max_magnitude(dx_numeric);
  INFO("input relative error " << input_err);
  CHECK(input_err <= 1e-7);
  std::vector<std::vector<double>> numeric;
  double scale = 0;
  for (const auto& e : params.entries()) {
    numeric.push_back(numeric_of(params.weights_data() + e.offset, std::size_t(e.numel)));
    scale = std::max(scale, max_magnitude(numeric.back()));
  }
  REQUIRE(scale > 0);
  for (std::size_t i = 0; i < params.entries().size(); ++i) {
    const auto& e = params.entries()[i];
    const double* g = params.grads_data() + e.offset;
    const std::vector<double> analytic(g, g + e.numel);
    const double err = max_difference(analytic, numeric[i]) / scale;
    INFO("parameter " << e.name << " error " << err << " of the largest gradient");
    CHECK(err <= 1e-7);
    if (max_magnitude(numeric[i]) == 0) CHECK(max_magnitude(analytic) == 0);  // an expert no token reached
    if (std::getenv("STRATA_TEST_VERBOSE")) MESSAGE(e.name << ": " << err << " of the largest gradient");
  }
}

}  // namespace

TEST_CASE("moe: SwiGLU experts, renormalised top-2, balance and z-loss: gradients match finite differences") {
  check_layer_gradients({.channels = 6,
                         .hidden = 5,
                         .init_std = 0.3,
                         .proj_init_std = 0.3,
                         .options = {.experts = 4, .top_k = 2, .balance_coef = 0.5, .z_coef = 0.05}},
                        2, 3);
}

TEST_CASE("moe: GELU experts, top-1 without renormalisation, a shared expert: gradients match finite differences") {
  check_layer_gradients({.channels = 6,
                         .hidden = 4,
                         .init_std = 0.3,
                         .proj_init_std = 0.3,
                         .options = {.experts = 3,
                                     .top_k = 1,
                                     .shared_hidden = 4,
                                     .renormalize = false,
                                     .balance_coef = 0.3,
                                     .z_coef = 0.02,
                                     .activation = st::expert_activation::gelu}},
                        2, 4);
}

TEST_CASE("moe: a capacity that drops pairs: gradients match finite differences, the drops are counted") {
  const st::moe<P64>::config cfg{.channels = 6,
                                 .hidden = 5,
                                 .init_std = 0.3,
                                 .proj_init_std = 0.3,
                                 .options = {.experts = 4, .top_k = 2, .balance_coef = 0.2, .capacity_factor = 0.5}};
  CHECK(st::moe<P64>::capacity(cfg, 5) == 2);  // ceil(0.5 · 5 · 2 / 4)
  check_layer_gradients(cfg, 2, 5);

  // The same routing counted directly: every expert keeps at most 2 of a sequence's pairs.
  st::memory_ledger ledger;
  st::model_context<P64> ctx(ledger, st::seed{11});
  st::moe<P64> layer(st::module_scope<P64>(ctx, "mlp"), cfg);
  ctx.params().materialize();
  std::vector<double> x = random_vector(2 * 5 * 6, 1);
  layer.forward({x.data(), {2, 5, 6}});
  const auto row = layer.statistics();
  double pairs = 0;
  for (std::int64_t e = 0; e < 4; ++e) pairs += row[std::size_t(st::moe_row_tokens + e)];
  CHECK(pairs == 2 * 5 * 2);
  CHECK(row[st::moe_row_dropped] > 0);  // which pairs drop: the dispatch plan's own test (test_moe_kernels_fd)
}

TEST_CASE("moe: the plan's activation bytes equal what the layer allocates") {
  const st::moe<P64>::config cfg{
      .channels = 8, .hidden = 6, .options = {.experts = 4, .top_k = 2, .shared_hidden = 4, .z_coef = 0.01}};
  st::memory_ledger ledger;
  st::model_context<P64> ctx(ledger, st::seed{1});
  st::moe<P64> layer(st::module_scope<P64>(ctx, "mlp"), cfg);
  ctx.params().materialize();
  const std::int64_t B = 2, T = 4;
  std::vector<double> x = random_vector(std::size_t(B * T * 8), 3);
  const auto before = ledger.current(st::memory_category::activations);
  layer.forward({x.data(), {B, T, 8}});
  const auto kept = ledger.current(st::memory_category::activations) - before;
  const st::layer_cost c = st::moe<P64>::cost(cfg, {.batch = B, .seq = T});
  CHECK(std::int64_t(kept) == c.activation_bytes);
  CHECK(c.params == ctx.params().size());
  CHECK(c.params - c.idle_params == 8 * 4 + 2 * (3 * 8 * 6) + 3 * 8 * 4);  // router, 2 of 4 experts, shared
}
