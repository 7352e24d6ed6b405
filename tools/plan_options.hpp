// tools/plan_options.hpp - strata-plan's options, the flags that fill them, and the rules between
// the flags.
//
// The flags are defined by topic (the model's shape, the layout, training and device, the modes)
// in the order --help lists them. Which flags a mode refuses is stated once, in exclude_across_modes;
// the rules CLI11 cannot state (a flag that only one model family has, a shape the layers would
// refuse) are checked after parsing and reported as usage errors, in the flags' own words.
#pragma once
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <strata/core/error.hpp>
#include <strata/plan/hardware.hpp>

#include "common/cli_checks.hpp"
#include "strata/models/families.hpp"

namespace strata_plan {

namespace st = strata;

// A mistake in the flags themselves: reported like CLI11's own and exits 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A parameter count written whole (70000000000) or in exponent form (70e9, 1.3e9).
constexpr double max_param_count = 1e15;
inline std::int64_t parse_param_count(const std::string& text, std::string* why) {
  const auto parsed = cli_checks::parse_real(text);
  if (!parsed) {
    *why = "expected a parameter count such as 70e9 or 70000000000, got '" + text + "'";
    return 0;
  }
  const double v = *parsed;
  if (v < 1 || v > max_param_count) {
    *why = "must be between 1 and 1e15, got " + text;
    return 0;
  }
  if (v != std::floor(v)) {
    *why = "must be a whole number of parameters, got " + text;
    return 0;
  }
  return static_cast<std::int64_t>(v);
}
inline CLI::Validator param_count() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::string why;
        parse_param_count(text, &why);
        return why;
      },
      "N");
}

inline std::string preset_names() {
  std::string names;
  for (const auto& d : st::hw::presets) names += (names.empty() ? "" : ", ") + std::string(d.name);
  return names;
}
inline CLI::Validator device_preset() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (st::hw::find(text)) return {};
        return "unknown device '" + text + "'; the presets are " + preset_names();
      },
      "NAME");
}

struct options {
  // model shape
  std::string model = "gpt2";
  strata::models::model_shape shape;
  std::int64_t global_batch = 0, micro_batch = 1;
  // layout
  int dp = 1, cp = 1, tp = 1, pp = 1, virtual_chunks = 1, zero = 0;
  int ep = 1;  // Mixtral: experts shared out over ep ranks of the gradient group dp x cp (not a factor of the world)
  bool sp = false;
  std::string cp_form = "ring";
  std::string recompute = "none", precision = "bf16", optimizer = "adamw", schedule;
  std::string hw = "h100_80gb", hw_file;
  bool json = false;
  bool explain = false;
  std::string explain_svg;
  // back-of-envelope
  std::string params, master;
  // search
  bool search = false;
  int gpus = 0, top = 10;
  // With --search, the settings given pin every candidate to them (e.g. a published run's).
  bool pin_zero = false, pin_cp = false, pin_recompute = false, pin_sp = false, pin_schedule = false;
  std::vector<int> rank_layout;  // tp, pp, dp: where that layout ranks, and how much faster the first is
  // calibration
  std::string calibrate;
  // the table of supported combinations
  bool supported = false;
};

// The flags the rules between flags name: those a mode refuses, and those whose being given
// (not their value) a check reads.
struct plan_flags {
  std::vector<CLI::Option*> shape;        // plan and search only
  std::vector<CLI::Option*> layout;       // plan mode only, but the search pins
  std::vector<CLI::Option*> search_pins;  // with --search these pin every candidate instead of choosing a layout
  CLI::Option *kv_heads = nullptr, *tied = nullptr;
  CLI::Option *experts = nullptr, *top_k = nullptr, *shared_ffn = nullptr, *expert_parallel = nullptr;
  CLI::Option *dp = nullptr, *zero = nullptr, *context = nullptr, *sequence = nullptr, *recompute = nullptr,
              *schedule = nullptr;
  CLI::Option *hw_file = nullptr, *explain = nullptr, *explain_svg = nullptr;
  CLI::Option *params = nullptr, *calibrate = nullptr, *search = nullptr, *supported = nullptr;
};

