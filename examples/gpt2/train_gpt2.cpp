// gpt2_train - trains the example GPT-2 (or, with --model llama or mixtral, the example Llama or
// Mixtral) on the CPU or, with --device cuda, on GPUs (one per rank under mpirun, or several ranks
// sharing one; not yet the Mixtral, whose kernels run on the host only).
//
// With no flags: a small model on the generated corpus (byte-level tokens), one progress line
// per step and a generated sample at the end. --data reads uint16 token shards instead. The
// run is one strata::training of the family's model under a policy whose layout the
// flags fill in (train_run.hpp); every layout, precision, checkpoint and metrics flag means the
// same for both models and on every device. --device emulated runs the host kernels on memory
// that claims not to be host memory and counts what crosses it: the GPU path's bookkeeping,
// checked without a GPU.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <optional>

#include <strata/strata.hpp>

#include "common/cli_checks.hpp"
#include "train_gpus.hpp"
#include "train_host.hpp"
#include "train_options.hpp"

using namespace gpt2_train;

namespace {

// The device's run: GPUs, or the host with its memory or the emulated device memory.
int run_on_device(const run_options& o, st::world& world) {
  if (o.device == "cuda") {
    if (o.model == "mixtral")
      st::check_supported(st::combination{.device = st::device_kind::cuda}.with(st::layer_kind::experts),
                          "gpt2_train: --model mixtral runs on the host (--device host or emulated)");
    return train_on_gpus(o, world);
  }
  device_hooks dev;
  if (o.device == "emulated") {
    dev.memory = &st::emulated_device_memory();
    dev.crossings = [] {
      const auto& c = st::emulated_memory_stats();
      return c.uploads + c.downloads;
    };
    dev.step_suffix = " | emulated";
  }
  if (o.model == "mixtral") return train_mixtral_on_host(o, world, dev);
  return o.model == "llama" ? train_llama_on_host(o, world, dev) : train_gpt2_on_host(o, world, dev);
}

// The model and its shape; Llama's own flags among them.
void add_model_flags(CLI::App& app, run_options& o, given_flags& given) {
  const auto positive = cli_checks::integer_at_least(1), non_negative = cli_checks::integer_at_least(0);
  app.add_option("--model", o.model,
                 "the model: gpt2 (examples/gpt2), llama (strata/models/llama.hpp) or mixtral (examples/mixtral: the "
                 "Llama with a mixture of experts)")
      ->check(CLI::IsMember({"gpt2", "llama", "mixtral"}))
      ->capture_default_str();
  app.add_option("--layers", o.shape.layers, "transformer blocks")->check(positive)->capture_default_str();
  app.add_option("--heads", o.shape.heads, "attention heads (must divide --d-model)")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--d-model", o.shape.d_model, "model width")->check(positive)->capture_default_str();
  app.add_option("--seq", o.shape.seq, "sequence length")->check(positive)->capture_default_str();
  app.add_option("--vocab", o.shape.vocab, "vocabulary size")
      ->check(cli_checks::integer_at_least(2))
      ->capture_default_str();
  app.add_option("--ffn", o.shape.ffn,
                 "feed-forward width (0: 4 x --d-model for gpt2, 8/3 x --d-model rounded up to 32 "
                 "for llama)")
      ->check(non_negative)
      ->capture_default_str();
  given.llama = {app.add_option("--kv-heads", o.shape.kv_heads,
                                "llama: key/value heads, dividing --heads (0: as many "
                                "as --heads; fewer: grouped-query attention)")
                     ->check(non_negative)
                     ->capture_default_str(),
                 app.add_option("--rope-theta", o.shape.rope_theta, "llama: the rotary embedding's base")
                     ->check(cli_checks::real_in(0, false))
                     ->capture_default_str(),
                 app.add_option("--norm-eps", o.shape.norm_eps, "llama: RMSNorm's epsilon")
                     ->check(cli_checks::real_in(0, false))
                     ->capture_default_str()};
}

// Mixtral only (refused with the other models): the experts, their losses and their layout.
void add_mixture_flags(CLI::App& app, run_options& o, given_flags& given) {
  const auto positive = cli_checks::integer_at_least(1), non_negative = cli_checks::integer_at_least(0);
  given.moe = {app.add_option("--experts", o.shape.experts, "mixtral: experts per block")
                   ->check(positive)
                   ->capture_default_str(),
               app.add_option("--moe-top-k", o.shape.top_k, "mixtral: experts per token (at most --experts)")
                   ->check(positive)
                   ->capture_default_str(),
               app.add_option("--shared-ffn", o.shape.shared_ffn,
                              "mixtral: a shared expert's width, every token through it "
                              "(0: none)")
                   ->check(non_negative),
               app.add_option("--balance-coef", o.shape.balance_coef, "mixtral: the load-balancing loss's coefficient")
                   ->check(cli_checks::real_in(0, true))
                   ->capture_default_str(),
               app.add_option("--z-coef", o.shape.z_coef, "mixtral: the router z-loss's coefficient")
                   ->check(cli_checks::real_in(0, true))
                   ->capture_default_str(),
               app.add_option("--capacity-factor", o.shape.capacity_factor,
                              "mixtral: each expert keeps at most ceil(factor x seq x top-k / experts) of a sequence's "
                              "tokens, the rest dropped (0: dropless)")
                   ->check(cli_checks::real_in(0, true))
                   ->capture_default_str(),
               app.add_option("--ep", o.ep,
                              "mixtral: expert parallelism, each rank of a group of ep data-parallel ranks holding "
                              "1/ep of the experts (divides dp x cp and --experts)")
                   ->check(positive)
                   ->capture_default_str()};
}

// The optimization: batch, steps, learning rate and its warm-up, clipping, seed.
void add_optimization_flags(CLI::App& app, run_options& o) {
  const auto positive = cli_checks::integer_at_least(1), non_negative = cli_checks::integer_at_least(0);
  app.add_option("--batch", o.batch, "global batch, in sequences")->check(positive)->capture_default_str();
  app.add_option("--micro-batch", o.micro_batch, "sequences per forward/backward (0: whole batch)")
      ->check(non_negative)
      ->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps")->check(positive)->capture_default_str();
  app.add_option("--warmup", o.warmup, "warm-up steps")->check(non_negative)->capture_default_str();
  app.add_option("--lr", o.lr, "peak learning rate")->check(cli_checks::real_in(0, false))->capture_default_str();
  app.add_option("--grad-clip", o.grad_clip, "max global gradient norm (0: off)")
      ->check(cli_checks::real_in(0, true))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed for initialization and data order")->capture_default_str();
}

// Where the run computes, and in which precision.
void add_device_flags(CLI::App& app, run_options& o) {
  app.add_option("--device", o.device,
                 "host (the CPU), cuda (GPUs: each rank the GPU of its local rank; ranks may "
                 "share one) or emulated (the CPU, on memory counted as a GPU's would be)")
      ->check(CLI::IsMember({"host", "cuda", "emulated"}))
      ->capture_default_str();
  app.add_option("--precision", o.precision, "fp32, bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
}

// What the run reads and writes as it goes: the metrics and progress lines, and the token shards.
void add_data_flags(CLI::App& app, run_options& o) {
  app.add_option("--metrics", o.metrics, "write one JSON line per step to FILE");
  app.add_option("--progress", o.progress,
                 "step display: auto (a bar on a terminal, else one line per step), bar or lines")
      ->check(CLI::IsMember({"auto", "bar", "lines"}))
      ->capture_default_str();
  app.add_option("--data", o.data, "glob of uint16 token shards (llm.c or nanoGPT .bin)");
  app.add_option("--data-order", o.data_order, "windows at seeded random places (shuffled) or in order (sequential)")
      ->check(CLI::IsMember({"shuffled", "sequential"}))
      ->capture_default_str();
}

// The sample generated at the end: its length, its prompt, and how tokens are drawn.
void add_sample_flags(CLI::App& app, run_options& o, given_flags& given) {
  const auto non_negative = cli_checks::integer_at_least(0);
  app.add_option("--sample-tokens", o.sample_tokens,
                 "tokens to generate at the end (with a key/value cache; at most "
                 "what the position table leaves after the prompt)")
      ->check(non_negative)
      ->capture_default_str();
  given.prompt_text = app.add_option("--prompt", o.prompt,
                                     "text to continue, as byte tokens (the generated corpus; "
                                     "default \"The \")");
  given.prompt_ids = app.add_option("--prompt-ids", o.prompt_ids, "token ids to continue, comma-separated")
                         ->delimiter(',')
                         ->check(non_negative);
  app.add_option("--temperature", o.temperature, "sampling temperature (0: greedy, the most likely token)")
      ->check(cli_checks::real_in(0, true))
      ->capture_default_str();
  app.add_option("--top-k", o.top_k, "draw from the k most likely tokens (0: all)")
      ->check(non_negative)
      ->capture_default_str();
}

// The layout: data, ZeRO, tensor, sequence, context and pipeline parallelism, recomputation.
void add_layout_flags(CLI::App& app, run_options& o) {
  const auto positive = cli_checks::integer_at_least(1);
  app.add_option("--dp", o.dp, "data-parallel degree (default: every rank of the launch)")->check(positive);
  app.add_option("--zero", o.zero,
                 "ZeRO stage: 0 (replicated), 1 (sharded optimizer state), 2 (+ gradients), 3 (+ parameters)")
      ->check(CLI::IsMember({0, 1, 2, 3}))
      ->capture_default_str();
  app.add_option("--tp", o.tp,
                 "tensor-parallel degree (must divide --heads and --ffn; llama: --kv-heads too, or be a "
                 "multiple of it)")
      ->check(positive)
      ->capture_default_str();
  app.add_flag("--sp", o.sp, "sequence parallelism within the tensor-parallel group (--seq divisible by --tp)");
  app.add_option("--cp", o.cp,
                 "context-parallel degree: each rank holds 2 of 2·cp chunks of every sequence (--seq divisible "
                 "by 2·cp)")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--cp-form", o.cp_form,
                 "how attention reaches the other context ranks: ring (key/value blocks passed around) or "
                 "all_to_all (heads exchanged; --heads and --kv-heads divisible by --cp x --tp)")
      ->check(CLI::IsMember({"ring", "all_to_all"}))
      ->capture_default_str();
  app.add_option("--recompute", o.recompute, "activation recomputation of the blocks: none, selective or full")
      ->check(CLI::IsMember({"none", "selective", "full"}))
      ->capture_default_str();
  app.add_option("--pp", o.pp, "pipeline stages (the blocks split over them)")->check(positive)->capture_default_str();
  app.add_option("--schedule", o.schedule, "pipeline schedule: gpipe, 1f1b or interleaved")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}))
      ->capture_default_str();
  app.add_option("--microbatches", o.microbatches,
                 "micro-batches per step and data-parallel rank, under --pp (default 1)")
      ->check(positive);
  app.add_option("--virtual", o.virtual_chunks, "model chunks per stage (interleaved schedule)")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--stage-layers", o.stage_layers, "blocks per virtual stage, in order (default: even)")
      ->delimiter(',');
}

