// strata_gpu_layouts - one small GPT-2 run through st::training on GPUs under a layout given on
// the command line, for scripts/gpu-check's multi-rank rows (launch it with mpirun -np N).
//
//   strata_gpu_layouts [--dp N] [--cp N] [--cp-form ring|all_to_all] [--tp N] [--sp] [--pp N]
//                      [--microbatches M] [--zero S] [--steps 5] [--batch 8] [--json FILE]
//
// fp32, 4 layers, 256 wide, 8 heads, seq 256, vocabulary 4096, on the generated corpus; writes
// {"layout": ..., "engine": ..., "losses": [...], "tokens_per_s": ...} (rank 0) so that runs
// under different layouts can be compared with the single-rank run step by step.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <strata/comm/gpu_groups.cuh>
#include <strata/kernels/all.hpp>
#include <strata/strata.hpp>

#include "strata/models/gpt2.hpp"

namespace st = strata;

namespace {

using flag_layout =
    st::parallel<st::data<st::dynamic, st::zero<st::dynamic>>, st::context<st::dynamic, st::dynamic_context_form>,
                 st::tensor<st::dynamic, st::dynamic_sequence_parallel>,
                 st::pipeline<st::dynamic, st::dynamic_schedule, st::dynamic, st::dynamic>>;
using P = st::policy<st::cuda, flag_layout, st::fp32>;

int run(st::world& world, int argc, char** argv) {
  st::layout_overrides layout{.dp = st::dynamic,
                              .cp = 1,
                              .tp = 1,
                              .pp = 1,
                              .microbatches = 1,
                              .zero_stage = 0,
                              .sequence_parallel = 0,
                              .virtual_chunks = 1,
                              .context_form = "ring",
                              .schedule = "1f1b"};
  int steps = 5;
  std::int64_t batch = 8;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--sp") {
      layout.sequence_parallel = 1;
      continue;
    }
    STRATA_CHECK(i + 1 < argc, "strata_gpu_layouts: ", flag, " needs a value");
    const std::string value = argv[++i];
    const int n = std::atoi(value.c_str());
    if (flag == "--dp") layout.dp = n;
    else if (flag == "--cp") layout.cp = n;
    else if (flag == "--cp-form") layout.context_form = value;
    else if (flag == "--tp") layout.tp = n;
    else if (flag == "--pp") layout.pp = n;
    else if (flag == "--microbatches") layout.microbatches = n;
    else if (flag == "--zero") layout.zero_stage = n;
    else if (flag == "--steps") steps = n;
    else if (flag == "--batch") batch = n;
    else if (flag == "--json") json = value;
    else st::fail("strata_gpu_layouts: unknown flag ", flag);
  }
  st::gpu::use_local_device(world);
  const strata::models::gpt2::dims dims{.vocab = 4096, .seq = 256, .layers = 4, .heads = 8, .d_model = 256};
  st::training_options o{.layout = layout,
                         .seed = st::seed{7},
                         .optimizer = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1},
                         .memory = &st::gpu::device_memory()};
  o.trainer.grad_clip = 1.0;
  st::training<strata::models::gpt2::model<P>> run(world, dims, o);
  st::token_stream data(st::byte_tokens(st::generate_corpus()), 7, st::data_order::sequential);
  std::vector<double> losses, tokens_per_s;
  for (int s = 0; s < steps; ++s) {
    const auto r = run.step(data.next_batch(batch, dims.seq));
    losses.push_back(r.loss);
    tokens_per_s.push_back(r.seconds > 0 ? double(r.tokens) / r.seconds : 0.0);
  }
  st::gpu::check_device_errors();
  if (world.rank() != 0) return 0;
  const auto& l = run.layout();
  nlohmann::ordered_json result;
  result["layout"] = "dp" + std::to_string(l.dp) +
                     (l.cp > 1 ? " cp" + std::to_string(l.cp) + (l.context_form == "ring" ? "" : " a2a") : "") + " tp" +
                     std::to_string(l.tp) + (l.sequence_parallel ? "+sp" : "") + " pp" + std::to_string(l.pp) +
                     " zero" + std::to_string(l.zero_stage);
  result["ranks"] = world.size();
  result["engine"] = run.groups().engine();
  result["losses"] = losses;  // a non-finite loss is null
  // The median of the steps after the first (it allocates and warms up).
  std::vector<double> later(tokens_per_s.begin() + (tokens_per_s.size() > 1 ? 1 : 0), tokens_per_s.end());
  std::sort(later.begin(), later.end());
  result["tokens_per_s"] = st::json_number(later.empty() ? 0.0 : later[later.size() / 2]);
  const std::string out = result.dump();
  std::printf("%s\n", out.c_str());
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    STRATA_CHECK(f, "strata_gpu_layouts: cannot write ", json);
    std::fprintf(f, "%s\n", out.c_str());
    std::fclose(f);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<st::world> w;
  try {
    w.emplace(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata_gpu_layouts: error: %s\n", e.what());
    return 1;
  }
  return w->run([&] { return run(*w, argc, argv); }, "strata_gpu_layouts");
}
