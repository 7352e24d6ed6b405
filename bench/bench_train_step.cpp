// One full training step of the example GPT-2 (forward, backward, clip, AdamW) on the host,
// in tokens/s, for each precision and two shapes: gpt2_train's default ("small") and a 6-layer,
// 384-wide model with a 8192-token vocabulary ("medium"). The fp32 step is the baseline the
// others are read against; bench/side_by_side runs the same shapes in PyTorch beside it.
//
//   bench_train_step                          Google Benchmark, every shape and precision
//   bench_train_step --profile [steps] [cpu|cores]
//                                             per-op time of each shape and precision
//                                             (core/profile.hpp), the tables of docs/profiling.md;
//                                             cpu: by process CPU time rather than wall time;
//                                             cores: wall time, with each op's cores in use and
//                                             idle core-time (run under OMP_WAIT_POLICY=passive).
//                                             All name the host BLAS and the GEMM paths.
//   bench_train_step --serve SHAPE PRECISION  for bench/side_by_side/run.py: builds the run, says
//                                             "ready", then for each N read from stdin runs N steps
//                                             and prints their seconds (0 or end of input: exit)
//   bench_train_step --describe               one JSON line: the host BLAS and each precision's
//                                             GEMM path, for run.py's table
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <string>

#include <strata/strata.hpp>

#include "strata/models/gpt2.hpp"

namespace st = strata;

struct shape {
  const char* name;
  std::int64_t layers, d_model, heads, seq, vocab, batch;
  strata::models::gpt2::dims dims() const {
    return {.vocab = vocab, .seq = seq, .layers = layers, .heads = heads, .d_model = d_model};
  }
};
constexpr shape small{"small", 3, 96, 4, 64, 256, 16};  // gpt2_train's default
constexpr shape medium{"medium", 6, 384, 6, 256, 8192, 8};

// A serial run of the example GPT-2: model, AdamW, trainer and one batch.
template <class Precision>
struct run {
  using P = st::policy<st::host, st::serial, Precision>;
  st::memory_ledger ledger;
  st::sequential_model<strata::models::gpt2::model<P>> model;
  st::adamw<P> opt;
  st::trainer<st::sequential_model<strata::models::gpt2::model<P>>, st::adamw<P>> train;
  st::token_batch batch;
  explicit run(const shape& s)
      : model(ledger, s.dims(), st::seed{1}),
        opt(model, {.lr = 1e-3}),
        train(model, opt, options()),
        batch(st::token_stream(st::byte_tokens(st::generate_corpus(100000)), 1).next_batch(s.batch, s.seq)) {
    train.step(batch);  // warm-up: activations allocated
  }
  static st::trainer_options options() {
    st::trainer_options o;
    o.schedule = {1e-3, 1e-4, 0, 1000000};
    return o;
  }
};

// The benchmark's arguments: layers, d_model, heads, seq, vocab, batch.
template <class Precision>
static void BM_train_step(benchmark::State& state) {
  const shape s{"", state.range(0), state.range(1), state.range(2), state.range(3), state.range(4), state.range(5)};
  run<Precision> r(s);
  for (auto _ : state) {
    auto result = r.train.step(r.batch);
    benchmark::DoNotOptimize(result.loss);
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(double(s.batch * s.seq), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["params"] = double(r.model.parameters().size());
}

static void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"layers", "d", "heads", "seq", "vocab", "batch"});
  for (const shape& s : {small, medium}) b->Args({s.layers, s.d_model, s.heads, s.seq, s.vocab, s.batch});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_train_step<st::fp32>)->Name("train_step/fp32")->Apply(shapes);
BENCHMARK(BM_train_step<st::mixed<st::bf16, float>>)->Name("train_step/bf16")->Apply(shapes);
BENCHMARK(BM_train_step<st::mixed<st::fp16, float>>)->Name("train_step/fp16")->Apply(shapes);

