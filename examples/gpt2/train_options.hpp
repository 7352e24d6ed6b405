// examples/gpt2/train_options.hpp - the rules between gpt2_train's flags that CLI11 cannot
// state: a flag of one model family given with another, a shape the layers would refuse, a
// prompt that does not suit the data, a checkpoint flag without its directory.
//
// check_flags runs after parsing, inside the world's run, which reports what it refuses as
// "gpt2_train: error: ..." with exit code 1, before anything is planned, allocated or read.
// given_flags names the flags whose being given, not their value, a rule reads; train_gpt2.cpp
// fills it as it defines the flags.
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include <strata/core/error.hpp>
#include <strata/train/token_data.hpp>

#include "train_run.hpp"

namespace gpt2_train {

// The flags whose being given (not their value) check_flags reads.
struct given_flags {
  std::vector<CLI::Option*> llama;  // refused with --model gpt2
  std::vector<CLI::Option*> moe;    // refused but with --model mixtral
  CLI::Option *prompt_text = nullptr, *prompt_ids = nullptr;
};

// The shape's own rules, in the flags' words (the layers would say the same in theirs).
inline void check_dims(const run_options& o) {
  const auto& d = o.shape;
  STRATA_CHECK(d.d_model % d.heads == 0, o.model, ": --heads ", d.heads, " does not divide --d-model ", d.d_model,
               " (head_dim must be a whole number)");
  STRATA_CHECK(!o.sp || d.seq % o.tp == 0, o.model, ": sequence parallelism over tp=", o.tp,
               " needs --seq divisible by it, got ", d.seq);
  if (o.model != "gpt2") {
    STRATA_CHECK(d.kv_heads == 0 || d.heads % d.kv_heads == 0, o.model, ": --kv-heads ", d.kv_heads,
                 " does not divide --heads ", d.heads);
    STRATA_CHECK(d.d_model / d.heads % 2 == 0, o.model, ": the rotary embedding needs an even head size, --d-model ",
                 d.d_model, " / --heads ", d.heads, " = ", d.d_model / d.heads);
  }
  if (o.model == "mixtral")
    STRATA_CHECK(d.top_k <= d.experts, "mixtral: --moe-top-k ", d.top_k, " is more than --experts ", d.experts);
}

// The rules between the flags, after parsing; the data flags before anything is planned,
// allocated or read (--init-from weights).
inline void check_flags(const run_options& o, const given_flags& given) {
  bool llama_flags = false;
  for (auto* f : given.llama) llama_flags = llama_flags || f->count() > 0;
  std::string moe_flag_given;
  for (auto* f : given.moe)
    if (f->count() > 0 && moe_flag_given.empty()) moe_flag_given = f->get_name();
  STRATA_CHECK(o.model != "gpt2" || !llama_flags,
               "gpt2_train: --kv-heads, --rope-theta and --norm-eps apply to "
               "--model llama and mixtral only");
  STRATA_CHECK(o.model == "mixtral" || moe_flag_given.empty(), "gpt2_train: ", moe_flag_given,
               " applies to --model mixtral only");
  check_dims(o);
  STRATA_CHECK(given.prompt_text->count() == 0 || given.prompt_ids->count() == 0,
               "gpt2_train: give --prompt (text) or --prompt-ids (token ids), not both");
  STRATA_CHECK(given.prompt_text->count() == 0 || (o.data.empty() && o.shape.vocab >= 256),
               "gpt2_train: --prompt is text as byte tokens, for the generated corpus (--vocab >= 256, no "
               "--data); token shards come from another tokenizer: give --prompt-ids");
  for (const auto id : o.prompt_ids)
    STRATA_CHECK(id < o.shape.vocab, "gpt2_train: --prompt-ids: token ", id, " is out of range for --vocab ",
                 o.shape.vocab);
  STRATA_CHECK(!o.resume || !o.save_dir.empty(), "gpt2_train: --resume needs --save DIR (where the checkpoints are)");
  STRATA_CHECK(!o.resume_with_changes || o.resume, "gpt2_train: --resume-with-changes needs --resume");
  STRATA_CHECK(o.save_every == 0 || !o.save_dir.empty(), "gpt2_train: --save-every needs --save DIR");
  if (o.micro_batch > 0)
    STRATA_CHECK(o.batch % o.micro_batch == 0, "gpt2_train: --batch ", o.batch, " is not a multiple of --micro-batch ",
                 o.micro_batch);
  STRATA_CHECK(o.microbatches == 0 || o.pp > 1 || o.virtual_chunks > 1, "gpt2_train: --microbatches ", o.microbatches,
               " needs --pp > 1 (or --virtual); use --micro-batch "
               "for gradient accumulation without a pipeline");
  if (o.data.empty())
    STRATA_CHECK(o.shape.vocab >= 256, "gpt2_train: the generated corpus is byte-level and needs --vocab >= 256, got ",
                 o.shape.vocab);
  else st::expand_glob(o.data);  // none matching is an error naming the pattern
}

}  // namespace gpt2_train
