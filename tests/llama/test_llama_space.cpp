// The example Llama in a memory space that claims not to be host memory and counts what crosses
// it (tests/unit/counting_space.hpp), as a GPU's would: its layers (rotary grouped-query
// attention, RMSNorm, SwiGLU, an embedding with no position table, an untied head) allocate, free
// and move every byte through the space, cross it only with each parameter's initial values,
// the tokens and targets in and the losses and each step's state out, and train bit for bit as
// on the host.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include <strata/strata.hpp>

#include "../unit/counting_space.hpp"
#include "strata/models/llama.hpp"

namespace st = strata;

namespace {

using P = st::policy<st::host, st::serial, st::mixed<st::bf16, float>>;
const strata::models::llama::dims tiny{
    .vocab = 256, .seq = 16, .layers = 2, .heads = 4, .d_model = 32, .kv_heads = 2, .ffn = 64};

struct run_result {
  std::vector<double> losses;
  std::vector<float> weights;
};

run_result train_run(int steps, const st::memory_space& space) {
  st::memory_ledger ledger(space);
  st::sequential_model<strata::models::llama::model<P>> model(ledger, tiny, st::seed{1});
  st::adamw<P> opt(model, {.lr = 3e-3, .weight_decay = 0.1});
  st::trainer_options o;
  o.micro_batch = 4;  // two micro-batches per step of 8
  o.schedule = {3e-3, 3e-4, 1, steps};
  st::trainer train(model, opt, o);
  st::token_stream data(st::byte_tokens(st::generate_corpus(50000)), 1);
  run_result r;
  for (int s = 0; s < steps; ++s) r.losses.push_back(train.step(data.next_batch(8, tiny.seq)).loss);
  auto& p = model.parameters();
  std::vector<st::bf16> w(static_cast<std::size_t>(p.size()));
  std::memcpy(w.data(), p.weights_data(), w.size() * sizeof(w[0]));  // host memory underneath
  for (const auto x : w) r.weights.push_back(st::convert<float>(x));
  return r;
}

}  // namespace

TEST_CASE(
    "the Llama example in another memory space moves only tokens in and losses and step states out, and trains alike") {
  auto& counts = strata_test::counts;
  counts = {};
  const auto other = train_run(3, strata_test::counting_space());
  const auto host = train_run(3, st::host_memory());
  CHECK(other.losses == host.losses);  // bit for bit
  CHECK(other.weights == host.weights);
  CHECK(counts.allocations > 0);
  CHECK(counts.frees == counts.allocations);  // every buffer went back through the space
  CHECK(counts.live.empty());
  // Uploads: each parameter's initial values (wte; per block ln_1, qkv, proj, ln_2, gate_up, down;
  // norm, lm_head) and the trainer's step state, then tokens and targets per micro-batch
  // (2 x 2 x 3); downloads: each micro-batch's loss, and the step state once per step.
  const long params = 1 + 6 * tiny.layers + 2;
  CHECK(counts.uploads == params + 1 + 2 * 2 * 3);
  CHECK(counts.downloads == 2 * 3 + 3);
}
