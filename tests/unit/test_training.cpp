// The example GPT-2 trained end to end on the generated corpus: it learns, it is
// deterministic, bf16 and fp16 track fp32, the fp16 loss scaler handles an overflow, and the
// allocator's books match the analytic model-state and activation bytes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include <strata/strata.hpp>

#include "counting_space.hpp"
#include "strata/models/gpt2.hpp"

namespace st = strata;

namespace {

using P32 = st::policy<st::host, st::serial, st::fp32>;
using PBF16 = st::policy<st::host, st::serial, st::mixed<st::bf16, float>>;
using PFP16 = st::policy<st::host, st::serial, st::mixed<st::fp16, float>>;

const strata::models::gpt2::dims tiny{.vocab = 256, .seq = 32, .layers = 2, .heads = 2, .d_model = 32};

template <class P>
struct run_result {
  std::vector<double> losses;
  std::vector<float> final_weights;  // widened to float for comparison
};

template <class P>
run_result<P> train_run(int steps, std::int64_t batch = 8, std::int64_t micro = 0, std::uint64_t seed = 1,
                        const st::memory_space& space = st::host_memory()) {
  st::memory_ledger ledger(space);
  st::sequential_model<strata::models::gpt2::model<P>> model(ledger, tiny, st::seed{seed});
  st::adamw<P> opt(model, {.lr = 3e-3, .weight_decay = 0.1});
  st::trainer_options o;
  o.micro_batch = micro;
  o.schedule = {3e-3, 3e-4, 2, steps};
  st::trainer train(model, opt, o);
  st::token_stream data(st::byte_tokens(st::generate_corpus(50000)), seed);
  run_result<P> r;
  for (int s = 0; s < steps; ++s) r.losses.push_back(train.step(data.next_batch(batch, tiny.seq)).loss);
  auto& p = model.parameters();
  std::vector<typename P::storage> w(static_cast<std::size_t>(p.size()));
  std::memcpy(w.data(), p.weights_data(), w.size() * sizeof(w[0]));  // host memory in every space used here
  for (const auto x : w) r.final_weights.push_back(st::convert<float>(x));
  return r;
}

}  // namespace

TEST_CASE("the tiny model learns the generated corpus") {
  auto r = train_run<P32>(40);
  MESSAGE("fp32 loss: first " << r.losses.front() << ", last " << r.losses.back());
  CHECK(r.losses.front() > 5.0);  // ~ln(256) = 5.55 at initialisation
  CHECK(r.losses.back() < 3.3);   // measured 3.04 after 40 steps (batch 8 x 32 tokens)
}

TEST_CASE("two runs with one seed are bit-identical") {
  auto a = train_run<P32>(5);
  auto b = train_run<P32>(5);
  REQUIRE(a.losses.size() == b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i) CHECK(std::memcmp(&a.losses[i], &b.losses[i], sizeof(double)) == 0);
  REQUIRE(a.final_weights.size() == b.final_weights.size());
  CHECK(std::memcmp(a.final_weights.data(), b.final_weights.data(), a.final_weights.size() * sizeof(float)) == 0);
  auto c = train_run<P32>(5, 8, 0, 2);  // and a different seed really differs
  CHECK(c.losses[0] != a.losses[0]);
}

TEST_CASE("micro-batches accumulate to the same step as one full batch") {
  auto whole = train_run<P32>(3, 8, 0);
  auto split = train_run<P32>(3, 8, 2);
  for (std::size_t i = 0; i < whole.losses.size(); ++i)
    CHECK(split.losses[i] == doctest::Approx(whole.losses[i]).epsilon(1e-5));
  double worst = 0;
  for (std::size_t i = 0; i < whole.final_weights.size(); ++i)
    worst = std::max(worst, double(std::abs(whole.final_weights[i] - split.final_weights[i])));
  CHECK(worst < 1e-5);
}

TEST_CASE("bf16 and fp16 runs track the fp32 run") {
  const int steps = 20;
  auto ref = train_run<P32>(steps);
  auto bf = train_run<PBF16>(steps);
  auto hf = train_run<PFP16>(steps);
  double worst_bf = 0, worst_hf = 0;
  for (int s = 0; s < steps; ++s) {
    worst_bf = std::max(worst_bf, std::abs(bf.losses[std::size_t(s)] - ref.losses[std::size_t(s)]));
    worst_hf = std::max(worst_hf, std::abs(hf.losses[std::size_t(s)] - ref.losses[std::size_t(s)]));
  }
  MESSAGE("max per-step loss deviation from fp32 over " << steps << " steps: bf16 " << worst_bf << ", fp16 "
                                                        << worst_hf);
  // Tolerances: bf16 keeps 8 mantissa bits (relative rounding 2^-9 = 0.2%), fp16 11 bits.
  // Measured: bf16 0.0021, fp16 0.00015 (2 threads).
  CHECK(worst_bf < 0.02);
  CHECK(worst_hf < 0.005);
  CHECK(bf.losses.back() < ref.losses.front() - 1.0);  // and both really train
  CHECK(hf.losses.back() < ref.losses.front() - 1.0);
}