// Model shape, the family's own flags among them, and the global batch.
inline void add_shape_flags(CLI::App& app, options& o, plan_flags& f) {
  const auto positive = cli_checks::integer_at_least(1);
  f.shape.push_back(app.add_option("--model", o.model,
                                   "the model of strata/models the shape flags describe: gpt2 (gpt2.hpp), llama "
                                   "(llama.hpp), mixtral (mixtral.hpp) or neox (neox.hpp)")
                        ->check(CLI::IsMember(std::vector<std::string>(std::begin(strata::models::model_names),
                                                                       std::end(strata::models::model_names))))
                        ->capture_default_str());
  f.shape.push_back(app.add_option("--layers", o.shape.layers, "transformer blocks")->check(positive));
  f.shape.push_back(app.add_option("--hidden", o.shape.d_model, "model width")->check(positive));
  f.shape.push_back(
      app.add_option("--heads", o.shape.heads, "attention heads (must divide --hidden)")->check(positive));
  f.shape.push_back(app.add_option("--seq", o.shape.seq, "sequence length")->check(positive));
  f.shape.push_back(app.add_option("--vocab", o.shape.vocab, "vocabulary size")->check(positive));
  f.shape.push_back(app.add_option("--ffn", o.shape.ffn,
                                   "FFN width: gpt2 the MLP's (default 4 x --hidden), llama the "
                                   "SwiGLU's (default 8/3 x --hidden rounded up to 32)")
                        ->check(positive));
  // Llama only (refused with --model gpt2).
  f.kv_heads = app.add_option("--kv-heads", o.shape.kv_heads,
                              "llama: key/value heads, dividing --heads (0: as many as "
                              "heads); tp may also be a multiple of it")
                   ->check(cli_checks::integer_at_least(0));
  f.tied =
      app.add_flag("--tied", o.shape.tied, "llama: the LM head shares the token embedding's table (default: its own)");
  f.shape.push_back(f.kv_heads);
  f.shape.push_back(f.tied);
  // Mixtral only (refused with the other models).
  f.experts = app.add_option("--experts", o.shape.experts, "mixtral: experts per block")
                  ->check(positive)
                  ->capture_default_str();
  f.top_k = app.add_option("--moe-top-k", o.shape.top_k, "mixtral: experts per token (at most --experts)")
                ->check(positive)
                ->capture_default_str();
  f.shared_ffn = app.add_option("--shared-ffn", o.shape.shared_ffn,
                                "mixtral: the width of a shared expert every token goes through (0: none)")
                     ->check(cli_checks::integer_at_least(0));
  for (auto* flag : {f.experts, f.top_k, f.shared_ffn}) f.shape.push_back(flag);
  // Mixtral's layout: with --search too (every layout keeps it), not with --params.
  f.expert_parallel = app.add_option("--ep", o.ep,
                                     "mixtral: expert-parallel degree: each block's experts shared out over ep "
                                     "ranks of the gradient group dp x cp (divides dp x cp and --experts)")
                          ->check(positive)
                          ->capture_default_str();
  f.shape.push_back(
      app.add_option("--global-batch", o.global_batch, "sequences per step over all ranks")->check(positive));
}

// Layout (plan mode; --search chooses these itself, but for the ones given as pins).
inline void add_layout_flags(CLI::App& app, options& o, plan_flags& f) {
  const auto positive = cli_checks::integer_at_least(1);
  f.layout.push_back(app.add_option("--micro-batch", o.micro_batch, "sequences per micro-batch")
                         ->check(positive)
                         ->capture_default_str());
  f.dp = app.add_option("--dp", o.dp, "data-parallel degree")->check(positive)->capture_default_str();
  f.zero = app.add_option("--zero", o.zero, "ZeRO stage 0-3 (1: optimizer state, 2: + gradients, 3: + weights)")
               ->check(CLI::IsMember({0, 1, 2, 3}))
               ->capture_default_str();
  f.context = app.add_option("--cp", o.cp,
                             "context-parallel degree: each sequence cut into 2 x cp chunks, two per rank "
                             "(--seq divisible by 2 x cp)")
                  ->check(positive)
                  ->capture_default_str();
  f.layout.push_back(app.add_option("--cp-form", o.cp_form,
                                    "how attention reaches the other context ranks: ring (key/value blocks passed "
                                    "round) or all_to_all (heads exchanged; the heads per tensor rank divide by cp)")
                         ->check(CLI::IsMember({"ring", "all_to_all"}))
                         ->capture_default_str());
  f.layout.push_back(app.add_option("--tp", o.tp, "tensor-parallel degree")->check(positive)->capture_default_str());
  f.layout.push_back(app.add_option("--pp", o.pp, "pipeline stages")->check(positive)->capture_default_str());
  f.layout.push_back(app.add_option("--virtual", o.virtual_chunks, "model chunks per stage (interleaved schedule)")
                         ->check(positive)
                         ->capture_default_str());
  f.sequence = app.add_flag("--sp,!--no-sp", o.sp, "sequence parallelism in the tensor-parallel group");
  f.recompute = app.add_option("--recompute", o.recompute, "activation recomputation: none, selective, full")
                    ->check(CLI::IsMember({"none", "selective", "full"}))
                    ->capture_default_str();
  f.schedule = app.add_option("--schedule", o.schedule,
                              "pipeline schedule: gpipe, 1f1b, interleaved (default 1f1b, "
                              "interleaved when --virtual > 1); with --search: 1f1b or interleaved only")
                   ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}));
  f.layout.push_back(f.schedule);
  f.search_pins = {f.context, f.sequence, f.recompute, f.zero, f.schedule};
  for (auto* flag : {f.context, f.sequence, f.recompute}) f.layout.push_back(flag);
}

