// The example Mixtral (examples/mixtral) against Hugging Face MixtralForCausalLM:
// tests/fixtures/mixtral_moe.safetensors holds a tiny model (4 experts, top-2) under the hub's
// names, a token batch, and float64 references (scripts/make-fixtures wrote them; no Python here):
//   the language-model loss, logits and every gradient, router included (coefficients 0);
//   each layer's load-balancing and z-loss (the per-sequence form of layers/moe.hpp), and with
//   coefficients 0.02 and 0.001 the total objective and its gradients (stored F32).
// float64 storage: within 1e-10 (the F32-stored gradients within 1e-6 of max|g|); float32: loss
// within 1e-5 relative, gradients within 1e-4 of max|g| (the tolerances).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "../support/program_dir.hpp"
#include "../unit/max_error.hpp"
#include "strata/models/mixtral.hpp"
#include "strata/models/mixtral_hf.hpp"

namespace st = strata;

namespace {

const std::string fixtures = (strata_test::program_dir() / "fixtures").string();
const std::string file = fixtures + "/mixtral_moe.safetensors";

struct fixture {
  strata::models::mixtral::dims dims;
  std::map<std::string, std::string> meta;
  std::map<std::string, st::named_tensor> tensors;
  std::vector<std::int32_t> tokens, targets;
  std::int64_t batch = 0;

  fixture() {
    for (auto& t : st::read_safetensors(file, &meta)) tensors.emplace(t.name, std::move(t));
    dims = {.vocab = std::int64_t(number("vocab")),
            .seq = std::int64_t(number("seq")),
            .layers = std::int64_t(number("layers")),
            .heads = std::int64_t(number("heads")),
            .d_model = std::int64_t(number("hidden")),
            .kv_heads = std::int64_t(number("kv_heads")),
            .ffn = std::int64_t(number("ffn")),
            .experts = std::int64_t(number("experts")),
            .top_k = std::int64_t(number("top_k")),
            .balance_coef = 0,
            .z_coef = 0,
            .rope_theta = number("rope_theta"),
            .norm_eps = number("norm_eps")};
    batch = std::int64_t(number("batch"));
    for (double v : values("ref.tokens")) tokens.push_back(std::int32_t(v));
    for (double v : values("ref.targets")) targets.push_back(std::int32_t(v));
  }
  double number(const char* key) const { return std::stod(meta.at(key)); }
  std::vector<double> values(const std::string& name) const {
    const auto& t = tensors.at(name);
    std::vector<double> v(std::size_t(t.numel()));
    for (std::int64_t i = 0; i < t.numel(); ++i) v[std::size_t(i)] = t.at(i);
    return v;
  }
  // A reference gradient ("grad." or "total_grad.") of every strata parameter, in serial order.
  std::vector<double> gradients(const std::string& prefix) const {
    std::vector<double> g;
    for (const auto& p : strata::models::mixtral::hf_layout(dims))
      for (const auto& part : p.parts) {
        const auto v = values(prefix + part.name);
        g.insert(g.end(), v.begin(), v.end());
      }
    return g;
  }
};

using strata_test::max_abs;
using strata_test::max_diff;

struct result {
  double loss = 0;
  st::auxiliary_sums aux;
  std::vector<double> logits, grads;
};

template <class Precision>
result run(const fixture& f, const strata::models::mixtral::dims& d) {
  using P = st::policy<st::host, st::serial, Precision>;
  using model_t = st::sequential_model<strata::models::mixtral::model<P>>;
  st::memory_ledger ledger;
  model_t model(ledger, d, st::seed{1});
  auto& p = model.parameters();
  st::scatter_model_weights(p, std::span(p.weights_data(), std::size_t(p.size())), model_t::serial_parameters(d),
                            strata::models::mixtral::import_hf(file, d));
  const st::tensor_view<const std::int32_t> in{f.tokens.data(), {f.batch, d.seq}},
      out{f.targets.data(), {f.batch, d.seq}};
  result r;
  {
    auto logits = model.logits(in);
    for (std::int64_t i = 0; i < logits.numel(); ++i) r.logits.push_back(st::convert<double>(logits.data[i]));
  }
  r.loss = model.forward(in, out);
  model.backward();
  r.aux = model.take_auxiliary();
  for (std::int64_t i = 0; i < p.size(); ++i) r.grads.push_back(st::convert<double>(p.grads_data()[i]));
  return r;
}

}  // namespace

