// Checkpoint save and load of the example GPT-2 (one rank), in MB/s of checkpoint bytes, beside
// the baseline of writing the same number of bytes with one fwrite (no encoding, no CRC, no
// fsync). The ratio is what durability and the self-describing format cost.
//   build/bench/bench_checkpoint            (writes under ./bench_checkpoint_tmp)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <filesystem>
#include <vector>

#include <strata/strata.hpp>

#include "strata/models/gpt2.hpp"

namespace st = strata;
namespace fs = std::filesystem;

namespace {

using P = st::policy<st::host, st::serial, st::mixed<st::bf16, float>>;
const strata::models::gpt2::dims shape{.vocab = 256, .seq = 64, .layers = 4, .heads = 4, .d_model = 256};
const std::string dir = "bench_checkpoint_tmp";

struct setup {
  st::memory_ledger ledger;
  st::sequential_model<strata::models::gpt2::model<P>> model{ledger, shape, st::seed{1}};
  st::adamw<P> opt{model, {}};
  st::checkpointer ckpt{{dir, 1}, st::group_ref(), {{"world", 1}}, {{"layers", shape.layers}}};
  st::train_state_ref<P> state() { return {model.parameters(), opt, {}}; }
  std::uintmax_t bytes() const {
    std::uintmax_t n = 0;
    for (const auto& f : fs::recursive_directory_iterator(dir))
      if (f.is_regular_file()) n += f.file_size();
    return n;
  }
};

void BM_save(benchmark::State& state) {
  fs::remove_all(dir);
  setup s;
  int step = 0;
  for (auto _ : state) s.ckpt.save(st::train_progress{++step}, s.state());
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(s.bytes()));
  state.counters["checkpoint_MB"] = double(s.bytes()) / 1e6;
}

void BM_load(benchmark::State& state) {
  fs::remove_all(dir);
  setup s;
  const std::string saved = s.ckpt.save(st::train_progress{1}, s.state());
  for (auto _ : state) benchmark::DoNotOptimize(s.ckpt.load(saved, s.state()).progress.step);
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(s.bytes()));
}

// The baseline: the same byte count in one fwrite to one file, no fsync.
void BM_plain_write(benchmark::State& state) {
  fs::remove_all(dir);
  std::uintmax_t n = 0;
  {
    setup s;
    s.ckpt.save(st::train_progress{1}, s.state());
    n = s.bytes();
  }
  const std::vector<unsigned char> bytes(n, 7);
  for (auto _ : state) {
    std::FILE* f = std::fopen((dir + "/plain.bin").c_str(), "wb");
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(n));
}

}  // namespace

BENCHMARK(BM_plain_write)->Name("checkpoint/plain_fwrite_baseline")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_save)->Name("checkpoint/save")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_load)->Name("checkpoint/load")->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
