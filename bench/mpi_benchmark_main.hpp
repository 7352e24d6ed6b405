// bench/mpi_benchmark_main.hpp - the main of a Google Benchmark program run under mpirun.
//
// Every rank runs every benchmark (their collectives must match); rank 0 reports, the others
// use a reporter that prints nothing and do not write --benchmark_out files over rank 0's.
#pragma once
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <strata/comm/launch.hpp>

namespace strata_bench {

class null_reporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

// Runs the registered benchmarks on every rank of `world`; context lines go in the report.
inline int run_on_every_rank(int argc, char** argv, strata::world& world,
                             const std::vector<std::pair<std::string, std::string>>& context = {}) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i)
    if (world.rank() == 0 || std::strncmp(argv[i], "--benchmark_out", 15) != 0) args.push_back(argv[i]);
  int nargs = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&nargs, args.data());
  if (benchmark::ReportUnrecognizedArguments(nargs, args.data())) return 1;
  benchmark::AddCustomContext("ranks", std::to_string(world.size()));
  for (const auto& [key, value] : context) benchmark::AddCustomContext(key, value);
  if (world.rank() == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    null_reporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
  return 0;
}

// One timed iteration: op() between a barrier and an MPI_MAX of every rank's wall time. Returns
// the slowest rank's seconds, the same on every rank: as Google Benchmark's manual time it makes
// every rank run the same number of iterations.
template <class Op>
double slowest_rank_seconds(Op&& op) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  op();
  double dt = MPI_Wtime() - t0;
  MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return dt;
}

}  // namespace strata_bench
