// Whole-layer gradients against central finite differences, with every template instantiated
// on double: a transformer block (input and every parameter), blocks composed with st::chain,
// st::residual and st::sum_of (tests/compose/composed_blocks.hpp), and the complete GPT-2 model
// (every parameter, the tied embedding included, through the fused loss). A composed GPT-2 block
// equals transformer_block bit for bit.
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

#include "../compose/composed_blocks.hpp"
#include "strata/models/gpt2.hpp"

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

TEST_CASE("composed blocks: input and parameter gradients match finite differences in double") {
  // Gemma 2's sandwich (pre- and post-norms around both branches), grouped-query rotary attention.
  check_block_gradients<composed::sandwich_block<P64>>(
      "sandwich", {.channels = 8, .heads = 2, .kv_heads = 1, .hidden = 16, .rope_theta = 100, .init_std = 0.3});
  // The parallel residual as a sum of two chains.
  check_block_gradients<st::composition<composed::parallel<P64>>>(
      "parallel residual", {.channels = 8, .heads = 2, .hidden = 32, .init_std = 0.3, .proj_init_std = 0.2});
}

namespace {
// Forward, backward and every gradient of two blocks built alike (same names, same seed) on the
// same input and output gradient.
template <class A, class B>
void compare_blocks(const typename A::config& cfg, double tolerance) {
  st::memory_ledger la, lb;
  st::model_context<P64> ca(la, st::seed{3}), cb(lb, st::seed{3});
  A a(st::module_scope<P64>(ca, "block"), cfg);
  B b(st::module_scope<P64>(cb, "block"), cfg);
  auto &pa = ca.params(), &pb = cb.params();
  REQUIRE(pa.entries().size() == pb.entries().size());
  for (std::size_t i = 0; i < pa.entries().size(); ++i) CHECK(pa.entries()[i].name == pb.entries()[i].name);
  pa.materialize();
  pb.materialize();
  pa.zero_grads();
  pb.zero_grads();
  const std::int64_t B_ = 2, T = 4, C = cfg.channels;
  const std::vector<double> x = random_vector(B_ * T * C, 1), r = random_vector(B_ * T * C, 2);
  const auto ya = a.forward({x.data(), {B_, T, C}});
  const auto yb = b.forward({x.data(), {B_, T, C}});
  std::vector<double> out_a(ya.data, ya.data + ya.numel()), out_b(yb.data, yb.data + yb.numel());
  st::buffer<double> dya(la, st::memory_category::activations, r.size()),
      dyb(lb, st::memory_category::activations, r.size());
  std::copy(r.begin(), r.end(), dya.data());
  std::copy(r.begin(), r.end(), dyb.data());
  const st::buffer<double> dxa = a.backward(dya), dxb = b.backward(dyb);
  const std::vector<double> ga(pa.grads_data(), pa.grads_data() + pa.size()),
      gb(pb.grads_data(), pb.grads_data() + pb.size());
  if (tolerance == 0) {
    CHECK(out_a == out_b);
    CHECK(std::equal(dxa.data(), dxa.data() + dxa.size(), dxb.data()));
    CHECK(ga == gb);
  } else {
    CHECK(relative_error(out_a, out_b) <= tolerance);
    CHECK(relative_error(std::vector<double>(dxa.data(), dxa.data() + dxa.size()),
                         std::vector<double>(dxb.data(), dxb.data() + dxb.size())) <= tolerance);
    CHECK(relative_error(ga, gb) <= tolerance);
  }
}
}  // namespace

TEST_CASE("a composed block computes what the hand-written one does, and costs what it costs") {
  using block = st::transformer_block<P64>;
  const block::config gpt2{.channels = 8, .heads = 2, .hidden = 32, .init_std = 0.3, .proj_init_std = 0.2};
  // The same kernels in the same order: equal to the bit.
  compare_blocks<st::composition<composed::gpt2_like<P64>>, block>(gpt2, 0);
  // The parallel residual sums its branches first, then adds the input: equal to rounding.
  block::config neox = gpt2;
  neox.parallel_residual = true;
  compare_blocks<st::composition<composed::parallel<P64>>, block>(neox, 1e-13);

  // The derived cost adds up to the hand-written one's (its peaks follow its own order of buffers).
  using F = st::policy<st::host, st::serial, st::fp32>;
  for (const st::tensor_split tp :
       {st::tensor_split{1, false}, st::tensor_split{2, false}, st::tensor_split{2, true}}) {
    const st::cost_scope s{.tp = tp, .batch = 2, .seq = 16};
    const auto c = st::transformer_block<F>::config{.channels = 64, .heads = 4, .hidden = 256};
    const st::layer_cost hand = st::transformer_block<F>::cost(c, s),
                         derived = st::composition<composed::gpt2_like<F>>::cost(c, s);
    CHECK(derived.params == hand.params);
    CHECK(derived.forward_flops == hand.forward_flops);
    CHECK(derived.backward_flops == hand.backward_flops);
    CHECK(derived.activation_bytes == hand.activation_bytes);
    CHECK(derived.output_bytes == hand.output_bytes);
    CHECK(derived.tensor_forward_bytes == hand.tensor_forward_bytes);
    CHECK(derived.tensor_backward_bytes == hand.tensor_backward_bytes);
    CHECK(derived.memory_forward_bytes == hand.memory_forward_bytes);
    CHECK(derived.memory_backward_bytes == hand.memory_backward_bytes);
    CHECK(derived.forward_gemms == hand.forward_gemms);
    CHECK(derived.backward_gemms == hand.backward_gemms);
    CHECK(derived.attention_forward_flops == hand.attention_forward_flops);
  }
  // A composition is a layer: it meets the concept, and its tensor extents are its parts'.
  static_assert(st::hidden_layer<composed::sandwich_block<P64>>);
  static_assert(st::composition<composed::sandwich<P64>>::tensor_extents({.channels = 8, .heads = 6, .hidden = 10})
                    .first_not_divided_by(4) != nullptr);
}

TEST_CASE("GPT-2 model: every parameter's gradient through the fused loss matches finite differences") {
  st::memory_ledger ledger;
  strata::models::gpt2::dims d{.vocab = 11, .seq = 4, .layers = 2, .heads = 2, .d_model = 8};
  st::sequential_model<strata::models::gpt2::model<P64>> model(ledger, d, st::seed{5});
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