TEST_CASE("fp16 loss scaling: an injected overflow skips the step, backs off, then grows again") {
  st::memory_ledger ledger;
  st::sequential_model<strata::models::gpt2::model<PFP16>> model(ledger, tiny, st::seed{1});
  st::adamw<PFP16> opt(model, {.lr = 1e-3});
  st::trainer_options o;
  o.schedule = {1e-3, 1e-4, 0, 100};
  o.initial_loss_scale = 1e9;  // dloss/dlogit ~ 1e9 / 256 rows: far past fp16's 65504
  o.loss_scale_growth_interval = 2;
  st::trainer train(model, opt, o);
  st::token_stream data(st::byte_tokens(st::generate_corpus(20000)), 1);
  auto& p = model.parameters();
  std::vector<st::fp16> before(p.weights_data(), p.weights_data() + p.size());

  auto first = train.step(data.next_batch(8, tiny.seq));
  CHECK_FALSE(first.applied);
  CHECK(train.scaler().scale() == doctest::Approx(5e8));
  CHECK(std::memcmp(before.data(), p.weights_data(), before.size() * sizeof(st::fp16)) == 0);  // untouched

  // Replay 30 more steps against the scaler's rules: a skipped step halves the scale; the
  // second clean step in a row doubles it.
  double scale = train.scaler().scale();
  int clean_run = 0, skips = 1, growths = 0;
  for (int s = 0; s < 30; ++s) {
    auto r = train.step(data.next_batch(8, tiny.seq));
    CHECK(r.loss_scale == doctest::Approx(scale));
    if (!r.applied) {
      scale /= 2;
      clean_run = 0;
      ++skips;
    } else if (++clean_run == 2) {
      scale *= 2;
      clean_run = 0;
      ++growths;
    }
    CHECK(train.scaler().scale() == doctest::Approx(scale));
  }
  CHECK(train.scaler().skipped_steps() == skips);
  CHECK(skips >= 2);    // backed off from 1e9 more than once
  CHECK(growths >= 1);  // and grew again after clean steps
  CHECK(std::memcmp(before.data(), p.weights_data(), before.size() * sizeof(st::fp16)) != 0);  // steps were taken
}

TEST_CASE("loss_scaler rules in isolation") {
  st::loss_scaler s({.enabled = true,
                     .initial_scale = 1024,
                     .growth_factor = 2,
                     .backoff_factor = 0.5,
                     .growth_interval = 3,
                     .min_scale = 1});
  CHECK_FALSE(s.update(false));
  CHECK(s.scale() == 512);
  CHECK(s.update(true));
  CHECK(s.update(true));
  CHECK(s.scale() == 512);
  CHECK(s.update(true));
  CHECK(s.scale() == 1024);
  CHECK(s.skipped_steps() == 1);
  st::loss_scaler off;
  CHECK(off.update(false));  // disabled: never skips
  CHECK(off.scale() == 1);
}

TEST_CASE("allocator books: fp32 AdamW holds 4Ψ weights, 4Ψ gradients, 8Ψ moments") {
  st::memory_ledger ledger;
  st::sequential_model<strata::models::gpt2::model<P32>> model(ledger, tiny, st::seed{1});
  st::adamw<P32> opt(model, {});
  const std::int64_t C = tiny.d_model, L = tiny.layers;
  const std::int64_t psi = tiny.vocab * C + tiny.seq * C + L * (12 * C * C + 13 * C) + 2 * C;  // GPT-2, tied head
  CHECK(model.parameters().size() == psi);
  CHECK(st::plan<strata::models::gpt2::model<P32>>(tiny, {}).params_total == psi);  // the layers' own costs agree
  using mc = st::memory_category;
  CHECK(ledger.current(mc::parameters) == std::size_t(4 * psi));
  CHECK(ledger.current(mc::gradients) == std::size_t(4 * psi));
  CHECK(ledger.current(mc::optimizer_state) == std::size_t(8 * psi));
  CHECK(ledger.current(mc::master_weights) == 0);
}

TEST_CASE("allocator books: bf16 with fp32 master weights holds 2Ψ + 2Ψ + 4Ψ + 8Ψ") {
  st::memory_ledger ledger;
  st::sequential_model<strata::models::gpt2::model<PBF16>> model(ledger, tiny, st::seed{1});
  st::adamw<PBF16> opt(model, {});
  const auto psi = std::size_t(model.parameters().size());
  using mc = st::memory_category;
  CHECK(ledger.current(mc::parameters) == 2 * psi);
  CHECK(ledger.current(mc::gradients) == 2 * psi);
  CHECK(ledger.current(mc::master_weights) == 4 * psi);
  CHECK(ledger.current(mc::optimizer_state) == 8 * psi);
}

