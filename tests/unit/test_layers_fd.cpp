// Whole-layer gradients against central finite differences, with every template instantiated
// on double: a transformer block (input and every parameter), and the complete GPT-2 model
// (every parameter, the tied embedding included, through the fused loss).
//
// Error measure: max_i |analytic_i - numeric_i| / max_i |numeric_i| (the largest deviation
// relative to the largest gradient), required <= 1e-6.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include <strata/strata.hpp>

#include "gpt2/gpt2.hpp"

namespace st = strata;
using P64 = st::policy<st::host, st::serial, st::fp64>;

namespace {

double relative_error(const std::vector<double>& analytic, const std::vector<double>& numeric) {
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < analytic.size(); ++i) {
    worst = std::max(worst, std::abs(analytic[i] - numeric[i]));
    scale = std::max(scale, std::abs(numeric[i]));
  }
  REQUIRE(scale > 0);
  return worst / scale;
}

std::vector<double> random_vector(std::size_t n, std::uint64_t stream) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = st::counter_normal(99, stream, i);
  return v;
}

constexpr double fd_step = 1e-6;

}  // namespace

namespace {
// A block's input and every parameter gradient against central differences, L = sum(r * y).
template <class Block>
void check_block_gradients(const char* what, const typename Block::config& cfg) {
  CAPTURE(std::string(what));
  st::memory_ledger ledger;
  st::model_context<P64> ctx(ledger, st::seed{3});
  Block block(st::module_scope<P64>(ctx, "block"), cfg);
  auto& params = ctx.params();
  params.materialize();

  const std::int64_t B = 2, T = 4, C = cfg.channels;
  std::vector<double> x = random_vector(B * T * C, 1);
  const std::vector<double> r = random_vector(B * T * C, 2);
  auto loss = [&] {
    auto y = block.forward({x.data(), {B, T, C}});
    double s = 0;
    for (std::int64_t i = 0; i < y.numel(); ++i) s += r[std::size_t(i)] * y.data[i];
    return s;
  };

  params.zero_grads();
  loss();
  st::buffer<double> dy(ledger, st::memory_category::activations, r.size());
  std::copy(r.begin(), r.end(), dy.data());
  st::buffer<double> dx = block.backward(dy);

  // Input gradient.
  std::vector<double> numeric(x.size()), analytic(dx.data(), dx.data() + dx.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + fd_step;
    const double up = loss();
    x[i] = keep - fd_step;
    const double down = loss();
    x[i] = keep;
    numeric[i] = (up - down) / (2 * fd_step);
  }
  const double input_err = relative_error(analytic, numeric);
  CHECK(input_err <= 1e-6);

  // Every parameter, one tensor at a time.
  for (const auto& e : params.entries()) {
    double* w = params.weights_data() + e.offset;
    const double* g = params.grads_data() + e.offset;
    std::vector<double> num(std::size_t(e.numel)), ana(g, g + e.numel);
    for (std::int64_t i = 0; i < e.numel; ++i) {
      const double keep = w[i];
      w[i] = keep + fd_step;
      const double up = loss();
      w[i] = keep - fd_step;
      const double down = loss();
      w[i] = keep;
      num[std::size_t(i)] = (up - down) / (2 * fd_step);
    }
    const double err = relative_error(ana, num);
    INFO("parameter " << e.name << " relative error " << err);
    CHECK(err <= 1e-6);
  }
}
}  // namespace

namespace {
// An attention of one's own, given to transformer_block as a type: strata's, its output scaled by
// a factor its config holds (a stand-in for any variant).
template <class P>
class scaled_attention {
 public:
  using policy = P;
  using T = typename P::storage;
  struct config {
    typename st::attention<P>::config inner;
    double scale = 1;
  };
  static constexpr st::layer_cost cost(const config& c, const st::cost_scope& s) {
    st::layer_cost r = st::attention<P>::cost(c.inner, s);
    r.activation_bytes += r.output_bytes;  // its own output
    return r;
  }
  scaled_attention(st::module_scope<P> scope, const config& c) : scope_(scope), cfg_(c), inner_(scope, c.inner) {}
  st::tensor_view<const T> forward(st::tensor_view<const T> x) {
    const auto y = inner_.forward(x);
    st::ensure_size(out_, scope_.ledger(), st::memory_category::activations, y.numel());
    for (std::int64_t i = 0; i < y.numel(); ++i) out_[std::size_t(i)] = T(cfg_.scale) * y.data[i];
    return {out_.data(), y.shape};
  }
  st::buffer<T> backward(const st::buffer<T>& dout) {
    st::buffer<T> scaled(scope_.ledger(), st::memory_category::activations, dout.size());
    for (std::size_t i = 0; i < dout.size(); ++i) scaled[i] = T(cfg_.scale) * dout[i];
    return inner_.backward(scaled);
  }
  template <class F>
  void visit_parameters(F&& f) const {
    inner_.visit_parameters(f);
  }

