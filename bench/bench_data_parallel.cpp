// Data-parallel training steps of the example GPT-2 on the host, under mpirun:
//
//   mpirun -np 1 build/bench/bench_data_parallel      # the baseline
//   mpirun -np 2 build/bench/bench_data_parallel      # the same global batch over two ranks
//
// Reports steps/s (strong scaling: the global batch is fixed, so the ideal 2-rank figure is twice
// the 1-rank one) and `hidden`, the share of the gradient reduction's time that passed while
// backward was still running, from the per-bucket post and completion times. Every rank runs
// every iteration (the collectives must match); rank 0 reports. The iteration count is fixed
// so all ranks agree on it.
#include <benchmark/benchmark.h>

#include <cstring>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "strata/models/gpt2.hpp"
#include "mpi_benchmark_main.hpp"

namespace st = strata;

namespace {

st::world* the_world = nullptr;

void BM_dp_step(benchmark::State& state) {
  using P = st::policy<st::host, st::serial, st::fp32>;
  const int zero = static_cast<int>(state.range(0));
  const strata::models::gpt2::dims d{.vocab = 256, .seq = 64, .layers = 4, .heads = 4, .d_model = 128};
  const std::int64_t global_batch = 16;
  auto& world = the_world->comm();
  st::memory_ledger ledger;
  st::sequential_model<strata::models::gpt2::model<P>> model(ledger, d, st::seed{1});
  st::data_parallel<P, st::mpi_communicator> dp(model.parameters(), world,
                                                {.zero_stage = zero, .bucket_elems = 1 << 16});
  st::adamw<P> opt(dp, {.lr = 1e-3});  // this rank's segments (a ZeRO shard for stages >= 1)
  st::trainer_options o;
  o.schedule = {1e-3, 1e-4, 0, 1000000};
  st::trainer train(model, opt, o, dp);
  st::token_stream data(st::byte_tokens(st::generate_corpus(100000)), 1);
  auto batch = data.next_batch(global_batch, d.seq);
  train.step(batch);  // warm-up: activations allocated
  double hidden = 0;
  for (auto _ : state) {
    state.SetIterationTime(strata_bench::slowest_rank_seconds([&] { train.step(batch); }));
    hidden += dp.hidden_share();
  }
  state.counters["steps_per_s"] = benchmark::Counter(double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["tokens_per_s"] =
      benchmark::Counter(double(state.iterations() * global_batch * d.seq), benchmark::Counter::kIsRate);
  state.counters["hidden"] = hidden / double(state.iterations());
  state.counters["ranks"] = world.size();
  state.counters["buckets"] = double(dp.layout().buckets().size());
}
BENCHMARK(BM_dp_step)
    ->Name("dp_step/zero")
    ->DenseRange(0, 3)
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  auto world = st::launch(argc, argv);
  the_world = &world;
  return strata_bench::run_on_every_rank(argc, argv, world);
}