TEST_CASE("activations held after forward equal the layers' constexpr activation_bytes") {
  st::memory_ledger ledger;
  st::sequential_model<strata::models::gpt2::model<P32>> model(ledger, tiny, st::seed{1});
  st::token_stream data(st::byte_tokens(st::generate_corpus(20000)), 1);
  const std::int64_t B = 4, T = tiny.seq;
  auto batch = data.next_batch(B, T);
  model.forward(batch.input_view(), batch.target_view());
  // Every part's cost(config, scope), as the model declares them.
  const auto layers = strata::models::gpt2::model<P32>::layers(tiny);
  const st::cost_scope scope{.batch = B, .seq = T};
  const std::int64_t expected =
      st::embedding<P32>::cost(layers.part<0>().config, scope).activation_bytes +
      st::stack<st::transformer_block<P32>>::cost(layers.blocks().config, tiny.layers, scope).activation_bytes +
      st::layernorm<P32>::cost(layers.part<2>().config, scope).activation_bytes +
      st::lm_head<P32>::cost(layers.part<3>().config, scope).activation_bytes;
  CHECK(ledger.current(st::memory_category::activations) == std::size_t(expected));
  // Backward's transient gradient buffers are freed by the end of backward.
  model.backward();
  CHECK(ledger.current(st::memory_category::activations) == std::size_t(expected));
  CHECK(ledger.peak(st::memory_category::activations) > std::size_t(expected));
}

TEST_CASE("bad input: a token id past the vocabulary and a shape mismatch are named") {
  st::memory_ledger ledger;
  st::sequential_model<strata::models::gpt2::model<P32>> model(ledger, tiny, st::seed{1});
  std::vector<std::int32_t> tokens(2 * 8, 65), targets(2 * 8, 66);
  tokens[9] = 300;
  CHECK_THROWS_WITH_AS(model.forward({tokens.data(), {2, 8}}, {targets.data(), {2, 8}}),
                       doctest::Contains("token id 300"), st::error);
  tokens[9] = 1;
  CHECK_THROWS_WITH_AS(model.forward({tokens.data(), {2, 8}}, {targets.data(), {8, 2}}),
                       doctest::Contains("expected targets [2, 8], got [8, 2]"), st::error);
  std::vector<std::int32_t> long_seq(40, 1);
  CHECK_THROWS_WITH_AS(model.forward({long_seq.data(), {1, 40}}, {long_seq.data(), {1, 40}}),
                       doctest::Contains("sequence length 40 exceeds"), st::error);
  strata::models::gpt2::dims bad = tiny;
  bad.heads = 5;
  CHECK_THROWS_WITH_AS(st::sequential_model<strata::models::gpt2::model<P32>>(ledger, bad, st::seed{1}),
                       doctest::Contains("h.0.attn: heads = 5 does not divide d_model = 32"), st::error);
  // A layer fed the wrong width names both shapes.
  st::model_context<P32> ctx(ledger, st::seed{1});
  st::layernorm<P32> ln(st::module_scope<P32>(ctx, "ln"), {.channels = 16});
  std::vector<float> x(2 * 3 * 8);
  CHECK_THROWS_WITH_AS(ln.forward({x.data(), {2, 3, 8}}), doctest::Contains("expected input [..., 16], got [2, 3, 8]"),
                       st::error);
}

TEST_CASE("a model in another memory space allocates, frees and moves everything through it, and trains alike") {
  using strata_test::counting_space;
  auto& counts = strata_test::counts;
  counts = {};
  const auto host = train_run<PBF16>(3);
  const auto other = train_run<PBF16>(3, 8, 4, 1, counting_space());  // micro-batches of 4: two per step
  const auto host_micro = train_run<PBF16>(3, 8, 4);
  CHECK(other.losses == host_micro.losses);  // bit for bit
  CHECK(other.final_weights == host_micro.final_weights);
  CHECK(host.losses.size() == 3);
  CHECK(counts.allocations > 0);
  CHECK(counts.frees == counts.allocations);  // every buffer went back through the space
  CHECK(counts.live.empty());
  // Uploads: each parameter's initial values and the trainer's step state, then tokens and
  // targets per micro-batch (2 x 2 x 3); downloads: the losses of each micro-batch, for the mean,
  // and the step state once per step, after the update (the norm is never read before it).
  const long params = 2 + 12 * tiny.layers + 2 + 0;  // wte, wpe, 12 per block, ln_f weight and bias
  CHECK(counts.uploads == params + 1 + 2 * 2 * 3);
  CHECK(counts.downloads == 2 * 3 + 3);
}
