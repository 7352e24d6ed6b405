// strata/train/checkpoint_compatibility.hpp - whether a checkpoint, or a directory's run, is this run's to continue.
//
// A resume must not continue another run by mistake: a checkpoint of another model, precision or
// seed would go on training something else from its numbers, and changed training settings make
// the remaining steps differ from those the saved run would have taken. These checks compare what
// a manifest or run.json records with the running model (its description as JSON), precision,
// seed and settings, and return or throw one message saying what differs, so that every rank can
// fail with the same words. The layout is not compared: a checkpoint loads under any layout.
#pragma once
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "strata/core/error.hpp"
#include "strata/train/checkpoint_format.hpp"
#include "strata/train/run_settings.hpp"
#include "strata/train/safetensors.hpp"

namespace strata::detail {

// How a run of policy P records its precision (manifests and run files).
template <class P>
nlohmann::json precision_json() {
  using T = typename P::storage;
  using M = typename P::master;
  return {{"storage", safetensors_dtype<T>()},
          {"master", safetensors_dtype<M>()},
          {"master_copy", P::precision::keeps_master_copy}};
}

// A field of the model description that differs, for the refusal message.
inline std::string model_difference(const nlohmann::json& saved, const nlohmann::json& here) {
  for (auto it = here.begin(); it != here.end(); ++it) {
    const auto there = saved.find(it.key());
    if (there == saved.end()) return it.key() + " is missing there (" + it.value().dump() + " here)";
    if (*there != it.value()) return it.key() + " " + there->dump() + " there, " + it.value().dump() + " here";
  }
  return "it has fields this run does not (" + saved.dump() + ")";
}

// A checkpoint of another model than `model`, or saved in another precision than P's, is
// refused, naming the difference.
template <class P>
void check_same_model_and_precision(const nlohmann::json& manifest, const std::string& step_dir,
                                    const nlohmann::json& model) {
  STRATA_CHECK(manifest.at("model") == model, "checkpoint '", step_dir,
               "' is of another model: ", model_difference(manifest.at("model"), model));
  const nlohmann::json precision = precision_json<P>();
  STRATA_CHECK(manifest.at("precision") == precision, "checkpoint '", step_dir, "' was saved in precision ",
               manifest.at("precision").dump(), "; this run uses ", precision.dump());
}

// A run file's run, for messages: its id, its seed when it has one, and its model.
inline std::string describe_run(const nlohmann::json& r) {
  std::string s = "run " + r.at("run").get<std::string>();
  if (r.contains("seed")) s += ", seed " + std::to_string(r.at("seed").get<std::uint64_t>());
  const std::string model = r.at("model").dump();
  return s + ", model " + (model.size() > 120 ? model.substr(0, 117) + "..." : model);
}

// Rank 0, resuming with no complete checkpoint in `dir`: why the directory's run.json (`dir_run`,
// as read_run_file gave it) is another run's (another model, precision or seed), or "" when it is
// this run's or there is none. The layout is not part of a run's identity: a resume may change it.
template <class P>
std::string other_run(const std::string& dir, const std::optional<nlohmann::json>& dir_run, const nlohmann::json& model,
                      const std::optional<std::uint64_t>& seed) {
  if (!dir_run) return {};
  const nlohmann::json& r = *dir_run;
  const std::string head = "checkpoint directory '" + dir + "' belongs to another run (" + checkpoint_files::run_file +
                           ": run " + r.at("run").get<std::string>() + "): ";
  if (r.at("model") != model) return head + "it is of another model: " + model_difference(r.at("model"), model);
  if (r.at("precision") != precision_json<P>())
    return head + "it was saved in precision " + r.at("precision").dump() + "; this run uses " +
           precision_json<P>().dump();
  if (seed && r.contains("seed") && r.at("seed").get<std::uint64_t>() != *seed)
    return head + "it was trained with seed " + std::to_string(r.at("seed").get<std::uint64_t>()) +
           "; this run has seed " + std::to_string(*seed) + " (the data order would change)";
  return {};
}

// Rank 0, about to resume from `step_dir` a run of `model`, `seed` and `settings`: "" to go on,
// or why not. Another run's checkpoint (model, precision, seed) is refused first, in
// checkpointer::load()'s words; then each training setting that differs from the checkpoint's
// is printed, and those that change the steps refused unless `allow_setting_changes`.
template <class P>
std::string continuation(const std::string& step_dir, const nlohmann::json& model,
                         const std::optional<std::uint64_t>& seed, const training_settings& settings,
                         bool allow_setting_changes) {
  const nlohmann::json m = checkpoint_files::read_manifest(step_dir);
  check_same_model_and_precision<P>(m, step_dir, model);
  const auto saved_seed = m.at("data").at("seed").get<std::uint64_t>();
  if (seed && saved_seed != *seed)
    return "the checkpoint in '" + step_dir + "' was trained with seed " + std::to_string(saved_seed) +
           "; this run has seed " + std::to_string(*seed) + " (the data order would change)";
  if (!m.contains("settings")) {
    if (!settings.values.empty())
      std::fprintf(stderr, "resume: '%s' records no training settings (an older strata saved it): not compared\n",
                   step_dir.c_str());
    return {};
  }
  const auto changes = compare_settings(m.at("settings"), settings);
  if (changes.empty()) return {};
  std::fprintf(stderr, "resume: training settings that differ from those '%s' was saved with:\n", step_dir.c_str());
  std::string refused;
  bool only_length = true;  // every refused change is to the run's length or its schedule's
  for (const auto& c : changes) {
    std::fprintf(stderr, "resume:   %s%s\n", c.text().c_str(), c.changes_steps ? "" : " (changes no step's numbers)");
    if (!c.changes_steps) continue;
    if (!refused.empty()) refused += ", ";
    refused += c.text();
    only_length = only_length && sets_run_length(c.name);
  }
  if (refused.empty()) return {};
  const int step = m.at("step").get<int>();
  // No step the saved run had still to take is taken here: extending a finished run (only its
  // length changes), or taking no step at all (an export, a sample).
  if (shared_steps(m.at("settings"), settings, step) == 0 && (only_length || steps_to_take(settings, step) == 0)) {
    std::fprintf(stderr, "resume: no step the saved run had still to take is taken here: the new settings apply\n");
    return {};
  }
  if (allow_setting_changes) {
    std::fprintf(stderr, "resume: continuing under the changed settings, as allowed\n");
    return {};
  }
  return "resume: the training settings differ from those '" + step_dir + "' was saved with (" + refused +
         "), so the run would not continue as it was trained: resume with its settings, or allow the change "
         "(gpt2_train --resume-with-changes)";
}

}  // namespace strata::detail
