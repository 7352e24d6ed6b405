// Collective bandwidth of strata's MPI engine, in the conventions of nccl-tests.
//
//   mpirun -np 4 ./bench_collectives [--benchmark_filter=all_reduce] [--benchmark_min_time=0.2]
//
// A message-size sweep (1 KiB .. 64 MiB, x4) of all_reduce, all_gather, reduce_scatter and
// all_to_all on fp32 host buffers over the world communicator, plus a bf16 all_reduce (staged in fp32: see
// mpi_communicator.hpp) and the same fp32 all-reduce through MPI_Allreduce directly, so the cost
// of strata's nonblocking call + polling wait shows as a ratio. S ("bytes") is the all-reduce
// buffer, the all-gather's output, the reduce-scatter's input and the all-to-all's input, as in
// nccl-tests. Per size:
//   Time        per call, the slowest rank's (each iteration starts at a barrier, is timed on
//               every rank and reduced with MPI_MAX; that is also Google Benchmark's manual
//               time, so every rank runs the same number of iterations)
//   algbw_GBps  S / time
//   busbw_GBps  algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather, reduce_scatter and
//               all_to_all:
//               the per-rank link traffic of a ring, comparable across rank counts
// Only rank 0 reports; the others run the same benchmarks with a reporter that prints nothing.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <strata/comm/launch.hpp>

#include "mpi_benchmark_main.hpp"
#include <strata/comm/mpi_communicator.hpp>
#include <strata/core/dtype.hpp>

namespace {

strata::world* the_world = nullptr;
strata::mpi_communicator& comm() { return the_world->comm(); }

// Times op() as described at the top; fills the bandwidth counters for `bytes` per call.
template <class Op>
void timed(benchmark::State& state, double bytes, double bus_factor, Op&& op) {
  double total = 0;
  for (auto _ : state) {
    const double dt = strata_bench::slowest_rank_seconds(op);
    state.SetIterationTime(dt);
    total += dt;
  }
  const double t = total / static_cast<double>(state.iterations());
  state.counters["bytes"] = bytes;
  state.counters["algbw_GBps"] = bytes / t / 1e9;
  state.counters["busbw_GBps"] = bytes / t / 1e9 * bus_factor;
}

double ranks() { return static_cast<double>(comm().size()); }
// Elements per rank so that n ranks' parts make (about) `bytes` of T.
template <class T>
std::size_t block_of(std::int64_t bytes) {
  const std::size_t b = static_cast<std::size_t>(bytes) / (sizeof(T) * static_cast<std::size_t>(comm().size()));
  return b > 0 ? b : 1;
}

template <class T>
void BM_all_reduce(benchmark::State& state) {
  const std::size_t count = static_cast<std::size_t>(state.range(0)) / sizeof(T);
  std::vector<T> data(count, T(0.0f));  // zeros: sums stay finite over any number of calls
  const double n = ranks();
  timed(state, double(count * sizeof(T)), 2 * (n - 1) / n, [&] { comm().all_reduce(data); });
}

void BM_mpi_native_all_reduce(benchmark::State& state) {
  const std::size_t count = static_cast<std::size_t>(state.range(0)) / sizeof(float);
  std::vector<float> data(count, 0.0f);
  const double n = ranks();
  timed(state, double(count * sizeof(float)), 2 * (n - 1) / n,
        [&] { MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); });
}

void BM_all_gather(benchmark::State& state) {
  const std::size_t block = block_of<float>(state.range(0));
  const std::size_t n = static_cast<std::size_t>(comm().size());
  std::vector<float> in(block, 1.0f), out(block * n);
  timed(state, double(block * n * sizeof(float)), (ranks() - 1) / ranks(), [&] { comm().all_gather(in, out); });
}

void BM_reduce_scatter(benchmark::State& state) {
  const std::size_t block = block_of<float>(state.range(0));
  const std::size_t n = static_cast<std::size_t>(comm().size());
  std::vector<float> in(block * n, 0.0f), out(block);
  timed(state, double(block * n * sizeof(float)), (ranks() - 1) / ranks(), [&] { comm().reduce_scatter(in, out); });
}

void BM_all_to_all(benchmark::State& state) {
  const std::size_t block = block_of<float>(state.range(0));
  const std::size_t n = static_cast<std::size_t>(comm().size());
  std::vector<float> in(block * n, 1.0f), out(block * n);
  timed(state, double(block * n * sizeof(float)), (ranks() - 1) / ranks(), [&] { comm().all_to_all(in, out); });
}

constexpr std::int64_t smallest = 1 << 10, largest = std::int64_t{64} << 20;

void sweep(benchmark::internal::Benchmark* b) {
  b->RangeMultiplier(4)->Range(smallest, largest)->ArgName("bytes")->UseManualTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_all_reduce<float>)->Name("all_reduce/fp32")->Apply(sweep);
BENCHMARK(BM_mpi_native_all_reduce)->Name("mpi_native_all_reduce/fp32")->Apply(sweep);
BENCHMARK(BM_all_reduce<strata::bf16>)->Name("all_reduce/bf16")->Apply(sweep);
BENCHMARK(BM_all_gather)->Name("all_gather/fp32")->Apply(sweep);
BENCHMARK(BM_reduce_scatter)->Name("reduce_scatter/fp32")->Apply(sweep);
BENCHMARK(BM_all_to_all)->Name("all_to_all/fp32")->Apply(sweep);

}  // namespace

int main(int argc, char** argv) {
  auto world = strata::launch(argc, argv);
  the_world = &world;
  return strata_bench::run_on_every_rank(argc, argv, world, {{"engine", "strata MPI (host buffers)"}});
}
