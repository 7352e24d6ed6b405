// One GPT-2-style transformer block, forward + backward, under tensor parallelism on the host:
//
//   mpirun -np 1 build/bench/bench_tensor_parallel     # t = 1, the baseline
//   mpirun -np 2 build/bench/bench_tensor_parallel     # t = 2, with and without sequence parallelism
//   mpirun -np 4 build/bench/bench_tensor_parallel     # t = 4 (needs 4 cores to mean anything)
//
// The tensor-parallel degree t is the world size: the whole world is one tp group, so a run
// measures one degree and the t = 1 figures come from the 1-rank run. (Splitting the world into
// groups of t would let one run host every degree, but the groups would then share the cores
// and the time of a small group would say little.) Every rank sees the same batch; one group
// processes b·s tokens per iteration whatever t is, so the ideal t-rank time is 1/t of t = 1's.
//
// Shapes: b = 4, s = 128, h = 256, 8 heads, MLP width 4h, fp32: GPT-2 small's structure at a
// size one core runs in tens of milliseconds. Per configuration (name tp_block/t:<t>/sp:<0|1>):
//   Time           forward + backward, the slowest rank's (barrier, MPI_Wtime on every rank,
//                  MPI_MAX: Google Benchmark's manual time, the same on every rank, so every
//                  rank runs the same number of iterations)
//   tokens_per_s   b·s / time
//   sent_B         bytes sent per rank per iteration in the tp group, from its counters (the
//                  ring volumes of counters.hpp), averaged over the measured iterations
//   megatron_B     the analytic figure, S = b·s·h·4 bytes:
//                    TP: 4 all-reduces of S (2 forward, 2 backward)        4 · 2(t-1)/t · S
//                    SP: the same volume as all-gathers and reduce-scatters, plus 2 all-gathers
//                        re-done in backward (2 · (t-1)/t · S) and the LayerNorms' gain and
//                        bias gradients summed (2 all-reduces of 2h fp32: 2 · 2(t-1)/t · 8h)
//   act_B          activation bytes held after forward (memory_ledger, input excluded)
//   act_formula_B  the block's own cost, transformer_block<P>::cost(cfg, {.tp, .batch, .seq})
//                  .activation_bytes (layers/cost.hpp)
// Only rank 0 reports; the others run the same benchmarks with a reporter that prints nothing.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>

#include <strata/strata.hpp>

#include "mpi_benchmark_main.hpp"

namespace st = strata;

namespace {

using P = st::policy<st::host, st::serial, st::fp32>;
using block_t = st::transformer_block<P>;
constexpr std::int64_t b = 4, s = 128, h = 256, heads = 8;

st::mpi_communicator* the_tp = nullptr;  // the world, as a group named "tp"

double megatron_bytes(int t, bool sp) {
  const double ring = double(t - 1) / t, S = double(b * s * h * sizeof(float));
  double bytes = 4 * 2 * ring * S;
  if (sp) bytes += 2 * ring * S + 2 * 2 * ring * double(2 * h * sizeof(float));
  return bytes;
}

void BM_tp_block(benchmark::State& state, bool sp) {
  auto& tp = *the_tp;
  const int t = tp.size();
  // The split is not part of the config: the block reads it from its context's tensor group.
  const block_t::config cfg{.channels = h, .heads = heads, .hidden = 4 * h};
  const std::int64_t local_s = sp ? s / t : s;

  st::memory_ledger ledger;
  st::model_context<P> ctx(ledger, st::seed{1}, st::tensor_parallel(st::group_ref(tp), sp));
  block_t block(st::module_scope<P>(ctx, "h.0"), cfg);
  ctx.params().materialize();
  const auto n = std::size_t(b * local_s * h);
  st::buffer<float> x(ledger, st::memory_category::workspace, n), dy(ledger, st::memory_category::workspace, n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = float((i * 37 + std::size_t(tp.rank())) % 101) / 101.0f - 0.5f;
    dy[i] = float((i * 13) % 89) / 89.0f - 0.5f;
  }
  const st::tensor_view<const float> input{x.data(), {b, local_s, h}};

  // Warm-up: allocates the activations, which are measured after this first forward.
  const std::size_t before = ledger.current(st::memory_category::activations);
  block.forward(input);
  const double held = double(ledger.current(st::memory_category::activations) - before);
  block.backward(dy);

  std::uint64_t sent = 0;
  for (auto _ : state) {
    tp.reset_counters();
    state.SetIterationTime(strata_bench::slowest_rank_seconds([&] {
      block.forward(input);
      block.backward(dy);
    }));
    sent += tp.counters().total().bytes_sent;
  }
  const double iters = double(state.iterations());
  state.counters["tokens_per_s"] = benchmark::Counter(iters * double(b * s), benchmark::Counter::kIsRate);
  state.counters["sent_B"] = double(sent) / iters;
  state.counters["megatron_B"] = megatron_bytes(t, sp);
  state.counters["act_B"] = held;
  const st::cost_scope scope{.tp = ctx.tensor().split(), .batch = b, .seq = s};
  state.counters["act_formula_B"] = double(block_t::cost(cfg, scope).activation_bytes);
}

}  // namespace

int main(int argc, char** argv) {
  auto world = st::launch(argc, argv);
  auto tp = world.comm().split(0, world.rank(), "tp");
  the_tp = &tp;
  const int t = tp.size();
  for (bool sp : {false, true}) {
    if (sp && t == 1) continue;  // nothing to split the sequence over
    const std::string name = "tp_block/t:" + std::to_string(t) + "/sp:" + (sp ? "1" : "0");
    benchmark::RegisterBenchmark(name.c_str(), BM_tp_block, sp)->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  return strata_bench::run_on_every_rank(argc, argv, world, {{"shape", "b=4 s=128 h=256 heads=8 hidden=1024 fp32"}});
}