 private:
  st::module_scope<P> scope_;
  config cfg_;
  st::attention<P> inner_;
  st::buffer<T> out_;
};
}  // namespace

TEST_CASE("a block takes an attention of one's own as a type, with its whole config") {
  using block = st::transformer_block<P64, st::layernorm, st::mlp, scaled_attention>;
  static_assert(std::is_same_v<block::attention_type, scaled_attention<P64>>);
  const block::config cfg{
      .channels = 8,
      .heads = 2,
      .hidden = 32,
      .init_std = 0.3,
      .proj_init_std = 0.2,
      .attn = {.inner = {.channels = 8, .heads = 2, .init_std = 0.3, .proj_init_std = 0.2}, .scale = 0.5}};
  check_block_gradients<block>("scaled attention", cfg);
  // With scale 1 it is strata's own block: the same parameters (by name, so the same values) and
  // the same output, bit for bit.
  const std::vector<double> x = random_vector(2 * 4 * 8, 1);
  const auto run = [&]<class B>(const typename B::config& c) {
    st::memory_ledger ledger;
    st::model_context<P64> ctx(ledger, st::seed{3});
    B b(st::module_scope<P64>(ctx, "block"), c);
    ctx.params().materialize();
    const auto y = b.forward({x.data(), {2, 4, 8}});
    return std::vector<double>(y.data, y.data + y.numel());
  };
  block::config one = cfg;
  one.attn.scale = 1;
  const auto own = run.operator()<block>(one);
  const auto strata_s = run.operator()<st::transformer_block<P64>>(
      {.channels = 8, .heads = 2, .hidden = 32, .init_std = 0.3, .proj_init_std = 0.2});
  CHECK(own == strata_s);
  CHECK(run.operator()<block>(cfg) != strata_s);
}

TEST_CASE("transformer block: input and parameter gradients match finite differences in double") {
  using block = st::transformer_block<P64>;
  check_block_gradients<block>("GPT-2's", {8, 2, 32, 1e-5, 0.3, 0.2});  // larger init: non-trivial gradients
  // GPT-NeoX's: parallel residual, per-head fused QKV, rotary on a quarter of each head, exact GELU.
  check_block_gradients<block>("GPT-NeoX's", {.channels = 16,
                                              .heads = 2,
                                              .hidden = 32,
                                              .init_std = 0.3,
                                              .proj_init_std = 0.2,
                                              .rope_theta = 100,
                                              .rotary_fraction = 0.25,
                                              .fused_qkv = st::qkv_layout::per_head,
                                              .ffn_activation = st::activation::gelu_exact,
                                              .parallel_residual = true});
  check_block_gradients<block>("ReLU² MLP", {.channels = 8,
                                             .heads = 2,
                                             .hidden = 32,
                                             .init_std = 0.3,
                                             .proj_init_std = 0.2,
                                             .ffn_activation = st::activation::relu_squared});
  check_block_gradients<block>("SiLU MLP", {.channels = 8,
                                            .heads = 2,
                                            .hidden = 32,
                                            .init_std = 0.3,
                                            .proj_init_std = 0.2,
                                            .ffn_activation = st::activation::silu});
  // Llama's with a GELU gate (GeGLU) and with the default SiLU one.
  using llama_block = st::llama_block<P64>;
  check_block_gradients<llama_block>("GeGLU", {.channels = 8,
                                               .heads = 2,
                                               .hidden = 16,
                                               .init_std = 0.3,
                                               .proj_init_std = 0.2,
                                               .kv_heads = 1,
                                               .rope_theta = 100,
                                               .bias = false,
                                               .ffn_activation = st::activation::gelu_tanh});
  check_block_gradients<llama_block>("SwiGLU", {.channels = 8,
                                                .heads = 2,
                                                .hidden = 16,
                                                .init_std = 0.3,
                                                .proj_init_std = 0.2,
                                                .kv_heads = 1,
                                                .rope_theta = 100,
                                                .bias = false});
}

