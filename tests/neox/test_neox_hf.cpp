// The GPT-NeoX-shaped model of strata/models/neox.hpp (strata's layers only) against Hugging
// Face GPTNeoXForCausalLM: tests/fixtures/neox_parallel.safetensors holds a tiny model's weights
// under transformers' names, a token batch, and the float64 reference loss and every parameter's
// gradient (scripts/make-fixtures). Parallel residual, rotary on a quarter of each head, per-head
// fused QKV and exact GELU all have to be right for these to agree:
//   float64 storage: loss and gradients within 1e-10 (the same function, up to rounding);
//   float32 storage: loss within 1e-5 relative, gradients within 1e-4 of max|g|.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "../support/program_dir.hpp"
#include "../unit/max_error.hpp"
#include "strata/models/neox.hpp"

namespace st = strata;

namespace {

const std::string fixtures = (strata_test::program_dir() / "fixtures").string();

struct fixture {
  strata::models::neox::dims dims;
  std::map<std::string, st::named_tensor> tensors;
  std::vector<std::int32_t> tokens, targets;
  std::int64_t batch = 0;

  fixture() {
    std::map<std::string, std::string> meta;
    for (auto& t : st::read_safetensors(fixtures + "/neox_parallel.safetensors", &meta))
      tensors.emplace(t.name, std::move(t));
    const auto number = [&](const char* key) { return std::stod(meta.at(key)); };
    dims = {.vocab = std::int64_t(number("vocab")),
            .seq = std::int64_t(number("seq")),
            .layers = std::int64_t(number("layers")),
            .heads = std::int64_t(number("heads")),
            .d_model = std::int64_t(number("hidden")),
            .ffn = std::int64_t(number("ffn")),
            .rope_theta = number("rope_theta"),
            .rotary_fraction = number("rotary_fraction"),
            .norm_eps = number("norm_eps")};
    batch = std::int64_t(number("batch"));
    for (double v : values("ref.tokens")) tokens.push_back(std::int32_t(v));
    for (double v : values("ref.targets")) targets.push_back(std::int32_t(v));
  }
  std::vector<double> values(const std::string& name) const {
    const auto it = tensors.find(name);
    REQUIRE_MESSAGE(it != tensors.end(), "the fixture has no tensor '" << name << "'");
    std::vector<double> v(std::size_t(it->second.numel()));
    for (std::int64_t i = 0; i < it->second.numel(); ++i) v[std::size_t(i)] = it->second.at(i);
    return v;
  }
  // The tensors `prefix` + the Hugging Face name of every strata parameter, stacked in serial
  // order by the model's rules (strata::models::neox::hf_map, train/hf_weights.hpp).
  template <class Model>
  std::vector<double> serial(const char* prefix) const {
    return st::read_hf_weights(fixtures + "/neox_parallel.safetensors", strata::models::neox::hf_map(prefix),
                               st::sequential_model<Model>::serial_parameter_shapes(dims));
  }
};

using strata_test::max_abs;
using strata_test::max_diff;

struct result {
  double loss = 0;
  std::vector<double> grads;
};

template <class Precision>
result run(const fixture& f) {
  using P = st::policy<st::host, st::serial, Precision>;
  using M = strata::models::neox::model<P>;
  st::memory_ledger ledger;
  st::sequential_model<M> model(ledger, f.dims, st::seed{1});
  auto& p = model.parameters();
  st::scatter_model_weights(p, std::span(p.weights_data(), std::size_t(p.size())),
                            st::sequential_model<M>::serial_parameters(f.dims), f.serial<M>(""));
  const st::tensor_view<const std::int32_t> in{f.tokens.data(), {f.batch, f.dims.seq}},
      out{f.targets.data(), {f.batch, f.dims.seq}};
  result r;
  r.loss = model.forward(in, out);
  model.backward();
  for (std::int64_t i = 0; i < p.size(); ++i) r.grads.push_back(st::convert<double>(p.grads_data()[i]));
  return r;
}

}  // namespace

TEST_CASE("a GPT-NeoX model from strata's layers matches Hugging Face GPTNeoXForCausalLM") {
  const fixture f;
  using M32 = strata::models::neox::model<st::policy<st::host, st::serial, st::fp32>>;
  const double loss = f.values("ref.loss")[0];
  const auto grads = f.serial<M32>("grad.");
  {
    const auto r = run<st::fp64>(f);
    const double loss_err = std::abs(r.loss - loss) / loss, grad_err = max_diff(r.grads, grads) / max_abs(grads);
    MESSAGE(std::string("float64: loss rel. error ") << loss_err << ", gradients " << grad_err << " of max|g|");
    CHECK(loss_err <= 1e-10);
    CHECK(grad_err <= 1e-10);
  }
  const auto r = run<st::fp32>(f);
  const double loss_err = std::abs(r.loss - loss) / loss, grad_err = max_diff(r.grads, grads) / max_abs(grads);
  MESSAGE(std::string("float32: loss rel. error ") << loss_err << ", gradients " << grad_err << " of max|g|");
  CHECK(loss_err <= 1e-5);
  CHECK(grad_err <= 1e-4);
}

TEST_CASE("each variant matters: with any one of them changed, the same weights miss the reference gradients") {
  // So the test above cannot pass with one variant wrong: each moves the gradients by more than
  // the 1e-4 of max|g| the float32 model is held to.
  const fixture f;
  using M = strata::models::neox::model<st::policy<st::host, st::serial, st::fp64>>;
  const auto grads = f.serial<M>("grad.");
  const auto error_with = [&](const strata::models::neox::dims& d) {
    st::memory_ledger ledger;
    st::sequential_model<M> model(ledger, d, st::seed{1});
    auto& p = model.parameters();
    st::scatter_model_weights(p, std::span(p.weights_data(), std::size_t(p.size())),
                              st::sequential_model<M>::serial_parameters(d), f.serial<M>(""));
    const st::tensor_view<const std::int32_t> in{f.tokens.data(), {f.batch, d.seq}},
        out{f.targets.data(), {f.batch, d.seq}};
    model.forward(in, out);
    model.backward();
    const std::vector<double> g(p.grads_data(), p.grads_data() + p.size());
    return max_diff(g, grads) / max_abs(grads);
  };
  CHECK(error_with(f.dims) <= 1e-10);
  strata::models::neox::dims d = f.dims;
  d.rotary_fraction = 1;
  const double whole_head = error_with(d);
  d = f.dims;
  d.fused_qkv = st::qkv_layout::grouped;
  const double grouped = error_with(d);
  d = f.dims;
  d.act = st::activation::gelu_tanh;
  const double tanh_gelu = error_with(d);
  d = f.dims;
  d.parallel_residual = false;
  const double sequential = error_with(d);
  MESSAGE("gradient error (of max|g|) with whole-head rotary "
          << whole_head << ", grouped QKV " << grouped << ", tanh GELU " << tanh_gelu << ", sequential residual "
          << sequential);
  CHECK(whole_head > 1e-4);
  CHECK(grouped > 1e-4);
  CHECK(tanh_gelu > 1e-4);
  CHECK(sequential > 1e-4);
}