// Training and device: what every mode reads.
inline void add_device_flags(CLI::App& app, options& o, plan_flags& f) {
  app.add_option("--precision", o.precision, "fp32, bf16 or fp16 (16-bit: with fp32 master weights)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "adamw (2 fp32 moments) or sgd (momentum: 1)")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->capture_default_str();
  app.add_option("--hw", o.hw, "device preset: " + preset_names())->check(device_preset())->capture_default_str();
  app.add_flag("--json", o.json, "print one JSON value instead of the table");
  f.hw_file = app.add_option("--hw-file", o.hw_file,
                             "a device as JSON: a preset (\"base\") with figures replaced, or a whole device_spec");
  f.hw_file->excludes(app.get_option("--hw"));
  f.explain = app.add_flag("--explain", o.explain, "print where one step's time goes");
  f.explain_svg = app.add_option("--explain-svg", o.explain_svg, "draw where one step's time goes as SVG bars");
}

// The modes other than the plan of one layout: back-of-envelope, calibration and search.
inline void add_mode_flags(CLI::App& app, options& o, plan_flags& f) {
  const auto positive = cli_checks::integer_at_least(1);
  f.params = app.add_option("--params", o.params, "model-state estimate for N parameters (70e9 or 70000000000)")
                 ->check(param_count());
  app.add_option("--master", o.master,
                 "with --params: fp32 master copy or none (default fp32 for "
                 "16-bit precisions)")
      ->check(CLI::IsMember({"fp32", "none"}))
      ->needs(f.params);

  f.calibrate = app.add_option("--calibrate", o.calibrate,
                               "print a device JSON for --hw-file from measurements on a device (GEMM times, "
                               "bandwidths; docs/planner.md)");

  f.search = app.add_flag("--search", o.search, "rank every layout of --gpus devices that fits");
  app.add_option("--gpus", o.gpus, "with --search: number of devices")->check(positive)->needs(f.search);
  app.add_option("--rank-layout", o.rank_layout,
                 "with --search: where the layout of these tensor, pipeline and data-parallel degrees ranks "
                 "(TP,PP,DP), and how much faster the first is")
      ->delimiter(',')
      ->expected(3)
      ->check(positive)
      ->needs(f.search);
  app.add_option("--top", o.top, "with --search: how many layouts to show")
      ->check(positive)
      ->needs(f.search)
      ->capture_default_str();

  f.supported = app.add_flag("--supported", o.supported,
                             "print the table of the combinations strata refuses (device, axis, layer kind, "
                             "precision, schedule: policy/support.hpp) as docs/supported-combinations.md holds it");
}

// What each mode refuses: --params and --calibrate take no shape or layout, --search no layout
// but its pins, and only the plan of one layout explains its step.
inline void exclude_across_modes(const plan_flags& f) {
  for (auto* flag : f.shape) f.params->excludes(flag);
  for (auto* flag : f.layout) {
    f.params->excludes(flag);
    if (std::find(f.search_pins.begin(), f.search_pins.end(), flag) == f.search_pins.end()) f.search->excludes(flag);
  }
  f.params->excludes(f.search);
  f.calibrate->excludes(f.params);
  f.calibrate->excludes(f.search);
  f.calibrate->excludes(f.hw_file);
  for (auto* flag : f.shape) f.calibrate->excludes(flag);
  for (auto* flag : f.layout) f.calibrate->excludes(flag);
  f.params->excludes(f.expert_parallel);
  f.params->excludes(f.explain);
  f.params->excludes(f.explain_svg);
  f.search->excludes(f.explain);
  f.search->excludes(f.explain_svg);
  f.search->excludes(f.dp);
  for (auto* mode : {f.params, f.calibrate, f.search}) f.supported->excludes(mode);
}

// Every flag, bound to o, in the order --help lists them.
inline plan_flags add_flags(CLI::App& app, options& o) {
  plan_flags f;
  add_shape_flags(app, o, f);
  add_layout_flags(app, o, f);
  add_device_flags(app, o, f);
  add_mode_flags(app, o, f);
  exclude_across_modes(f);
  return f;
}

// After parsing: the search pins are the layout flags given.
inline void note_search_pins(const plan_flags& f, options& o) {
  o.pin_zero = f.zero->count() > 0;
  o.pin_cp = f.context->count() > 0;
  o.pin_recompute = f.recompute->count() > 0;
  o.pin_sp = f.sequence->count() > 0;
  o.pin_schedule = f.schedule->count() > 0;
}

// The flags of one model family given with another, and Mixtral's experts against its layout.
inline void check_family_flags(const options& o, const plan_flags& f) {
  if (o.model == "gpt2") {
    if (f.kv_heads->count() > 0)
      throw usage_error("--kv-heads needs --model llama or mixtral (GPT-2 has as many key/value heads as heads)");
    if (f.tied->count() > 0) throw usage_error("--tied needs --model llama or mixtral (GPT-2's head is always tied)");
  }
  if (o.model == "neox") {
    if (f.kv_heads->count() > 0)
      throw usage_error("--kv-heads needs --model llama or mixtral (GPT-NeoX has as many key/value heads as heads)");
    if (f.tied->count() > 0) throw usage_error("--tied needs --model llama or mixtral (GPT-NeoX's head is untied)");
  }
  if (o.model != "mixtral")
    for (auto* flag : {f.experts, f.top_k, f.shared_ffn, f.expert_parallel})
      if (flag->count() > 0) throw usage_error(flag->get_name() + " needs --model mixtral");
  if (o.model == "mixtral" && o.shape.top_k > o.shape.experts)
    throw usage_error("--moe-top-k " + std::to_string(o.shape.top_k) + " is more than --experts " +
                      std::to_string(o.shape.experts));
  if (o.model == "mixtral" && o.shape.experts % o.ep != 0)
    throw usage_error("--ep " + std::to_string(o.ep) + " does not divide --experts " + std::to_string(o.shape.experts) +
                      " (each rank of the expert group holds --experts / --ep of a block's experts)");
}

// Plan and search need a shape and a batch (and the search its GPUs).
inline void check_plan_flags(const options& o) {
  std::string missing;
  const std::pair<const char*, std::int64_t> required[] = {
      {"--layers", o.shape.layers}, {"--hidden", o.shape.d_model}, {"--heads", o.shape.heads},
      {"--seq", o.shape.seq},       {"--vocab", o.shape.vocab},    {"--global-batch", o.global_batch}};
  for (const auto& [name, value] : required)
    if (value == 0) missing += (missing.empty() ? "" : ", ") + std::string(name);
  if (o.search && o.pin_schedule && o.schedule == "gpipe")
    throw usage_error("--search ranks the 1f1b and interleaved schedules; --schedule gpipe pins none of them");
  if (o.search && o.gpus == 0) missing += (missing.empty() ? "" : ", ") + std::string("--gpus");
  if (!missing.empty())
    throw usage_error("missing " + missing +
                      " (a plan needs --layers, --hidden, --heads, --seq, --vocab and --global-batch; "
                      "--search also --gpus; or give --params N for the model-state estimate); see --help");
  if (o.search && o.gpus % o.ep != 0)
    throw usage_error("--ep " + std::to_string(o.ep) + " does not divide --gpus " + std::to_string(o.gpus) +
                      " (the expert group lies within dp x cp, which divides the GPUs)");
  STRATA_CHECK(o.shape.d_model % o.shape.heads == 0, "--heads ", o.shape.heads, " does not divide --hidden ",
               o.shape.d_model);
}

// What Llama's layers would refuse of the shape flags, said in the flags' words.
inline void check_llama_flags(const strata::models::model_shape& s) {
  if (s.kv_heads > 0 && s.heads % s.kv_heads != 0)
    throw usage_error("--kv-heads " + std::to_string(s.kv_heads) + " does not divide --heads " +
                      std::to_string(s.heads));
  if ((s.d_model / s.heads) % 2 != 0)
    throw usage_error("the rotary embedding needs an even head size, got --hidden " + std::to_string(s.d_model) +
                      " / --heads " + std::to_string(s.heads) + " = " + std::to_string(s.d_model / s.heads));
}

}  // namespace strata_plan
