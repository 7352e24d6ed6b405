// examples/gpt2/train_run.hpp - gpt2_train's run: the flags, and one training of a model family's
// model (strata/models/families.hpp) on a device, the same on the host and on GPUs.
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

#include "strata/models/families.hpp"
#include "strata/models/families_hf.hpp"

namespace gpt2_train {

namespace st = strata;

// The models gpt2_train trains (strata/models/families.hpp).
using strata::models::gpt2_family;
using strata::models::llama_family;
using strata::models::mixtral_family;

// What a device adds to a run: where its memory is, and what is said about it.
struct device_hooks {
  const st::memory_space* memory = nullptr;  // null: host memory
  std::function<long()> crossings;           // copies between the space and the host so far, if counted
  std::function<void()> after_steps;         // e.g. surface the GPU's recorded errors
  std::string step_suffix;                   // appended to each progress line
};

struct run_options {
  std::string model = "gpt2";
  strata::models::model_shape shape{.vocab = 256, .seq = 64, .layers = 3, .heads = 4, .d_model = 96};  // CPU-sized
  std::int64_t batch = 16, micro_batch = 0;
  int steps = 250, warmup = 10;
  double lr = 3e-3, grad_clip = 1.0;
  std::uint64_t seed = 1337;
  std::string precision = "fp32", metrics, data;
  int sample_tokens = 60;
  std::string prompt;                    // text (byte tokens); empty: "The " or token 0
  std::vector<std::int32_t> prompt_ids;  // token ids instead of text
  double temperature = 0.8;              // 0: greedy
  std::int64_t top_k = 0;                // 0: every token
  int dp = st::dynamic, zero = 0, tp = 1, cp = 1, ep = 1;
  bool sp = false;
  std::string cp_form = "ring";
  std::string recompute = "none";
  int pp = 1, microbatches = 0, virtual_chunks = 1;
  std::string schedule = "1f1b", hw, export_path, init_from;
  std::string save_dir, data_order = "shuffled", device = "host";
  int save_every = 0, keep = 0;
  bool resume = false, resume_with_changes = false;
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

// Every setting of the layout comes from the flags: degrees (the expert degree too), ZeRO stage,
// context form, sequence parallelism, schedule, micro-batches and chunks are all left to the launch.
using flag_layout =
    st::parallel<st::data<st::dynamic, st::zero<st::dynamic>>, st::context<st::dynamic, st::dynamic_context_form>,
                 st::tensor<st::dynamic, st::dynamic_sequence_parallel>,
                 st::pipeline<st::dynamic, st::dynamic_schedule, st::dynamic, st::dynamic>, st::expert<st::dynamic>>;

inline st::layout_overrides layout_flags(const run_options& o) {
  return {.dp = o.dp,
          .cp = o.cp,
          .tp = o.tp,
          .pp = o.pp,
          .ep = o.ep,
          .microbatches = o.microbatches > 0 ? o.microbatches : 1,
          .zero_stage = o.zero,
          .sequence_parallel = o.sp ? 1 : 0,
          .virtual_chunks = o.virtual_chunks,
          .context_form = o.cp_form,
          .schedule = o.schedule};
}

// What every part of a run reads: the flags, the launch, the device's hooks, and where this rank
// stands.
struct run_context {
  const run_options& o;
  st::world& world;
  const device_hooks& dev;
  bool lead = false;       // rank 0: it prints, writes the metrics and exports
  bool pipelined = false;  // pipeline stages or model chunks: micro-batches come from the schedule
};

// The plan of the run, and the device --hw names (null without --hw or without a plan).
struct run_plan {
  std::optional<st::plan_result> figures;
  const st::hw::device_spec* device = nullptr;
};

// The plan, before anything is allocated: with --hw, a layout that does not fit the device
// stops here on every rank, naming the numbers. The loop reports FLOP/s and MFU from it.
template <class Model>
run_plan plan_run(const run_context& c, const typename Model::config& dims, const st::layout_config& layout) {
  const run_options& o = c.o;
  st::plan_setup setup;
  setup.layout = layout;
  setup.recompute = st::parse_recompute_mode(o.recompute);
  setup.schedule = st::parse_pipeline_schedule(layout.schedule);
  const std::int64_t micro =
      o.micro_batch > 0 && !c.pipelined ? o.micro_batch : o.batch / layout.dp / layout.microbatches;
  run_plan plan;
  try {
    if (micro > 0 && o.batch % (layout.dp * micro) == 0)
      plan.figures = st::plan_model<Model>(dims, {.micro = micro, .global = o.batch}, setup);
  } catch (const st::error&) {
    // A shape the layout cannot split: the start-up checks after the plan name it in their words.
  }
  if (!plan.figures) return plan;
  if (c.lead)
    std::printf("plan: %.1f MB model state + %.1f MB activations per rank, %.3g FLOP per step\n",
                double(plan.figures->model_state_bytes()) / 1e6, double(plan.figures->activation_bytes) / 1e6,
                plan.figures->flops_per_step);
  if (!o.hw.empty()) {
    plan.device = st::hw::find(o.hw);
    STRATA_CHECK(plan.device != nullptr, "gpt2_train: --hw ", o.hw,
                 " is not a known device (a100_40gb, a100_80gb, "
                 "h100_80gb, h200_141gb)");
    plan.figures->check_fits(*plan.device);
  }
  return plan;
}

// The run's options from the flags, all but the initial weights.
inline st::training_options training_options_for(const run_context& c) {
  const run_options& o = c.o;
  st::training_options options{.layout = layout_flags(o),
                               .blocks_per_virtual_stage = o.stage_layers,
                               .recompute = st::parse_recompute_mode(o.recompute),
                               .seed = st::seed{o.seed},
                               .optimizer = {.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1},
                               .bucket_elems = o.bucket_elems,
                               .memory = c.dev.memory};
  options.trainer.micro_batch = c.pipelined ? 0 : o.micro_batch;
  options.trainer.schedule = {o.lr, o.lr / 10, std::min(o.warmup, o.steps), o.steps};
  options.trainer.grad_clip = o.grad_clip;
  return options;
}

// The token shards of --data, or the generated corpus, which is byte-level: its tokens need a
// vocabulary of at least 256.
inline st::token_stream open_data(const run_options& o, std::int64_t vocab) {
  if (!o.data.empty()) return st::token_stream::from_glob(o.data, vocab, o.seed, st::parse_data_order(o.data_order));
  STRATA_CHECK(vocab >= 256, "gpt2_train: the generated corpus is byte-level and needs --vocab >= 256, got ", vocab);
  return st::token_stream(st::byte_tokens(st::generate_corpus()), o.seed, st::parse_data_order(o.data_order));
}

// The weights of --init-from: every rank reads the file and keeps its own pieces, before the
// optimizer copies the weights.
template <class Family>
std::vector<double> read_initial_weights(const run_context& c, const typename Family::dims& dims) {
  std::vector<std::string> notes;
  std::vector<double> weights = strata::models::import_hf(c.o.init_from, dims, &notes);
  if (c.lead) {
    std::printf("init-from: %s (%zu weights)\n", c.o.init_from.c_str(), weights.size());
    for (const auto& note : notes) std::printf("init-from: %s\n", note.c_str());
  }
  return weights;
}

// The training settings each checkpoint records and --resume compares (docs/checkpoints.md):
// the optimizer's and trainer's, and what the flags add - the batch, the data, and the steps the
// run plans (only steps both the saved run and this one take are held to the saved settings).
template <class Run>
st::training_settings run_settings(const run_options& o, const Run& run) {
  st::training_settings s = st::settings_of(run.options().optimizer, run.options().trainer);
  s.values[st::planned_steps] = o.steps;
  s.free.push_back(st::planned_steps);  // itself; the schedule's length (total_steps) is not
  s.values["batch"] = o.batch;
  s.values["data"] = o.data.empty() ? "generated corpus" : o.data;
  s.values["data_order"] = o.data_order;
  return s;
}

// Where the steps start: the checkpoints of --save (none without it) and the first step to run.
struct run_start {
  std::optional<st::checkpointer> checkpoints;
  int first_step = 0;
};

// Checkpoints: every rank saves its pieces; --resume continues from the newest complete one,
// whatever layout saved it, with the data where that step left it, and says which training
// settings changed (refusing those that change the steps without --resume-with-changes).
// Without --resume the directory must hold no other run's. The checkpointer locks the directory
// for as long as it lives: the whole run.
template <class Run>
run_start open_checkpoints(const run_context& c, Run& run, st::token_stream& data) {
  const run_options& o = c.o;
  run_start start;
  if (o.save_dir.empty()) return start;
  start.checkpoints.emplace(run.make_checkpointer({o.save_dir, o.keep, run_settings(o, run), o.resume_with_changes}));
  if (!o.resume) {
    start.checkpoints->start_new_run();
  } else if (const auto loaded = run.resume(*start.checkpoints)) {
    data.seek(loaded->progress.data_position);
    start.first_step = loaded->progress.step;
    if (c.lead)
      std::printf("resume: %s (step %d, saved under %s)\n", loaded->path.c_str(), start.first_step,
                  loaded->layout.dump().c_str());
  } else if (c.lead) {
    std::printf("resume: no complete checkpoint in '%s' yet; starting at step 0\n", o.save_dir.c_str());
  }
  return start;
}

// Rank 0's account of the run before its first step: the model, the data and batch, the layout.
template <class Family, class Model>
void print_run_summary(const run_context& c, const typename Family::dims& dims, const st::layout_config& layout,
                       Model& model, const st::token_stream& data) {
  const run_options& o = c.o;
  const std::int64_t micro_batch =
      c.pipelined ? o.batch / layout.dp / layout.microbatches : (o.micro_batch ? o.micro_batch : o.batch / layout.dp);
  std::printf("gpt2_train: %s, %lld layers, %lld heads", Family::name, (long long)dims.layers, (long long)dims.heads);
  if constexpr (!std::is_same_v<Family, gpt2_family>) std::printf(" (%lld key/value)", (long long)dims.kv());
  if constexpr (std::is_same_v<Family, mixtral_family>) {
    std::printf(", %lld experts (top %lld)", (long long)dims.experts, (long long)dims.top_k);
    if (dims.capacity_factor > 0) std::printf(" at capacity factor %g", dims.capacity_factor);
  }
  std::printf(", d_model %lld, ffn %lld, seq %lld, vocab %lld: %lld parameters%s, %s\n", (long long)dims.d_model,
              (long long)dims.ffn_width(), (long long)dims.seq, (long long)dims.vocab,
              (long long)model.parameters().size(), layout.tp > 1 || layout.pp > 1 ? " per rank" : "",
              o.precision.c_str());
  std::printf(
      "data: %s (%zu tokens); batch %lld x %lld tokens, micro-batch %lld; dp %d%s, ZeRO-%d; tp %d%s; %s"
      "recompute %s\n",
      o.data.empty() ? "generated corpus" : o.data.c_str(), data.size(), (long long)o.batch, (long long)dims.seq,
      (long long)micro_batch, layout.dp,
      layout.ep > 1 ? (" (experts over ep " + std::to_string(layout.ep) + ")").c_str() : "", layout.zero_stage,
      layout.tp, o.sp ? " + sequence parallel" : "",
      layout.cp > 1 ? ("cp " + std::to_string(layout.cp) + " (" + layout.context_form + "); ").c_str() : "",
      o.recompute.c_str());
  if (c.pipelined) {
    const auto& sh = model.placement().shape;
    std::printf("pipeline: %d stages, %s, %d micro-batches of %lld, %d chunks per stage; analytic bubble %.3f\n",
                sh.stages, std::string(st::schedule_label(sh.schedule)).c_str(), sh.microbatches,
                (long long)micro_batch, sh.chunks, st::analytic_bubble(sh));
  }
}

// What the steps leave for the end of the run.
struct steps_done {
  std::string last_saved;   // the newest checkpoint the steps wrote; empty: none
  long step_crossings = 0;  // the most copies one step made between the host and the device
};

// Rank 0's report of step `step`: its progress line, a word on an update skipped for good, and
// its metrics line.
template <class Run>
void report_step(const run_context& c, Run& run, st::progress& progress, st::metrics_file* metrics, int step,
                 const st::step_result& r, const std::string& suffix, st::step_extras extras) {
  progress.update(step, r, suffix + c.dev.step_suffix);
  if (!r.applied && run.trainer().nonfinite_steps_in_a_row() > 0) {
    // No loss scale can answer this one (fp32, bf16; fp16 at its minimum): say so in words.
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "step %d: the gradient norm is %g: update skipped, weights unchanged (%d such steps in a row; "
                  "%d stop the run)",
                  step, r.grad_norm, run.trainer().nonfinite_steps_in_a_row(),
                  run.options().trainer.nonfinite_step_limit);
    progress.message(buf);
  }
  if (step == c.o.steps) progress.end_line();  // what follows the loop prints on lines of its own
  if (metrics) {
    const std::string comm = run.groups().counters_json();
    extras.skipped_steps = run.trainer().scaler().skipped_steps();
    extras.comm = comm;
    metrics->write(r, run.ledger(), extras);
  }
}

// The steps after `start.first_step` up to --steps, each one checkpointed when --save-every
// says so and reported on rank 0. `flops` holds the plan's and the device's figures for MFU.
template <class Run>
steps_done run_steps(const run_context& c, Run& run, st::token_stream& data, std::int64_t seq, run_start& start,
                     st::metrics_file* metrics, const st::step_extras& flops, const st::fault_injection& fault) {
  const run_options& o = c.o;
  st::progress progress(o.steps, st::parse_progress_style(o.progress));
  steps_done done;
  for (int s = start.first_step; s < o.steps; ++s) {
    if (fault.kill_at_step == s + 1 && fault.targets(c.world.rank(), c.world.size()))
      st::fault_injection::die("before a step");
    run.groups().reset_counters();
    const long crossed = c.dev.crossings ? c.dev.crossings() : 0;
    const auto r = run.step(data.next_batch(o.batch, seq));
    if (c.dev.crossings) done.step_crossings = std::max(done.step_crossings, c.dev.crossings() - crossed);
    if (start.checkpoints && o.save_every > 0 && (s + 1) % o.save_every == 0)
      done.last_saved = run.save(*start.checkpoints, data.position());
    std::string pipeline, idle;
    if (c.pipelined) {
      if (!o.metrics.empty()) pipeline = pipeline_json(run.model(), run.mesh().pp());  // collective over the stages
      const auto& last = run.model().last_step();
      char buf[48];
      std::snprintf(buf, sizeof buf, " | idle %4.1f%%",
                    100.0 * last.idle_seconds / (last.busy_seconds + last.idle_seconds));
      idle = buf;
    }
    if (!c.lead) continue;
    st::step_extras extras = flops;
    extras.pipeline = pipeline;
    report_step(c, run, progress, metrics, s + 1, r, idle, extras);
  }
  return done;
}

// After the steps: the run's last checkpoint (unless its last step just saved one), and what
// the device saw.
template <class Run>
void finish_steps(const run_context& c, Run& run, const st::token_stream& data, run_start& start,
                  const steps_done& done) {
  const run_options& o = c.o;
  std::string last_saved = done.last_saved;
  if (start.checkpoints && run.steps() > start.first_step && (o.save_every == 0 || run.steps() % o.save_every != 0))
    last_saved = run.save(*start.checkpoints, data.position());
  if (c.lead && !last_saved.empty()) std::printf("checkpoint: %s\n", last_saved.c_str());
  if (c.dev.after_steps) c.dev.after_steps();
  if (c.lead && c.dev.crossings)
    std::printf(
        "%s memory: at most %ld copies between it and the host per step (the batch in; the loss and the "
        "step's norm and decision out)\n",
        c.dev.memory->name, done.step_crossings);
  if (c.lead && c.dev.memory)
    std::printf("%s memory: %.1f MB at the peak on rank 0 (parameters, gradients, optimizer state, activations)\n",
                c.dev.memory->name, double(run.ledger().total_peak()) / 1e6);
}

// --export: the whole model, gathered from every piece and stage, written by rank 0.
template <class Family, class Storage, class Run>
void export_weights(const run_context& c, Run& run, const typename Family::dims& dims) {
  const auto serial = run.serial_weights();
  if (!c.lead) return;
  strata::models::export_hf<Storage>(c.o.export_path, dims, serial);
  std::printf("export: %s (%zu weights, Hugging Face %s names)\n", c.o.export_path.c_str(), serial.size(),
              Family::hf_class);
}

// The tokens --sample-tokens continues: --prompt-ids, or --prompt's bytes ("The " by default)
// where tokens are bytes, or token 0.
inline std::vector<std::int32_t> sample_prompt(const run_options& o, bool bytes) {
  std::vector<std::int32_t> prompt = o.prompt_ids;
  if (prompt.empty() && bytes)
    for (const unsigned char c : o.prompt.empty() ? std::string("The ") : o.prompt) prompt.push_back(c);
  if (prompt.empty()) prompt = {0};
  return prompt;
}

// --sample-tokens: every rank generates the same tokens in step (st::generator: a key/value
// cache, under any layout; each token decided on a rank holding the head and broadcast); rank 0
// prints them. The generated corpus is byte-level: text prompts and printed samples are bytes.
// Token shards come from another tokenizer: prompts are ids, and so is the output.
template <class Device, class Run>
void print_sample(const run_context& c, Run& run, std::int64_t vocab) {
  const run_options& o = c.o;
  const bool bytes = o.data.empty() && vocab >= 256;
  const std::vector<std::int32_t> prompt = sample_prompt(o, bytes);
  // A position table bounds what the model can continue; a rotary model is not bounded.
  const std::int64_t limit = run.model().max_positions();
  const std::int64_t count =
      limit > 0 ? std::min<std::int64_t>(o.sample_tokens, limit - std::int64_t(prompt.size()) + 1) : o.sample_tokens;
  // No CUDA kernel attends over a cache yet: on GPUs each token is a forward over the window,
  // which needs the whole model on each rank.
  const bool on_gpu = std::is_base_of_v<st::cuda, Device>;
  if (run.layout().cp > 1) {
    if (c.lead)
      std::printf(
          "sample: skipped (generation adds one position at a time, which no context split holds; resume the "
          "checkpoint without --cp to sample)\n");
    return;
  }
  if (on_gpu && c.pipelined) {
    if (c.lead)
      std::printf(
          "sample: skipped (on GPUs generation needs the whole model on each rank; pipeline stages hold part of it)\n");
    return;
  }
  STRATA_CHECK(count > 0, "gpt2_train: a prompt of ", prompt.size(), " tokens leaves no room in the model's ", limit,
               " positions");
  st::generator gen(run);
  const auto out = gen.generate(prompt, {.new_tokens = count,
                                         .sample = {.temperature = o.temperature, .top_k = o.top_k, .seed = o.seed},
                                         .cache = !on_gpu});
  if (!c.lead) return;
  std::printf(
      "sample:%s\n",
      count < o.sample_tokens
          ? (" (" + std::to_string(count) + " tokens: the model's " + std::to_string(limit) + " positions)").c_str()
          : "");
  const auto show = [&](std::int32_t t) {
    if (bytes) std::putchar(t == '\n' ? '\n' : (t >= 32 && t < 127 ? char(t) : '?'));
    else std::printf("%d ", t);
  };
  for (auto t : prompt) show(t);
  for (auto t : out) show(t);
  std::printf("\n");
}

template <class Family, class Device, class Precision>
int train(const run_options& o, st::world& world, const device_hooks& dev) {
  using P = st::policy<Device, flag_layout, Precision>;
  using model_decl = typename Family::template model<P>;
  const typename Family::dims dims = Family::shape(o.shape);
  const st::layout_config layout = st::resolve_layout<flag_layout>(world.size(), layout_flags(o));
  const run_context c{.o = o,
                      .world = world,
                      .dev = dev,
                      .lead = world.rank() == 0,
                      .pipelined = layout.pp > 1 || layout.virtual_chunks > 1};

  const run_plan plan = plan_run<model_decl>(c, dims, layout);
  st::training_options options = training_options_for(c);
  // The data before the weights: a glob that matches nothing, or a token past the vocabulary,
  // fails here rather than after a large --init-from file is read.
  st::token_stream data = open_data(o, dims.vocab);
  if (!o.init_from.empty()) options.initial_weights = read_initial_weights<Family>(c, dims);
  st::training<model_decl> run(world, dims, std::move(options));

  // A batch the ranks or the schedule cannot share fails here, on every rank.
  const auto rows = run.synchronizer().local_rows(o.batch).second;
  STRATA_CHECK(!c.pipelined || rows % layout.microbatches == 0, "gpt2_train: ", rows,
               " sequences per data-parallel rank (--batch ", o.batch, ") do not split into --microbatches ",
               layout.microbatches);

  run_start start = open_checkpoints(c, run, data);
  std::unique_ptr<st::metrics_file> metrics;
  if (c.lead && !o.metrics.empty()) metrics = std::make_unique<st::metrics_file>(o.metrics, start.first_step > 0);
  const auto fault = st::fault_injection::from_env();
  if (c.lead) print_run_summary<Family>(c, dims, layout, run.model(), data);

  // MFU counts every rank of the launch against the device's peak for the storage precision.
  const st::step_extras flops{
      .model_flops_per_step = plan.figures ? plan.figures->model_flops_per_step : 0.0,
      .peak_flops = plan.device ? world.size() * plan.device->peak_flops(int(sizeof(typename P::storage))) : 0.0};
  const steps_done done = run_steps(c, run, data, dims.seq, start, metrics.get(), flops, fault);
  finish_steps(c, run, data, start, done);

  if (!o.export_path.empty()) export_weights<Family, typename P::storage>(c, run, dims);
  if (o.sample_tokens > 0) print_sample<Device>(c, run, dims.vocab);
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
