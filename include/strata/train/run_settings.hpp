// strata/train/run_settings.hpp - the training settings a run is saved with, and what a resume changes.
//
// A checkpoint restores the run's state (weights, moments, step, loss scaler, data position); the
// settings its next steps run under - the learning rate and its schedule, the batch, clipping,
// AdamW's constants, the data - come from the program that resumes it. So every checkpoint
// records them (the manifest's "settings"), and checkpointer::resume compares them with the
// resuming program's: each difference is printed ("lr: 0.003 -> 0.002"), and one that makes the
// steps differ from those the saved run would have taken is refused unless the program allows it
// (checkpoint_options::allow_setting_changes). A program that records how many steps it plans
// ("steps") may extend a run that reached its end - the run's length and its schedule's are all
// that change - and may resume one just to export or sample, taking no step, under any settings;
// any other change with steps still to take is refused.
#pragma once
#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/optim/adamw.hpp"
#include "strata/train/trainer.hpp"

namespace strata {

// The setting a program records as the number of steps its run plans (its loop's end).
inline constexpr const char* planned_steps = "steps";

// A run's training settings, by name. Values are numbers, strings or booleans.
struct training_settings {
  nlohmann::json values = nlohmann::json::object();
  // Names whose change leaves every step's numbers as they were (a limit that only decides when
  // to stop, a value a resume restores from the checkpoint anyway).
  std::vector<std::string> free{};

  bool is_free(const std::string& name) const { return std::find(free.begin(), free.end(), name) != free.end(); }
};

// One setting that differs between a checkpoint and the program resuming it.
struct setting_change {
  std::string name;
  nlohmann::json before, after;  // null: not recorded on that side
  bool changes_steps = true;
  // "lr: 0.003 -> 0.002"
  std::string text() const {
    const auto shown = [](const nlohmann::json& v) { return v.is_null() ? std::string("(not recorded)") : v.dump(); };
    return name + ": " + shown(before) + " -> " + shown(after);
  }
};

// Every setting that differs between `saved` (a checkpoint's record) and `now`, by name. One
// recorded on one side only (a strata that records more, or fewer) is listed but does not count
// as changing the steps: nothing says what it was.
inline std::vector<setting_change> compare_settings(const nlohmann::json& saved, const training_settings& now) {
  std::vector<setting_change> out;
  const nlohmann::json none;
  const auto at = [&](const nlohmann::json& o, const std::string& k) -> const nlohmann::json& {
    const auto it = o.find(k);
    return it == o.end() ? none : *it;
  };
  std::vector<std::string> names;
  for (auto it = saved.begin(); it != saved.end(); ++it) names.push_back(it.key());
  for (auto it = now.values.begin(); it != now.values.end(); ++it) names.push_back(it.key());
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  for (const auto& name : names) {
    const nlohmann::json &before = at(saved, name), &after = at(now.values, name);
    // 16 and 16.0 are one batch size: numbers compare by value.
    const bool same =
        before.is_number() && after.is_number() ? before.get<double>() == after.get<double>() : before == after;
    if (same) continue;
    out.push_back({name, before, after, !before.is_null() && !after.is_null() && !now.is_free(name)});
  }
  return out;
}

// The steps a run's record plans; one that records no plan runs on without end.
inline long long planned_steps_of(const nlohmann::json& values) {
  const auto it = values.find(planned_steps);
  return it != values.end() && it->is_number_integer() ? it->get<long long>() : LLONG_MAX;
}
// How many steps from `step` on both the saved run and this one take (each its planned_steps):
// those a change of settings could make differ from the saved run's.
inline long long shared_steps(const nlohmann::json& saved, const training_settings& now, int step) {
  return std::max(0LL, std::min(planned_steps_of(saved), planned_steps_of(now.values)) - step);
}
// How many steps this run takes from `step` on.
inline long long steps_to_take(const training_settings& now, int step) {
  return std::max(0LL, planned_steps_of(now.values) - step);
}
// A setting that extending a finished run may change of necessity: its length, its schedule's, and
// a warm-up a program ties to the length (gpt2_train's, when --warmup exceeds --steps).
inline bool sets_run_length(const std::string& name) {
  return name == planned_steps || name == "total_steps" || name == "warmup_steps";
}

// The settings of AdamW's and the trainer's options (st::training: options().optimizer and
// options().trainer) that decide each step's numbers. The loss scaler's starting scale is free:
// a resume restores the scale the checkpoint saved. So is the limit of skipped steps in a row.
inline training_settings settings_of(const adamw_options& optimizer, const trainer_options& trainer) {
  training_settings s;
  auto& v = s.values;
  v["lr"] = optimizer.lr;
  v["min_lr"] = trainer.schedule.min_lr;
  v["warmup_steps"] = trainer.schedule.warmup_steps;
  v["total_steps"] = trainer.schedule.total_steps;  // the schedule's length
  v["beta1"] = optimizer.beta1;
  v["beta2"] = optimizer.beta2;
  v["eps"] = optimizer.eps;
  v["weight_decay"] = optimizer.weight_decay;
  v["micro_batch"] = trainer.micro_batch;
  v["grad_clip"] = trainer.grad_clip;
  v["loss_scale_growth_interval"] = trainer.loss_scale_growth_interval;
  v["initial_loss_scale"] = trainer.initial_loss_scale;
  v["nonfinite_step_limit"] = trainer.nonfinite_step_limit;
  s.free = {"initial_loss_scale", "nonfinite_step_limit"};
  return s;
}

}  // namespace strata