TEST_CASE("GPT-2 model: every parameter's gradient through the fused loss matches finite differences") {
  st::memory_ledger ledger;
  gpt2::dims d{.vocab = 11, .seq = 4, .layers = 2, .heads = 2, .d_model = 8};
  st::sequential_model<gpt2::model<P64>> model(ledger, d, st::seed{5});
  auto& params = model.parameters();
  // Widen the initial weights so gradients are far from zero everywhere.
  for (std::int64_t i = 0; i < params.size(); ++i) params.weights_data()[i] *= 8.0;

  const std::int64_t B = 2, T = 4;
  std::vector<std::int32_t> inputs(B * T), targets(B * T);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    inputs[i] = std::int32_t((i * 7 + 3) % 11);
    targets[i] = std::int32_t((i * 5 + 1) % 11);
  }
  inputs[1] = inputs[5] = 4;  // a repeated token: its embedding gradient sums two positions
  st::tensor_view<const std::int32_t> in{inputs.data(), {B, T}}, tg{targets.data(), {B, T}};

  params.zero_grads();
  model.forward(in, tg);
  model.backward();
  std::vector<double> analytic(params.grads_data(), params.grads_data() + params.size());

  double worst = 0;
  for (const auto& e : params.entries()) {
    double* w = params.weights_data() + e.offset;
    std::vector<double> num(std::size_t(e.numel)),
        ana(analytic.begin() + e.offset, analytic.begin() + e.offset + e.numel);
    for (std::int64_t i = 0; i < e.numel; ++i) {
      const double keep = w[i];
      w[i] = keep + fd_step;
      const double up = model.evaluate(in, tg);
      w[i] = keep - fd_step;
      const double down = model.evaluate(in, tg);
      w[i] = keep;
      num[std::size_t(i)] = (up - down) / (2 * fd_step);
    }
    const double err = relative_error(ana, num);
    worst = std::max(worst, err);
    INFO("parameter " << e.name << " relative error " << err);
    CHECK(err <= 1e-6);
  }
  MESSAGE("GPT-2 (double) worst per-tensor relative gradient error: " << worst);
}

// linear's config.gelu: forward gives GELU of the plain layer's output and keeps both; backward
// takes GELU's output gradient (the block test above checks its gradients through the MLP). A
// row split, whose output is a partial sum, is refused when the layer is built.
TEST_CASE("linear with gelu: GELU of the plain layer's output; a row split is refused") {
  st::memory_ledger ledger;
  st::model_context<P64> ctx(ledger, st::seed{5});
  st::linear<P64> plain(st::module_scope<P64>(ctx, "plain"), {.in = 6, .out = 10, .init_std = 0.5});
  st::linear<P64> fused(st::module_scope<P64>(ctx, "fused"), {.in = 6, .out = 10, .init_std = 0.5, .gelu = true});
  ctx.params().materialize();
  auto& p = ctx.params();
  std::copy_n(p.weights(plain.weight()), 60, p.weights(fused.weight()));
  for (int i = 0; i < 10; ++i) p.weights(plain.bias())[i] = p.weights(fused.bias())[i] = 0.1 * (i - 4);
  const std::vector<double> x = random_vector(3 * 6, 7);
  auto y = plain.forward({x.data(), {3, 6}});
  auto z = fused.forward({x.data(), {3, 6}});
  REQUIRE(z.numel() == 30);
  for (std::int64_t i = 0; i < 30; ++i) {
    const double pre = y.data[i];
    const double u = 0.7978845608028654 * (pre + 0.044715 * pre * pre * pre);
    CHECK(z.data[i] == doctest::Approx(0.5 * pre * (1 + std::tanh(u))).epsilon(1e-14));
  }
  CHECK(st::linear<P64>::cost({.in = 6, .out = 10, .gelu = true}, {}).activation_bytes ==
        2 * st::linear<P64>::cost({.in = 6, .out = 10}, {}).activation_bytes);
  CHECK_THROWS_WITH_AS(
      st::linear<P64>(st::module_scope<P64>(ctx, "row"),
                      {.in = 6, .out = 10, .split = st::tensor_split_kind::row, .gelu = true}),
      doctest::Contains("GELU needs whole outputs, and a row-parallel layer's output is a partial sum"), st::error);
}

TEST_CASE("layers meet the layer concept") {
  static_assert(st::hidden_layer<st::linear<P64>>);
  static_assert(st::hidden_layer<st::layernorm<P64>>);
  static_assert(st::hidden_layer<st::attention<P64>>);
  static_assert(st::hidden_layer<st::mlp<P64>>);
  static_assert(st::hidden_layer<st::transformer_block<P64>>);
  static_assert(st::input_layer<st::embedding<P64>> && st::output_layer<st::lm_head<P64>>);
  CHECK(st::transformer_block<P64>::cost({.channels = 8, .heads = 2, .hidden = 32}, {}).params == 12 * 8 * 8 + 13 * 8);
}
