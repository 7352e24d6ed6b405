// The example Llama against Hugging Face LlamaForCausalLM: tests/fixtures/llama_{mha,gqa}.safetensors
// hold a tiny model's weights under transformers' names, a token batch, and the float64 reference
// logits, loss and every parameter's gradient (scripts/make-fixtures wrote them; no Python here).
// strata loads the weights through strata/models/llama_hf.hpp and computes the same things:
//   float64 storage: everything within 1e-10 (the same function, up to rounding);
//   float32 storage: loss within 1e-5 relative, logits within 1e-5 of max|logit|, gradients
//   within 1e-4 of max|g| (the tolerances).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "../support/program_dir.hpp"
#include "../unit/max_error.hpp"
#include "strata/models/llama.hpp"
#include "strata/models/llama_hf.hpp"

namespace st = strata;

namespace {

// tests/fixtures, linked next to this program (tests/support/program_dir.hpp).
const std::string fixtures = (strata_test::program_dir() / "fixtures").string();

struct fixture {
  strata::models::llama::dims dims;
  std::map<std::string, st::named_tensor> tensors;
  std::vector<std::int32_t> tokens, targets;
  std::int64_t batch = 0;

  explicit fixture(const std::string& file) {
    const std::string path = fixtures + "/" + file;
    std::map<std::string, std::string> meta;
    for (auto& t : st::read_safetensors(path, &meta)) tensors.emplace(t.name, std::move(t));
    const auto number = [&](const char* key) { return std::stod(meta.at(key)); };
    dims = {.vocab = std::int64_t(number("vocab")),
            .seq = std::int64_t(number("seq")),
            .layers = std::int64_t(number("layers")),
            .heads = std::int64_t(number("heads")),
            .d_model = std::int64_t(number("hidden")),
            .kv_heads = std::int64_t(number("kv_heads")),
            .ffn = std::int64_t(number("ffn")),
            .rope_theta = number("rope_theta"),
            .norm_eps = number("norm_eps")};
    batch = std::int64_t(number("batch"));
    for (double v : values("ref.tokens")) tokens.push_back(std::int32_t(v));
    for (double v : values("ref.targets")) targets.push_back(std::int32_t(v));
  }
  std::vector<double> values(const std::string& name) const {
    const auto& t = tensors.at(name);
    std::vector<double> v(std::size_t(t.numel()));
    for (std::int64_t i = 0; i < t.numel(); ++i) v[std::size_t(i)] = t.at(i);
    return v;
  }
  // The reference gradient of every strata parameter, in serial order (the parts stacked).
  std::vector<double> gradients() const {
    std::vector<double> g;
    for (const auto& p : strata::models::llama::hf_layout(dims))
      for (const auto& part : p.parts) {
        const auto v = values("grad." + part.name);
        g.insert(g.end(), v.begin(), v.end());
      }
    return g;
  }
};

using strata_test::max_abs;
using strata_test::max_diff;

struct result {
  double loss = 0;
  std::vector<double> logits, grads;
};

template <class Precision>
result run(const fixture& f) {
  using P = st::policy<st::host, st::serial, Precision>;
  st::memory_ledger ledger;
  st::sequential_model<strata::models::llama::model<P>> model(ledger, f.dims, st::seed{1});
  auto& p = model.parameters();
  st::scatter_model_weights(
      p, std::span(p.weights_data(), std::size_t(p.size())),
      st::sequential_model<strata::models::llama::model<P>>::serial_parameters(f.dims),
      strata::models::llama::import_hf(
          fixtures + "/" + (f.dims.kv() == f.dims.heads ? "llama_mha" : "llama_gqa") + ".safetensors", f.dims));
  const st::tensor_view<const std::int32_t> in{f.tokens.data(), {f.batch, f.dims.seq}},
      out{f.targets.data(), {f.batch, f.dims.seq}};
  result r;
  {
    auto logits = model.logits(in);
    for (std::int64_t i = 0; i < logits.numel(); ++i) r.logits.push_back(st::convert<double>(logits.data[i]));
  }
  r.loss = model.forward(in, out);
  model.backward();
  for (std::int64_t i = 0; i < p.size(); ++i) r.grads.push_back(st::convert<double>(p.grads_data()[i]));
  return r;
}

void compare(const char* file) {
  const fixture f(file);
  const double loss = f.values("ref.loss")[0];
  const auto logits = f.values("ref.logits"), grads = f.gradients();
  {
    const auto r = run<st::fp64>(f);
    CHECK(std::abs(r.loss - loss) <= 1e-10 * loss);
    CHECK(max_diff(r.logits, logits) <= 1e-10 * max_abs(logits));
    CHECK(max_diff(r.grads, grads) <= 1e-10 * max_abs(grads));
    MESSAGE(std::string(file) << " float64: loss " << r.loss << " (reference " << loss << "), gradient error "
                              << max_diff(r.grads, grads) / max_abs(grads) << " of max|g|");
  }
  const auto r = run<st::fp32>(f);
  const double loss_err = std::abs(r.loss - loss) / loss, logit_err = max_diff(r.logits, logits) / max_abs(logits),
               grad_err = max_diff(r.grads, grads) / max_abs(grads);
  MESSAGE(std::string(file) << " float32: loss rel. error " << loss_err << ", logits " << logit_err
                            << " of max|logit|, gradients " << grad_err << " of max|g|");
  CHECK(loss_err <= 1e-5);
  CHECK(logit_err <= 1e-5);
  CHECK(grad_err <= 1e-4);
}

}  // namespace

TEST_CASE("the Llama example matches Hugging Face LlamaForCausalLM: multi-head attention") {
  compare("llama_mha.safetensors");
}

TEST_CASE("the Llama example matches Hugging Face LlamaForCausalLM: grouped-query attention") {
  compare("llama_gqa.safetensors");
}

TEST_CASE("its Hugging Face layout covers exactly its parameters, in serial order") {
  using P = st::policy<st::host, st::serial, st::fp32>;
  for (const strata::models::llama::dims& d :
       {strata::models::llama::dims{}, strata::models::llama::dims{.heads = 4, .kv_heads = 1},
        strata::models::llama::dims{.kv_heads = 2, .tied = true}}) {
    const auto names = st::sequential_model<strata::models::llama::model<P>>::serial_parameters(d);
    const auto hf = strata::models::llama::hf_layout(d);
    REQUIRE(names.size() == hf.size());
    for (std::size_t i = 0; i < hf.size(); ++i) {
      CHECK(names[i].first == hf[i].name);
      CHECK(names[i].second == hf[i].numel());
    }
  }
}

TEST_CASE("export then import gives the weights back") {
  const fixture f("llama_gqa.safetensors");
  const auto serial = strata::models::llama::import_hf(fixtures + "/llama_gqa.safetensors", f.dims);
  const std::string path = "llama_roundtrip.safetensors";
  strata::models::llama::export_hf<float>(path, f.dims, serial);
  CHECK(strata::models::llama::import_hf(path, f.dims) == serial);
  // A file of another shape is refused, naming the tensor and both shapes.
  strata::models::llama::dims wider = f.dims;
  wider.kv_heads = 4;
  CHECK_THROWS_WITH_AS(
      strata::models::llama::import_hf(path, wider),
      "llama: 'llama_roundtrip.safetensors': tensor 'model.layers.0.self_attn.k_proj.weight' has shape "
      "[16, 32], the model expects [32, 32]",
      st::error);
}
