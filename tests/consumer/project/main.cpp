// A downstream program: includes strata the way a user does, builds a one-layer model with the
// serial fp32 host policy and checks a forward and backward pass against hand-computed values.
// Exits 0 on success, 1 with a message on any mismatch or strata::error.
#include <strata/strata.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <type_traits>

#ifndef STRATA_CONSUMER_MODE
#define STRATA_CONSUMER_MODE "unknown"
#endif

namespace st = strata;
using P = st::policy<st::host, st::serial, st::fp32>;
static_assert(std::is_same_v<P::storage, float>);

namespace {

int failures = 0;

void expect_near(const char* what, std::int64_t i, double got, double want, double tol = 1e-5) {
  if (!(std::fabs(got - want) <= tol)) {
    std::fprintf(stderr, "MISMATCH %s[%lld]: got %.9g, want %.9g\n", what, static_cast<long long>(i), got, want);
    ++failures;
  }
}

void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what);
    ++failures;
  }
}

int run() {
  st::memory_ledger ledger;
  const st::seed seed{20240501};
  st::model_context<P> ctx(ledger, seed);
  st::module_scope<P> root(ctx);

  // y = x . W^T + b with x [2, 3], W [2, 3], b [2].
  st::linear<P> fc(root / "fc", {.in = 3, .out = 2, .bias = true, .init_std = 0.02});
  auto& params = ctx.params();
  expect(params.size() == 3 * 2 + 2, "parameter count is in*out + out");
  expect(
      params.entries().size() == 2 && params.entries()[0].name == "fc.weight" && params.entries()[1].name == "fc.bias",
      "parameters are named fc.weight and fc.bias");

  // The initializer is a pure function of (seed, name, index): check the materialized weights.
  float* w = params.weights(fc.weight());
  float* b = params.weights(fc.bias());
  const std::uint64_t wid = st::parameter_id("fc.weight");
  for (std::int64_t i = 0; i < 6; ++i)
    expect_near("initial weight", i, w[i],
                static_cast<float>(st::initial_value(st::init_rule::normal_with_std(0.02), seed.value, wid,
                                                     static_cast<std::uint64_t>(i))),
                0.0);
  for (std::int64_t i = 0; i < 2; ++i) expect_near("initial bias", i, b[i], 0.0, 0.0);
  expect(ledger.current(st::memory_category::parameters) == 8 * sizeof(float), "ledger holds 8 fp32 parameters");

  // Known weights, then a forward pass.
  const float W[6] = {1, 2, 3, 4, 5, 6};
  const float B[2] = {0.5f, -1.0f};
  for (int i = 0; i < 6; ++i) w[i] = W[i];
  for (int i = 0; i < 2; ++i) b[i] = B[i];
  const float x[6] = {1, 0, -1, 2, 1, 0.5f};
  st::tensor_view<const float> xv(x, st::shape{2, 3});
  auto y = fc.forward(xv);
  expect(y.shape == st::shape({2, 2}), "forward output has shape [2, 2]");
  const float y_want[4] = {-1.5f, -3.0f, 6.0f, 15.0f};
  for (std::int64_t i = 0; i < 4; ++i) expect_near("y", i, y.data[i], y_want[i]);

  // Backward with dy = 1: dx = dy . W, dW = dy^T . x, db = column sums of dy.
  params.zero_grads();
  st::buffer<float> dy(ledger, st::memory_category::activations, 4);
  for (std::size_t i = 0; i < 4; ++i) dy[i] = 1.0f;
  auto dx = fc.backward(dy);
  const float dx_want[6] = {5, 7, 9, 5, 7, 9};
  const float dw_want[6] = {3, 1, -0.5f, 3, 1, -0.5f};
  expect(dx.size() == 6, "backward returns [2, 3] input gradients");
  for (std::int64_t i = 0; i < 6 && dx.size() == 6; ++i)
    expect_near("dx", i, dx[static_cast<std::size_t>(i)], dx_want[i]);
  for (std::int64_t i = 0; i < 6; ++i) expect_near("dW", i, params.grads(fc.weight())[i], dw_want[i]);
  for (std::int64_t i = 0; i < 2; ++i) expect_near("db", i, params.grads(fc.bias())[i], 2.0);

  // A shape error is a strata::error naming the layer, not a wrong answer.
  bool threw = false;
  try {
    fc.forward(st::tensor_view<const float>(x, st::shape{3, 2}));
  } catch (const st::error& e) { threw = std::string(e.what()).find("fc") != std::string::npos; }
  expect(threw, "a [3, 2] input to a 3 -> 2 linear layer throws strata::error naming fc");

  return failures;
}

}  // namespace

int main() {
  try {
    if (run() != 0) {
      std::fprintf(stderr, "strata consumer (%s): %d check(s) failed\n", STRATA_CONSUMER_MODE, failures);
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata consumer (%s): unexpected exception: %s\n", STRATA_CONSUMER_MODE, e.what());
    return 1;
  }
  std::printf("strata consumer (%s): strata %d.%d linear forward/backward OK\n", STRATA_CONSUMER_MODE,
              STRATA_VERSION_MAJOR, STRATA_VERSION_MINOR);
  return 0;
}
