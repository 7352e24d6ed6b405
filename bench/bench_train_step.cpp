// One full training step of the example GPT-2 (forward, backward, clip, AdamW) on the host,
// in tokens/s, for each precision. The fp32 step is the baseline the others are read against.
#include <benchmark/benchmark.h>

#include <strata/strata.hpp>

#include "gpt2/gpt2.hpp"

namespace st = strata;

template <class Precision>
static void BM_train_step(benchmark::State& state) {
  using P = st::policy<st::host, st::serial, Precision>;
  const gpt2::dims d{.vocab = 256, .seq = 64, .layers = 2, .heads = 4, .d_model = 128};
  const std::int64_t batch = state.range(0);
  st::memory_ledger ledger;
  st::sequential_model<gpt2::model<P>> model(ledger, d, st::seed{1});
  st::adamw<P> opt(model, {.lr = 1e-3});
  st::trainer_options o;
  o.schedule = {1e-3, 1e-4, 0, 1000000};
  st::trainer train(model, opt, o);
  st::token_stream data(st::byte_tokens(st::generate_corpus(100000)), 1);
  auto b = data.next_batch(batch, d.seq);
  train.step(b);  // warm-up: activations allocated
  for (auto _ : state) {
    auto r = train.step(b);
    benchmark::DoNotOptimize(r.loss);
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(double(batch * d.seq), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["params"] = double(model.parameters().size());
}
BENCHMARK(BM_train_step<st::fp32>)->Name("train_step/fp32")->Arg(8)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_train_step<st::mixed<st::bf16, float>>)->Name("train_step/bf16")->Arg(8)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_train_step<st::mixed<st::fp16, float>>)->Name("train_step/fp16")->Arg(8)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();

BENCHMARK_MAIN();