TEST_CASE("the Mixtral example matches Hugging Face MixtralForCausalLM: loss, logits, every gradient") {
  const fixture f;
  const double loss = f.values("ref.loss")[0];
  const auto logits = f.values("ref.logits"), grads = f.gradients("grad.");
  {
    const auto r = run<st::fp64>(f, f.dims);
    CHECK(std::abs(r.loss - loss) <= 1e-10 * loss);
    CHECK(max_diff(r.logits, logits) <= 1e-10 * max_abs(logits));
    CHECK(max_diff(r.grads, grads) <= 1e-10 * max_abs(grads));
    CHECK(r.aux.objective == 0);  // coefficients 0: nothing added
    MESSAGE("float64: loss " << r.loss << " (reference " << loss << "), gradient error "
                             << max_diff(r.grads, grads) / max_abs(grads) << " of max|g|");
  }
  const auto r = run<st::fp32>(f, f.dims);
  const double loss_err = std::abs(r.loss - loss) / loss, logit_err = max_diff(r.logits, logits) / max_abs(logits),
               grad_err = max_diff(r.grads, grads) / max_abs(grads);
  MESSAGE("float32: loss rel. error " << loss_err << ", logits " << logit_err << " of max|logit|, gradients "
                                      << grad_err << " of max|g|");
  CHECK(loss_err <= 1e-5);
  CHECK(logit_err <= 1e-5);
  CHECK(grad_err <= 1e-4);
}

TEST_CASE("the router's balance and z-losses, and the total objective's gradients, match the reference") {
  const fixture f;
  strata::models::mixtral::dims d = f.dims;
  d.balance_coef = f.number("balance_coef");
  d.z_coef = f.number("z_coef");
  const double total = f.values("ref.total_loss")[0];
  const auto grads = f.gradients("total_grad.");
  const auto r = run<st::fp64>(f, d);
  REQUIRE(r.aux.blocks == d.layers);
  REQUIRE(r.aux.width == st::moe_row_tokens + d.experts);
  for (std::int64_t l = 0; l < d.layers; ++l) {
    const double* row = r.aux.rows.data() + l * r.aux.width;
    const double balance = f.values("ref.balance." + std::to_string(l))[0],
                 z = f.values("ref.zloss." + std::to_string(l))[0];
    CHECK(std::abs(row[st::moe_row_balance] - balance) <= 1e-12 * balance);
    CHECK(std::abs(row[st::moe_row_z] - z) <= 1e-12 * z);
    double pairs = 0;
    for (std::int64_t e = 0; e < d.experts; ++e) pairs += row[st::moe_row_tokens + e];
    CHECK(pairs == f.batch * d.seq * d.top_k);
    CHECK(row[st::moe_row_dropped] == 0);
  }
  CHECK(std::abs(r.loss + r.aux.objective - total) <= 1e-12 * total);
  const double err = max_diff(r.grads, grads) / max_abs(grads);
  MESSAGE("float64 total objective: " << r.loss + r.aux.objective << " (reference " << total << "), gradient error "
                                      << err << " of max|g| (reference stored as F32)");
  CHECK(err <= 1e-6);
  const auto r32 = run<st::fp32>(f, d);
  CHECK(max_diff(r32.grads, grads) <= 1e-4 * max_abs(grads));
}

TEST_CASE("its Hugging Face layout covers exactly its parameters, in serial order; export then import") {
  using P = st::policy<st::host, st::serial, st::fp32>;
  for (const strata::models::mixtral::dims& d :
       {strata::models::mixtral::dims{}, strata::models::mixtral::dims{.kv_heads = 2, .experts = 3, .top_k = 1}}) {
    const auto names = st::sequential_model<strata::models::mixtral::model<P>>::serial_parameters(d);
    const auto hf = strata::models::mixtral::hf_layout(d);
    REQUIRE(names.size() == hf.size());
    for (std::size_t i = 0; i < hf.size(); ++i) {
      CHECK(names[i].first == hf[i].name);
      CHECK(names[i].second == hf[i].numel());
    }
  }
  const fixture f;
  const auto serial = strata::models::mixtral::import_hf(file, f.dims);
  strata::models::mixtral::export_hf<float>("mixtral_roundtrip.safetensors", f.dims, serial);
  CHECK(strata::models::mixtral::import_hf("mixtral_roundtrip.safetensors", f.dims) == serial);
  strata::models::mixtral::dims shared = f.dims;
  shared.shared_ffn = 16;
  CHECK_THROWS_WITH_AS(strata::models::mixtral::hf_layout(shared),
                       "mixtral: a shared expert (shared_ffn 16) has no place in a MixtralForCausalLM file", st::error);
}
