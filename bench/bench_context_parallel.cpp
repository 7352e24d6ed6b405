// Causal attention of whole sequences under context parallelism on the host, forward + backward:
//
//   mpirun -np 1 build/bench/bench_context_parallel     # cp = 1: the serial kernel, the baseline
//   mpirun -np 2 build/bench/bench_context_parallel     # cp = 2: ring and all-to-all
//   mpirun -np 4 build/bench/bench_context_parallel     # cp = 4 (needs 4 cores to mean anything)
//
// The context-parallel degree is the world size: the whole world is one cp group, each rank
// holding its T/cp tokens of every sequence (layers/context_split.hpp), so a run measures one
// degree and the baseline comes from the 1-rank run, as bench_tensor_parallel's does. The group
// attends the same b sequences of T tokens whatever cp is, so the ideal cp-rank time is 1/cp of
// the serial kernel's.
//
// Shapes: b = 2, T = 512, 8 query heads and 4 key/value heads of 64, fp32. Per configuration
// (name cp_attention/cp:<n>/form:<serial|ring|all_to_all>):
//   Time          forward + backward, the slowest rank's (barrier, MPI_Wtime on every rank,
//                 MPI_MAX: Google Benchmark's manual time, the same on every rank)
//   tokens_per_s  b·T / time
//   sent_B        bytes this rank sent per iteration in the cp group, from its counters
//   formula_B     context_attention_traffic's forward + backward bytes for the form
//   work_share    the (query, key) entries this rank computed per iteration over the serial
//                 kernel's for the whole batch: 1/cp when the causal split balances the work
// Only rank 0 reports; the others run the same benchmarks with a reporter that prints nothing.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "mpi_benchmark_main.hpp"

namespace st = strata;
namespace kn = strata::kernels;

namespace {

constexpr std::int64_t b = 2, T = 512, heads = 8, kv_heads = 4, head_dim = 64;

st::mpi_communicator* the_cp = nullptr;  // the world, as a group named "cp"

kn::attention_shape whole_shape() { return {b, T, heads, kv_heads, head_dim, 0}; }

std::vector<float> inputs(std::size_t n, int salt) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float((i * 37 + std::size_t(salt) * 11) % 101) / 101.0f - 0.5f;
  return v;
}

// The timed loop: fwd_bwd() once per iteration, the slowest rank's time.
template <class Step>
void timed(benchmark::State& state, Step&& fwd_bwd) {
  fwd_bwd();  // warm-up
  std::uint64_t sent = 0;
  for (auto _ : state) {
    the_cp->reset_counters();
    state.SetIterationTime(strata_bench::slowest_rank_seconds(fwd_bwd));
    sent += the_cp->counters().total().bytes_sent;
  }
  const double iters = double(state.iterations());
  state.counters["tokens_per_s"] = benchmark::Counter(iters * double(b * T), benchmark::Counter::kIsRate);
  state.counters["sent_B"] = double(sent) / iters;
}

double serial_entries() { return double(b * heads) * double(T * (T + 1) / 2); }

// cp = 1: the serial kernels over the whole sequences.
void BM_serial(benchmark::State& state) {
  const kn::attention_shape s = whole_shape();
  const auto qkv = inputs(std::size_t(b * T * s.row_width()), 1);
  const auto dout = inputs(std::size_t(b * T * s.q_width()), 2);
  std::vector<float> out(dout.size()), lse(std::size_t(b * heads * T)), dqkv(qkv.size());
  timed(state, [&] {
    kn::attention_forward(st::host{}, out.data(), lse.data(), qkv.data(), s);
    kn::attention_backward(st::host{}, dqkv.data(), dout.data(), qkv.data(), lse.data(), out.data(), s);
  });
  state.counters["formula_B"] = 0;
  state.counters["work_share"] = 1;
}

void BM_context(benchmark::State& state, st::context_form form) {
  auto& cp = *the_cp;
  const int P = cp.size();
  const st::context_split split = st::context_split::checked(T, P, cp.rank());
  kn::attention_shape local = whole_shape();
  local.seq = split.local_seq();
  const auto qkv = inputs(std::size_t(b * local.seq * local.row_width()), 1 + cp.rank());
  const auto dout = inputs(std::size_t(b * local.seq * local.q_width()), 2 + cp.rank());
  std::vector<float> out(dout.size()), dqkv(qkv.size());
  st::memory_ledger ledger;
  st::context_attention<float> core(st::group_ref(cp), split, form, ledger);
  timed(state, [&] {
    core.forward(out.data(), qkv.data(), local);
    core.backward(dqkv.data(), dout.data(), qkv.data(), out.data(), local);
  });
  const st::context_traffic traffic = core.traffic(form, local, P);
  state.counters["formula_B"] = double(traffic.forward + traffic.backward);
  // work() has counted the warm-up and every iteration, forward and backward.
  state.counters["work_share"] = double(core.work()) / (2 * (double(state.iterations()) + 1) * serial_entries());
}

}  // namespace

int main(int argc, char** argv) {
  auto world = st::launch(argc, argv);
  auto cp = world.comm().split(0, world.rank(), "cp");
  the_cp = &cp;
  const int P = cp.size();
  const std::string prefix = "cp_attention/cp:" + std::to_string(P) + "/form:";
  if (P == 1) {
    benchmark::RegisterBenchmark((prefix + "serial").c_str(), BM_serial)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  } else {
    benchmark::RegisterBenchmark((prefix + "ring").c_str(), BM_context, st::context_form::ring)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    if (heads % P == 0 && kv_heads % P == 0)
      benchmark::RegisterBenchmark((prefix + "all_to_all").c_str(), BM_context, st::context_form::all_to_all)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
  }
  return strata_bench::run_on_every_rank(argc, argv, world,
                                         {{"shape", "b=2 T=512 heads=8 kv_heads=4 head_dim=64 fp32"}});
}