// The weights in and out (Hugging Face safetensors) and the checkpoints.
void add_checkpoint_flags(CLI::App& app, run_options& o) {
  const auto non_negative = cli_checks::integer_at_least(0);
  app.add_option("--export", o.export_path,
                 "write the trained weights to FILE as safetensors with Hugging Face's names "
                 "(GPT2LMHeadModel, LlamaForCausalLM)");
  app.add_option("--init-from", o.init_from, "start from the weights in a Hugging Face safetensors FILE of the model");
  app.add_option("--save", o.save_dir, "write checkpoints under DIR (DIR/step-NNNNNNNN, one file per rank)");
  app.add_option("--save-every", o.save_every, "checkpoint every N steps (0: only at the end)")
      ->check(non_negative)
      ->capture_default_str();
  app.add_option("--keep", o.keep, "newest complete checkpoints kept (0: all)")
      ->check(non_negative)
      ->capture_default_str();
  app.add_flag("--resume", o.resume, "continue from the newest complete checkpoint in --save DIR, under any layout");
  app.add_flag("--resume-with-changes", o.resume_with_changes,
               "with --resume: continue under training settings (--lr, --steps, --batch, ...) other than those the "
               "checkpoint was saved with, which changes the steps from there on");
}

// What the run may take of a device: the memory its plan must fit, and the gradient buckets.
void add_memory_flags(CLI::App& app, run_options& o) {
  app.add_option("--hw", o.hw,
                 "check at start-up that the plan fits this device (a100_40gb, a100_80gb, h100_80gb, "
                 "h200_141gb)");
  app.add_option("--bucket-elems", o.bucket_elems, "gradient bucket size in elements")
      ->check(cli_checks::integer_at_least(1))
      ->capture_default_str();
}

// Every flag, bound to o, in the order --help lists them.
given_flags add_flags(CLI::App& app, run_options& o) {
  given_flags given;
  add_model_flags(app, o, given);
  add_mixture_flags(app, o, given);
  add_optimization_flags(app, o);
  add_device_flags(app, o);
  add_data_flags(app, o);
  add_sample_flags(app, o, given);
  add_layout_flags(app, o);
  add_checkpoint_flags(app, o);
  add_memory_flags(app, o);
  return given;
}

}  // namespace

int main(int argc, char** argv) {
  // MPI: mpirun -np N gpt2_train ..., or run alone as a world of one. A bad STRATA_COMM_TIMEOUT
  // is reported before MPI starts.
  std::optional<st::world> started;
  try {
    started.emplace(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt2_train: error: %s\n", e.what());
    return 1;
  }
  st::world& world = *started;
  run_options o;
  CLI::App app{"gpt2_train: train the example GPT-2, Llama or Mixtral with strata on the CPU or on GPUs"};
  const given_flags given = add_flags(app, o);
  CLI11_PARSE(app, argc, argv);

  return world.run(
      [&] {
        check_flags(o, given);
        return run_on_device(o, world);
      },
      "gpt2_train");
}
