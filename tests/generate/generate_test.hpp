// tests/generate/generate_test.hpp - what the generation suites share: the example GPT-2 and Llama
// (grouped-query: 8 query heads on 2 key/value heads) trained a few steps serially, so their
// logits stand well apart (a fresh N(0, 0.02) init gives near-ties that a last-bit difference
// could flip), a serial model holding given weights, and the prompt.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <strata/strata.hpp>

#include "strata/models/gpt2.hpp"
#include "strata/models/llama.hpp"

namespace gen_test {
namespace st = strata;

using serial_policy = st::policy<st::host, st::serial, st::fp32>;

// 4 blocks (pp 2 x 2 chunks), 4 heads (tp 2 and 4 divide them), room for 8 + 64 positions.
const strata::models::gpt2::dims gpt2_shape{.vocab = 64, .seq = 96, .layers = 4, .heads = 4, .d_model = 64};
const strata::models::llama::dims llama_shape{
    .vocab = 61, .seq = 96, .layers = 4, .heads = 8, .d_model = 64, .kv_heads = 2, .ffn = 96};
constexpr std::int64_t new_tokens = 64;
constexpr std::uint64_t seed = 7;

// The generated corpus folded into `vocab` tokens.
inline st::token_stream corpus(std::int64_t vocab) {
  auto tokens = st::byte_tokens(st::generate_corpus(20000));
  for (auto& t : tokens) t = static_cast<std::uint16_t>(t % vocab);
  return st::token_stream(std::move(tokens), 5);
}
// Eight tokens of the corpus.
inline std::vector<std::int32_t> prompt(std::int64_t vocab) { return corpus(vocab).next_batch(1, 8).inputs; }

// A serial model from `weights` (serial_parameters() order); seed 7's init when empty.
template <class Model>
struct serial_model {
  st::memory_ledger ledger;
  st::sequential_model<Model> model;
  serial_model(const typename Model::config& shape, const std::vector<double>& weights = {})
      : model(ledger, shape, st::seed{seed}) {
    auto& p = model.parameters();
    if (!weights.empty())
      st::scatter_model_weights(p, std::span<float>(p.weights_data(), std::size_t(p.size())),
                                model.serial_parameters(shape), weights);
  }
};

// The serial weights after `steps` AdamW steps (lr 3e-3) on the corpus, from seed 7's init.
template <class Model>
std::vector<double> trained_weights(const typename Model::config& shape, int steps = 30) {
  st::memory_ledger ledger;
  st::sequential_model<Model> model(ledger, shape, st::seed{seed});
  st::adamw<serial_policy> opt(model, {.lr = 3e-3});
  st::trainer train(model, opt, st::trainer_options{.schedule = {3e-3, 3e-4, 2, steps}});
  auto data = corpus(shape.vocab);
  for (int s = 0; s < steps; ++s) train.step(data.next_batch(8, shape.seq));
  auto& p = model.parameters();
  return std::vector<double>(p.weights_data(), p.weights_data() + p.size());
}

// What one generation gives: the tokens and the logits each was chosen from.
struct run_record {
  std::vector<std::int32_t> tokens;
  std::vector<std::vector<double>> logits;  // empty rows on ranks without the head
};
template <class Gen>
run_record record(Gen& gen, std::span<const std::int32_t> prompt, const st::generation& g) {
  run_record r;
  r.tokens = gen.generate(prompt, g, [&](std::int64_t, std::int32_t, std::span<const double> l) {
    r.logits.emplace_back(l.begin(), l.end());
  });
  return r;
}

// max over steps of max_v |a - b|, over max |b|: the logits' error relative to their scale.
inline double logits_error(const run_record& a, const run_record& b) {
  double worst = 0, scale = 0;
  for (std::size_t s = 0; s < a.logits.size() && s < b.logits.size(); ++s)
    for (std::size_t v = 0; v < a.logits[s].size() && v < b.logits[s].size(); ++v) {
      worst = std::max(worst, std::abs(a.logits[s][v] - b.logits[s][v]));
      scale = std::max(scale, std::abs(b.logits[s][v]));
    }
  return scale > 0 ? worst / scale : INFINITY;
}
// The smallest gap between the largest and second-largest logit over the steps, over max |logit|:
// how far the greedy choices are from a tie.
inline double smallest_margin(const run_record& r) {
  double margin = INFINITY, scale = 0;
  for (const auto& row : r.logits) {
    std::vector<double> sorted(row);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    margin = std::min(margin, sorted[0] - sorted[1]);
    for (const double l : row) scale = std::max(scale, std::abs(l));
  }
  return margin / scale;
}

}  // namespace gen_test
