// examples/gpt2/train_run.hpp - gpt2_train's run: the flags, and one training of a model family's
// model (examples/common/model_families.hpp) on a device, the same on the host and on GPUs.
//
// train<Family, Device, Precision> builds one strata::training of the family's model under
// st::policy<Device, flag_layout, Precision> and runs it: plan, start-up checks, checkpoints,
// the loop with metrics, export and a sample. train_gpt2.cpp instantiates it for st::host (also
// with the emulated device memory); train_cuda_*.cu, compiled by nvcc, for st::cuda.
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include <strata/strata.hpp>

#include "common/model_families.hpp"
#include "common/model_families_hf.hpp"

namespace gpt2_train {

namespace st = strata;

// The models gpt2_train trains (examples/common/model_families.hpp).
using example_models::gpt2_family;
using example_models::llama_family;

// What a device adds to a run: where its memory is, and what is said about it.
struct device_hooks {
  const st::memory_space* memory = nullptr;  // null: host memory
  std::function<long()> crossings;           // copies between the space and the host so far, if counted
  std::function<void()> after_steps;         // e.g. surface the GPU's recorded errors
  std::string step_suffix;                   // appended to each progress line
};

struct run_options {
  std::string model = "gpt2";
  example_models::model_shape shape{.vocab = 256, .seq = 64, .layers = 3, .heads = 4, .d_model = 96};  // CPU-sized
  std::int64_t batch = 16, micro_batch = 0;
  int steps = 250, warmup = 10;
  double lr = 3e-3, grad_clip = 1.0;
  std::uint64_t seed = 1337;
  std::string precision = "fp32", metrics, data;
  int sample_tokens = 60;
  std::string prompt;                   // text (byte tokens); empty: "The " or token 0
  std::vector<std::int32_t> prompt_ids;  // token ids instead of text
  double temperature = 0.8;             // 0: greedy
  std::int64_t top_k = 0;               // 0: every token
  int dp = st::dynamic, zero = 0, tp = 1;
  bool sp = false;
  std::string recompute = "none";
  int pp = 1, microbatches = 0, virtual_chunks = 1;
  std::string schedule = "1f1b", hw, export_path, init_from;
  std::string save_dir, data_order = "shuffled", device = "host";
  int save_every = 0, keep = 0;
  bool resume = false;
  std::vector<std::int64_t> stage_layers;
  std::int64_t bucket_elems = 1 << 20;
  std::string progress = "auto";
};

// Six significant digits, what one step's timings are worth: the schedule's bubble of 1/9
// reads 0.111111.
inline nlohmann::ordered_json six_digits(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", v);
  return st::json_number(std::strtod(text, nullptr));
}

// The per-stage busy and idle seconds of the last step, gathered over the pipeline group, as the
// metrics' "pipeline" object (with the schedule's analytic bubble beside them).
template <class Model>
std::string pipeline_json(Model& model, st::mpi_communicator& pp) {
  const auto& last = model.last_step();
  const double mine[2] = {last.busy_seconds, last.idle_seconds};
  std::vector<double> all(2 * std::size_t(pp.size()));
  pp.all_gather(std::span<const double>(mine, 2), std::span<double>(all));
  const auto& shape = model.placement().shape;
  nlohmann::ordered_json stages = nlohmann::ordered_json::array();
  for (int q = 0; q < pp.size(); ++q) {
    const double busy = all[2 * std::size_t(q)], idle = all[2 * std::size_t(q) + 1];
    stages.push_back({{"busy_s", six_digits(busy)},
                      {"idle_s", six_digits(idle)},
                      {"idle_share", six_digits(busy + idle > 0 ? idle / (busy + idle) : 0.0)}});
  }
  nlohmann::ordered_json pipeline;
  pipeline["schedule"] = std::string(st::schedule_label(shape.schedule));
  pipeline["analytic_bubble"] = six_digits(st::analytic_bubble(shape));
  pipeline["stages"] = std::move(stages);
  return pipeline.dump();
}

// Every setting of the layout comes from the flags: degrees, ZeRO stage, sequence parallelism,
// schedule, micro-batches and chunks are all left to the launch.
using flag_layout = st::parallel<st::data<st::dynamic, st::zero<st::dynamic>>,
                                 st::tensor<st::dynamic, st::dynamic_sequence_parallel>,
                                 st::pipeline<st::dynamic, st::dynamic_schedule, st::dynamic, st::dynamic>>;

inline st::layout_overrides layout_flags(const run_options& o) {
  return {.dp = o.dp, .tp = o.tp, .pp = o.pp, .microbatches = o.microbatches > 0 ? o.microbatches : 1,
          .zero_stage = o.zero, .sequence_parallel = o.sp ? 1 : 0, .virtual_chunks = o.virtual_chunks,
          .schedule = o.schedule};
}

template <class Family, class Device, class Precision>
int train(const run_options& o, st::world& world, const device_hooks& dev) {
  using P = st::policy<Device, flag_layout, Precision>;
  using model_decl = typename Family::template model<P>;
  const typename Family::dims dims = Family::shape(o.shape);
  const st::layout_config layout = st::resolve_layout<flag_layout>(world.size(), layout_flags(o));
  const bool lead = world.rank() == 0;
  const bool pipelined = layout.pp > 1 || layout.virtual_chunks > 1;

  // The plan, before anything is allocated: with --hw, a layout that does not fit the device
  // stops here on every rank, naming the numbers. The loop reports FLOP/s and MFU from it.
  std::optional<st::plan_result> plan;
  const st::hw::device_spec* device = nullptr;
  {
    st::plan_setup setup;
    setup.layout = layout;
    setup.recompute = st::parse_recompute_mode(o.recompute);
    setup.schedule = st::parse_pipeline_schedule(layout.schedule);
    const std::int64_t micro = o.micro_batch > 0 && !pipelined ? o.micro_batch : o.batch / layout.dp / layout.microbatches;
    try {
      if (micro > 0 && o.batch % (layout.dp * micro) == 0)
        plan = st::plan_model<model_decl>(dims, {.micro = micro, .global = o.batch}, setup);
    } catch (const st::error&) {
      // A shape the layout cannot split: the start-up checks below name it in their words.
    }
    if (plan && lead)
      std::printf("plan: %.1f MB model state + %.1f MB activations per rank, %.3g FLOP per step\n",
                  double(plan->model_state_bytes()) / 1e6, double(plan->activation_bytes) / 1e6, plan->flops_per_step);
    if (plan && !o.hw.empty()) {
      device = st::hw::find(o.hw);
      STRATA_CHECK(device != nullptr, "gpt2_train: --hw ", o.hw, " is not a known device (a100_40gb, a100_80gb, "
                   "h100_80gb, h200_141gb)");
      plan->check_fits(*device);
    }
  }

  st::training_options topts{.layout = layout_flags(o),
                             .blocks_per_virtual_stage = o.stage_layers,
                             .recompute = st::parse_recompute_mode(o.recompute),
                             .seed = st::seed{o.seed},
                             .optimizer = {.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1},
                             .bucket_elems = o.bucket_elems,
                             .memory = dev.memory};
  topts.trainer.micro_batch = pipelined ? 0 : o.micro_batch;
  topts.trainer.schedule = {o.lr, o.lr / 10, std::min(o.warmup, o.steps), o.steps};
  topts.trainer.grad_clip = o.grad_clip;
  // The data before the weights: a glob that matches nothing, or a token past the vocabulary,
  // fails here rather than after a large --init-from file is read.
  if (o.data.empty())
    STRATA_CHECK(dims.vocab >= 256, "gpt2_train: the generated corpus is byte-level and needs --vocab >= 256, got ",
                 dims.vocab);
  st::token_stream data = o.data.empty()
                              ? st::token_stream(st::byte_tokens(st::generate_corpus()), o.seed, st::parse_data_order(o.data_order))
                              : st::token_stream::from_glob(o.data, dims.vocab, o.seed, st::parse_data_order(o.data_order));
  if (!o.init_from.empty()) {
    // Every rank reads the file and keeps its own pieces, before the optimizer copies the weights.
    std::vector<std::string> notes;
    topts.initial_weights = example_models::import_hf(o.init_from, dims, &notes);
    if (lead) {
      std::printf("init-from: %s (%zu weights)\n", o.init_from.c_str(), topts.initial_weights.size());
      for (const auto& note : notes) std::printf("init-from: %s\n", note.c_str());
    }
  }
  st::training<model_decl> run(world, dims, std::move(topts));
  auto& model = run.model();
  auto& mesh = run.mesh();

  // A batch the ranks or the schedule cannot share fails here, on every rank.
  const auto rows = run.synchronizer().local_rows(o.batch).second;
  STRATA_CHECK(!pipelined || rows % layout.microbatches == 0, "gpt2_train: ", rows, " sequences per data-parallel rank (--batch ",
               o.batch, ") do not split into --microbatches ", layout.microbatches);

  // Checkpoints: every rank saves its pieces; --resume continues from the newest complete one,
  // whatever layout saved it. Without --resume the directory must hold no other run's.
  std::optional<st::checkpointer> checkpoints;
  int first_step = 0;
  if (!o.save_dir.empty()) {
    checkpoints.emplace(run.make_checkpointer({o.save_dir, o.keep}));
    if (!o.resume) {
      checkpoints->start_new_run();
    } else {
      if (const auto loaded = run.resume(*checkpoints)) {
        data.seek(loaded->progress.data_position);
        first_step = loaded->progress.step;
        if (lead)
          std::printf("resume: %s (step %d, saved under %s)\n", loaded->path.c_str(), first_step,
                      loaded->layout.dump().c_str());
      } else if (lead) {
        std::printf("resume: no complete checkpoint in '%s' yet; starting at step 0\n", o.save_dir.c_str());
      }
    }
  }
  std::unique_ptr<st::metrics_file> metrics;
  if (lead && !o.metrics.empty()) metrics = std::make_unique<st::metrics_file>(o.metrics, first_step > 0);
  const auto fault = st::fault_injection::from_env();
  std::string last_saved;

  const std::int64_t micro_batch =
      pipelined ? o.batch / layout.dp / layout.microbatches : (o.micro_batch ? o.micro_batch : o.batch / layout.dp);
  if (lead) {
    std::printf("gpt2_train: %s, %lld layers, %lld heads", Family::name, (long long)dims.layers, (long long)dims.heads);
    if constexpr (std::is_same_v<Family, llama_family>) std::printf(" (%lld key/value)", (long long)dims.kv());
    std::printf(", d_model %lld, ffn %lld, seq %lld, vocab %lld: %lld parameters%s, %s\n", (long long)dims.d_model,
                (long long)dims.ffn_width(), (long long)dims.seq, (long long)dims.vocab,
                (long long)model.parameters().size(), layout.tp > 1 || layout.pp > 1 ? " per rank" : "", o.precision.c_str());
    std::printf("data: %s (%zu tokens); batch %lld x %lld tokens, micro-batch %lld; dp %d, ZeRO-%d; tp %d%s; "
                "recompute %s\n",
                o.data.empty() ? "generated corpus" : o.data.c_str(), data.size(), (long long)o.batch,
                (long long)dims.seq, (long long)micro_batch, layout.dp, layout.zero_stage, layout.tp,
                o.sp ? " + sequence parallel" : "", o.recompute.c_str());
    if (pipelined) {
      const auto& sh = model.placement().shape;
      std::printf("pipeline: %d stages, %s, %d micro-batches of %lld, %d chunks per stage; analytic bubble %.3f\n",
                  sh.stages, std::string(st::schedule_label(sh.schedule)).c_str(), sh.microbatches,
                  (long long)micro_batch, sh.chunks, st::analytic_bubble(sh));
    }
  }
  st::progress progress(o.steps, st::parse_progress_style(o.progress));
  long step_crossings = 0;  // the most copies one step made between the host and the device
  for (int s = first_step; s < o.steps; ++s) {
    if (fault.kill_at_step == s + 1 && fault.targets(world.rank(), world.size())) st::fault_injection::die("before a step");
    run.groups().reset_counters();
    const long crossed = dev.crossings ? dev.crossings() : 0;
    auto r = run.step(data.next_batch(o.batch, dims.seq));
    if (dev.crossings) step_crossings = std::max(step_crossings, dev.crossings() - crossed);
    if (checkpoints && o.save_every > 0 && (s + 1) % o.save_every == 0) last_saved = run.save(*checkpoints, data.position());
    std::string pipeline, idle;
    if (pipelined) {
      if (!o.metrics.empty()) pipeline = pipeline_json(model, mesh.pp());  // collective over the stages
      const auto& last = model.last_step();
      char buf[48];
      std::snprintf(buf, sizeof buf, " | idle %4.1f%%", 100.0 * last.idle_seconds / (last.busy_seconds + last.idle_seconds));
      idle = buf;
    }
    if (!lead) continue;
    progress.update(s + 1, r, idle + dev.step_suffix);
    if (!r.applied && run.trainer().nonfinite_steps_in_a_row() > 0) {
      // No loss scale can answer this one (fp32, bf16; fp16 at its minimum): say so in words.
      char buf[200];
      std::snprintf(buf, sizeof buf, "step %d: the gradient norm is %g: update skipped, weights unchanged (%d such steps in a row; "
                    "%d stop the run)", s + 1, r.grad_norm, run.trainer().nonfinite_steps_in_a_row(),
                    run.options().trainer.nonfinite_step_limit);
      progress.message(buf);
    }
    if (s + 1 == o.steps) progress.end_line();  // what follows the loop prints on lines of its own
    if (metrics) {
      // MFU counts every rank of the launch against the device's peak for the storage precision.
      const std::string comm = run.groups().counters_json();
      metrics->write(r, run.ledger(),
                     {.model_flops_per_step = plan ? plan->model_flops_per_step : 0.0,
                      .peak_flops = device ? world.size() * device->peak_flops(int(sizeof(typename P::storage))) : 0.0,
                      .skipped_steps = run.trainer().scaler().skipped_steps(), .comm = comm, .pipeline = pipeline});
    }
  }

  if (checkpoints && run.steps() > first_step && (o.save_every == 0 || run.steps() % o.save_every != 0))
    last_saved = run.save(*checkpoints, data.position());  // the end of the run, unless just saved
  if (lead && !last_saved.empty()) std::printf("checkpoint: %s\n", last_saved.c_str());
  if (dev.after_steps) dev.after_steps();
  if (lead && dev.crossings)
    std::printf("%s memory: at most %ld copies between it and the host per step (the batch in; the loss and the "
                "step's norm and decision out)\n",
                dev.memory->name, step_crossings);
  if (lead && dev.memory)
    std::printf("%s memory: %.1f MB at the peak on rank 0 (parameters, gradients, optimizer state, activations)\n",
                dev.memory->name, double(run.ledger().total_peak()) / 1e6);

  if (!o.export_path.empty()) {
    // The whole model, gathered from every piece and stage, written by rank 0.
    const auto serial = run.serial_weights();
    if (lead) {
      example_models::export_hf<typename P::storage>(o.export_path, dims, serial);
      std::printf("export: %s (%zu weights, Hugging Face %s names)\n", o.export_path.c_str(), serial.size(),
                  Family::hf_class);
    }
  }

  if (o.sample_tokens > 0) {
    // Every rank generates the same tokens in step (st::generator: a key/value cache, under any
    // layout; each token decided on a rank holding the head and broadcast); rank 0 prints them.
    // The generated corpus is byte-level: text prompts and printed samples are bytes. Token
    // shards come from another tokenizer: prompts are ids, and so is the output.
    const bool bytes = o.data.empty() && dims.vocab >= 256;
    std::vector<std::int32_t> prompt = o.prompt_ids;
    if (prompt.empty() && bytes)
      for (const unsigned char c : o.prompt.empty() ? std::string("The ") : o.prompt) prompt.push_back(c);
    if (prompt.empty()) prompt = {0};
    // A position table bounds what the model can continue; a rotary model is not bounded.
    const std::int64_t limit = model.max_positions();
    const std::int64_t count = limit > 0 ? std::min<std::int64_t>(o.sample_tokens, limit - std::int64_t(prompt.size()) + 1)
                                         : o.sample_tokens;
    // No CUDA kernel attends over a cache yet: on GPUs each token is a forward over the window,
    // which needs the whole model on each rank.
    const bool on_gpu = std::is_base_of_v<st::cuda, Device>;
    if (on_gpu && pipelined) {
      if (lead) std::printf("sample: skipped (on GPUs generation needs the whole model on each rank; pipeline stages hold part of it)\n");
      return 0;
    }
    STRATA_CHECK(count > 0, "gpt2_train: a prompt of ", prompt.size(), " tokens leaves no room in the model's ", limit,
                 " positions");
    st::generator gen(run);
    const auto out = gen.generate(prompt, {.new_tokens = count,
                                           .sample = {.temperature = o.temperature, .top_k = o.top_k, .seed = o.seed},
                                           .cache = !on_gpu});
    if (!lead) return 0;
    std::printf("sample:%s\n", count < o.sample_tokens ? (" (" + std::to_string(count) + " tokens: the model's " +
                                                           std::to_string(limit) + " positions)").c_str() : "");
    const auto show = [&](std::int32_t t) {
      if (bytes) std::putchar(t == '\n' ? '\n' : (t >= 32 && t < 127 ? char(t) : '?'));
      else std::printf("%d ", t);
    };
    for (auto t : prompt) show(t);
    for (auto t : out) show(t);
    std::printf("\n");
  }
  return 0;
}

// The precisions, for one family on one device.
template <class Family, class Device>
int dispatch(const run_options& o, st::world& world, const device_hooks& dev) {
  if (o.precision == "fp32") return train<Family, Device, st::fp32>(o, world, dev);
  if (o.precision == "bf16") return train<Family, Device, st::mixed<st::bf16, float>>(o, world, dev);
  return train<Family, Device, st::mixed<st::fp16, float>>(o, world, dev);
}

}  // namespace gpt2_train