template <class Precision>
static void profile(const shape& s, const char* precision, int steps, st::profiler::clock clock) {
  run<Precision> r(s);
  st::profiler::reset();
  st::profiler::enable(clock);
  const double t0 = st::profiler::now(), cpu0 = st::profiler::cpu_now();
  for (int i = 0; i < steps; ++i) r.train.step(r.batch);
  const double wall = st::profiler::now() - t0, cpu = st::profiler::cpu_now() - cpu0;
  std::cout << "## " << s.name << " (" << s.layers << " layers, " << s.d_model << " wide, seq " << s.seq << ", vocab "
            << s.vocab << ", batch " << s.batch << "), " << precision << ": " << double(steps * s.batch * s.seq) / wall
            << " tokens/s over " << steps << " steps\n";
  st::profiler::report(std::cout, wall, steps, cpu, st::kernels::openmp::max_threads());
  st::profiler::enable(false);
  std::cout << "\n";
}

// Steps on request, so another program can interleave its own (one line in, one line out).
template <class Precision>
static int serve(const shape& s) {
  run<Precision> r(s);
  std::cout << "ready" << std::endl;
  long steps = 0;
  while (std::cin >> steps && steps > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < steps; ++i) r.train.step(r.batch);
    std::cout << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << std::endl;
  }
  return 0;
}

// The fp32 GEMMs' library, as kernels/host/blas_core.hpp describes it.
std::string host_blas() {
  const std::string line = strata::kernels::blas_core::describe();
  return line.empty() ? "none recognised (portable GEMM, or another CBLAS)" : line;
}

// {"blas": ..., "fp32_gemm": ..., "bf16_gemm": ...}: what this process's GEMMs run on.
std::string gemm_paths() {
  const std::string blas = strata::kernels::blas_core::describe();
  std::string fp32 = blas.empty() ? "strata's portable GEMM" : "sgemm (" + blas + ")";
#if STRATA_HOST_BLAS && STRATA_HOST_FP32_AVX512
  if (strata::kernels::gemm_bf16::fp32_available() && strata::kernels::blas_core::runs_without_avx512())
    fp32 = "AVX-512 (strata's packed kernel, where C has 2 blocks or more), else " + fp32;
#endif
  std::string bf16 = strata::kernels::gemm_bf16::describe();
  if (!strata::kernels::gemm_bf16::available()) bf16 += " (" + fp32 + ")";
  return "{\"blas\": \"" + host_blas() + "\", \"fp32_gemm\": \"" + fp32 + "\", \"bf16_gemm\": \"" + bf16 + "\"}";
}

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--describe") == 0) {
    std::cout << gemm_paths() << "\n";
    return 0;
  }
  if (argc == 4 && std::strcmp(argv[1], "--serve") == 0) {
    const std::string name = argv[2], precision = argv[3];
    const shape* s = name == "small" ? &small : name == "medium" ? &medium : nullptr;
    if (!s || (precision != "fp32" && precision != "bf16")) {
      std::cerr << "bench_train_step --serve: expected small|medium and fp32|bf16, got '" << name << "' '" << precision
                << "'\n";
      return 2;
    }
    return precision == "fp32" ? serve<st::fp32>(*s) : serve<st::mixed<st::bf16, float>>(*s);
  }
  if (argc >= 2 && std::strcmp(argv[1], "--profile") == 0) {
    const int steps = argc >= 3 ? std::stoi(argv[2]) : 10;
    const std::string mode = argc >= 4 ? argv[3] : "";
    const auto clock = mode == "cpu"     ? st::profiler::clock::process_cpu
                       : mode == "cores" ? st::profiler::clock::wall_and_cpu
                                         : st::profiler::clock::wall;
    std::cout << "host BLAS: " << host_blas() << "; GEMM paths: " << gemm_paths() << "\n";
    for (const shape& s : {small, medium}) {
      profile<st::fp32>(s, "fp32", steps, clock);
      profile<st::mixed<st::bf16, float>>(s, "bf16", steps, clock);
    }
    return 0;
  }
  benchmark::AddCustomContext("host_blas", host_blas());
  benchmark::AddCustomContext("bf16_gemm", strata::kernels::gemm_bf16::describe());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
