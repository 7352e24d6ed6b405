// strata/train/checkpoint.hpp - checkpoints that survive crashes and load under another layout.
//
// checkpointer saves a run as one directory per step and resumes from the newest that verifies
// (train/checkpoint_format.hpp: the files and their readers). Every file goes through
// write_file_durably (tmp, fsync, rename, fsync the directory), and rank 0 writes the manifest
// and then COMPLETE only after every rank has reported its file written. So a crash at any point
// leaves either a checkpoint that verifies or one without COMPLETE, which resume() passes over
// for the one before.
//
// Each rank saves the pieces of the parameters it updates, and loads its part of every parameter
// from the pieces of whatever layout saved them (train/checkpoint_resharding.hpp). Before
// anything is loaded, resume() refuses a checkpoint of another model, precision or seed, and
// changed training settings that would alter the steps (train/checkpoint_compatibility.hpp).
//
// One run at a time writes DIR: rank 0 holds an exclusive lock on DIR/run.lock for the
// checkpointer's life (train/directory_lock.hpp), and a second process is refused at start-up,
// on every rank, naming the holder's host and process id.
#pragma once
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/comm/group_ref.hpp"
#include "strata/core/error.hpp"
#include "strata/optim/loss_scaler.hpp"
#include "strata/train/checkpoint_compatibility.hpp"
#include "strata/train/checkpoint_format.hpp"
#include "strata/train/checkpoint_resharding.hpp"
#include "strata/train/directory_lock.hpp"
#include "strata/train/durable_file.hpp"
#include "strata/train/fault.hpp"
#include "strata/train/run_settings.hpp"

namespace strata {

// What a checkpoint restores besides tensors. strata's random streams are counter-based
// (seed, counter), so the seed and the data position are the whole of their state.
struct train_progress {
  int step = 0;             // optimizer steps done
  int optimizer_steps = 0;  // AdamW's own count (smaller when fp16 overflows skipped steps)
  loss_scaler::state scaler{};
  std::uint64_t seed = 0, data_position = 0;
};

struct checkpoint_options {
  std::string dir;
  int keep = 0;  // newest complete checkpoints kept; 0 keeps every one
  // The run's training settings (run_settings.hpp; settings_of() gives st::training's), recorded
  // in every manifest. resume() prints each that differs from the loaded checkpoint's, and
  // refuses a change that makes the steps differ from the saved run's unless allowed here.
  training_settings settings{};
  bool allow_setting_changes = false;
};

struct loaded_checkpoint {
  std::string path;  // the step directory
  train_progress progress;
  nlohmann::json layout;  // the layout it was saved under
};

// Saves and restores one run's checkpoints. Every call is collective over `world`.
class checkpointer {
 public:
  // `layout` and `model` describe the run (as JSON objects): the layout is recorded, the model
  // must match on load (a checkpoint of another model is refused, naming the field). `seed`, when
  // given, is part of the run's identity with the model and precision (not the layout, which a
  // resume may change): a directory of another seed is refused too.
  checkpointer(checkpoint_options o, group_ref world, nlohmann::json layout, nlohmann::json model,
               std::optional<std::uint64_t> seed = std::nullopt)
      : opt_(std::move(o)),
        world_(std::move(world)),
        layout_(std::move(layout)),
        model_(std::move(model)),
        seed_(seed),
        fault_(fault_injection::from_env()) {
    if (world_.rank() == 0) run_id_ = new_run_id();
    STRATA_CHECK(!opt_.dir.empty(), "checkpoint: no directory given");
    STRATA_CHECK(opt_.keep >= 0, "checkpoint: keep (", opt_.keep, ") must be >= 0");
    // Before anything in the directory is read, written or deleted: one run at a time. Two runs
    // share a run id when both resume one run, so only the lock tells them apart; each would
    // delete the other's unfinished saves. The write test waits until resume() has cleared
    // what a crash left (a full disk may be full of it): start_new_run(), resume(), save().
    const std::string refusal = rank0_verdict([&]() -> std::string {
      try {
        std::filesystem::create_directories(opt_.dir);
        std::string holder;
        lock_ = directory_lock::take(opt_.dir, holder);
        if (lock_) return {};
        return "checkpoint directory '" + opt_.dir + "' is in use by another run: " + holder + " holds its lock '" +
               (std::filesystem::path(opt_.dir) / directory_lock::file_name).string() +
               "' (two runs saving there would delete each other's checkpoints); let that run end, or save under "
               "another directory";
      } catch (const std::exception& e) {
        return "checkpoint: cannot write checkpoints under '" + opt_.dir + "': " + e.what();
      }
    });
    if (!refusal.empty()) fail(refusal);
  }

  const std::string& dir() const { return opt_.dir; }

  // For a run that starts over rather than resuming: refuses, on every rank alike and before
  // anything is written or deleted, a directory that holds another run's checkpoints (its
  // run.json, or step directories of a run that wrote none): saving there would overwrite them,
  // and a later resume would pick up the other run's.
  void start_new_run() {
    const std::string refusal = rank0_verdict([&]() -> std::string {
      if (const auto other = checkpoint_files::read_run_file(opt_.dir))
        return "checkpoint directory '" + opt_.dir + "' belongs to another run (" + detail::describe_run(*other) +
               "): resume that run (gpt2_train --resume), or save under another directory";
      if (const auto all = checkpoint_files::steps(opt_.dir); !all.empty())
        return "checkpoint directory '" + opt_.dir + "' already holds checkpoints of another run (" +
               std::filesystem::path(checkpoint_files::step_dir(opt_.dir, all.back())).filename().string() + ", no " +
               checkpoint_files::run_file + "): resume that run (gpt2_train --resume), or save under another directory";
      return {};
    });
    if (!refusal.empty()) fail(refusal);
    check_writable();
  }

  // Writes the checkpoint of step `at.step`; returns its directory once it is complete.
  template <class P>
  std::string save(const train_progress& at, train_state_ref<P> s) {
    const std::string step_dir = checkpoint_files::step_dir(opt_.dir, at.step);
    const int rank = world_.rank(), ranks = world_.size();
    // The first save claims the directory for this run, before anything in it is touched; one
    // that another run owns is refused (a run that neither resumed nor called start_new_run()).
    if (!claimed_) {
      check_writable();  // a program that neither resumed nor called start_new_run()
      const std::string refusal = rank0_verdict([&] { return claim<P>(); });
      if (!refusal.empty()) fail(refusal);
      claimed_ = true;
    }
    // Rank 0 clears what an earlier attempt at this step left, then makes the directory.
    on_rank0_or_fail("cannot create checkpoint directory '" + step_dir + "'", [&] {
      namespace fs = std::filesystem;
      fs::create_directories(opt_.dir);
      if (fs::exists(step_dir)) {
        fs::remove(fs::path(step_dir) / checkpoint_files::complete);
        fs::remove_all(step_dir);
      }
      fs::create_directory(step_dir);
      detail::fsync_directory(opt_.dir);
    });

    const std::string path = (std::filesystem::path(step_dir) / checkpoint_files::rank_file(rank)).string();
    const auto bytes = detail::resharding::encode_shard(s, at.step, rank);
    if (fault_.kill_during_save == at.step && fault_.targets(rank, ranks)) {
      write_partial_file(path, bytes, bytes.size() / 2);
      fault_injection::die("while writing its checkpoint shard");
    }
    double mine[3] = {1.0, double(bytes.size()), double(crc32_of(bytes))};
    const bool disk_full = fault_.disk_full_during_save == at.step && fault_.targets(rank, ranks);
    if (fault_.slow_save_ms >= 0 && fault_.targets(rank, ranks))
      std::this_thread::sleep_for(std::chrono::milliseconds(fault_.slow_save_ms));
    try {
      write_file_durably(path, bytes, disk_full ? bytes.size() / 2 : SIZE_MAX);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "checkpoint: rank %d: %s\n", rank, e.what());
      mine[0] = 0;
    }
    std::vector<double> all(3 * static_cast<std::size_t>(ranks));
    world_.all_gather(std::span<const double>(mine, 3), std::span<double>(all));
    for (int r = 0; r < ranks; ++r)
      STRATA_CHECK(all[3 * std::size_t(r)] == 1.0, "checkpoint: rank ", r, " could not write its file in '", step_dir,
                   "'");

    // Every file is on disk: the manifest, then the marker that makes the checkpoint count.
    on_rank0_or_fail("cannot complete checkpoint '" + step_dir + "'", [&] {
      nlohmann::ordered_json m;
      m["format"] = "strata-checkpoint";
      m["version"] = 1;
      m["run"] = run_id_;
      m["step"] = at.step;
      m["layout"] = layout_;
      m["model"] = model_;
      m["precision"] = detail::precision_json<P>();
      m["optimizer"] = {{"steps", at.optimizer_steps}};
      m["loss_scaler"] = {
          {"scale", at.scaler.scale}, {"clean_steps", at.scaler.clean_steps}, {"skipped", at.scaler.skipped}};
      m["data"] = {{"seed", at.seed}, {"position", at.data_position}};
      m["settings"] = opt_.settings.values;
      m["files"] = nlohmann::json::array();
      for (int r = 0; r < ranks; ++r)
        m["files"].push_back(
            {{"name", checkpoint_files::rank_file(r)},
             {"rank", r},
             {"bytes", static_cast<std::uint64_t>(all[3 * std::size_t(r) + 1])},
             {"crc32", checkpoint_files::hex32(static_cast<std::uint32_t>(all[3 * std::size_t(r) + 2]))}});
      const std::string text = m.dump(1) + "\n";
      write_file_durably((std::filesystem::path(step_dir) / checkpoint_files::manifest).string(), text);
      const auto* p = reinterpret_cast<const unsigned char*>(text.data());
      write_file_durably((std::filesystem::path(step_dir) / checkpoint_files::complete).string(),
                         "crc32 " + checkpoint_files::hex32(crc32_of({p, text.size()})) + "\n");
      prune(at.step);
    });
    return step_dir;
  }

  // Loads the newest checkpoint under dir() that verifies, passing over (and reporting on rank 0)
  // newer ones that do not, and adopts the directory's run. The rules, so that a restart never
  // needs a human and never loses progress silently:
  //   - an incomplete attempt (no COMPLETE marker: a crash while saving) is passed over, and
  //     removed once this run is known to be the directory's;
  //   - no complete checkpoint: nullopt, a fresh start - unless run.json says the directory is
  //     another model's, precision's or seed's run (refused, naming the field);
  //   - complete checkpoints but none verifies (damage, not a crash): an error listing why each
  //     was refused, since starting over would silently throw the run away;
  //   - the one loaded must be of this model and precision (load()) and seed;
  //   - each training setting that differs from the one it was saved with is printed, and a
  //     change that makes the steps differ is refused unless options.allow_setting_changes.
  // All of these are decided before anything is written or deleted, and every rank fails with
  // the same words.
  template <class P>
  std::optional<loaded_checkpoint> resume(train_state_ref<P> s) {
    double chosen = -1;
    std::vector<int> incomplete;  // rank 0's
    const std::string refusal = rank0_verdict([&]() -> std::string {
      dir_run_ = checkpoint_files::read_run_file(opt_.dir);
      const auto scan = checkpoint_files::scan(opt_.dir);
      for (const auto& why : scan.damaged) std::fprintf(stderr, "resume: skipping %s\n", why.c_str());
      incomplete = scan.incomplete;
      if (scan.newest) {
        chosen = *scan.newest;
        return detail::continuation<P>(checkpoint_files::step_dir(opt_.dir, *scan.newest), model_, seed_, opt_.settings,
                                       opt_.allow_setting_changes);
      }
      if (!scan.damaged.empty())
        return detail::concat("resume: none of the ", scan.damaged.size(), " checkpoints in '", opt_.dir,
                              "' can be loaded (the reasons are printed above)");
      return detail::other_run<P>(opt_.dir, dir_run_, model_, seed_);
    });
    world_.broadcast(std::span<double>(&chosen, 1), 0);
    if (!refusal.empty()) fail(refusal);
    std::optional<loaded_checkpoint> out;
    if (chosen >= 0) {
      out = load(checkpoint_files::step_dir(opt_.dir, static_cast<int>(chosen)), s);
      STRATA_CHECK(!seed_ || out->progress.seed == *seed_, "the checkpoint in '", out->path, "' was trained with seed ",
                   out->progress.seed, "; this run has seed ", *seed_, " (the data order would change)");
    }
    // The directory is this run's: what a crash left half-written goes, and its run id is ours.
    const std::string cleanup = rank0_verdict([&]() -> std::string {
      if (!incomplete.empty()) {
        std::string names;
        for (const int step : incomplete) {
          const std::string d = checkpoint_files::step_dir(opt_.dir, step);
          remove_step_dir(d);
          if (!names.empty()) names += ", ";
          names += std::filesystem::path(d).filename().string();
        }
        detail::fsync_directory(opt_.dir);
        std::fprintf(stderr, "resume: removed %zu incomplete checkpoint%s in '%s' (%s: a run stopped while saving)\n",
                     incomplete.size(), incomplete.size() == 1 ? "" : "s", opt_.dir.c_str(), names.c_str());
      }
      if (dir_run_) run_id_ = dir_run_->at("run").get<std::string>();
      else if (out) run_id_ = checkpoint_files::read_manifest(out->path).value("run", run_id_);
      return {};
    });
    if (!cleanup.empty()) fail("resume: cannot remove the incomplete checkpoints in '", opt_.dir, "': ", cleanup);
    check_writable();  // after the clean-up, which may be what frees the space
    return out;
  }

  // Loads the checkpoint in `step_dir` into this rank's state, whatever layout saved it.
  template <class P>
  loaded_checkpoint load(const std::string& step_dir, train_state_ref<P> s) {
    try {
      return load_unchecked(step_dir, s);
    } catch (const nlohmann::json::exception& e) { fail("checkpoint '", step_dir, "' is malformed: ", e.what()); }
  }

 private:
  using json = nlohmann::json;

  // Runs `body` on rank 0; every rank then fails alike if it threw.
  template <class F>
  void on_rank0_or_fail(const std::string& what, F&& body) {
    double ok = 1;
    if (world_.rank() == 0) {
      try {
        body();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "checkpoint: %s\n", e.what());
        ok = 0;
      }
    }
    world_.broadcast(std::span<double>(&ok, 1), 0);
    STRATA_CHECK(ok == 1, "checkpoint: ", what);
  }

  // At start-up, not hours later at the first save: the directory must be writable. The probe's
  // name is this process's own, so that two processes never remove each other's.
  void check_writable() {
    if (writable_checked_) return;
    on_rank0_or_fail("cannot write checkpoints under '" + opt_.dir + "'", [&] {
      std::string name = ".strata-write-test.";
      name += directory_lock::host_name();
      name += '.';
      name += std::to_string(::getpid());
      const std::string probe = (std::filesystem::path(opt_.dir) / name).string();
      try {
        write_file_durably(probe, std::string("ok\n"));
      } catch (...) {
        std::error_code ignored;
        std::filesystem::remove(probe, ignored);
        throw;
      }
      std::filesystem::remove(probe);
    });
    writable_checked_ = true;
  }

  template <class P>
  loaded_checkpoint load_unchecked(const std::string& step_dir, train_state_ref<P> s) {
    namespace pieces = detail::resharding;
    const json manifest = checkpoint_files::read_manifest(step_dir);
    detail::check_same_model_and_precision<P>(manifest, step_dir, model_);
    const pieces::saved_pieces saved = pieces::read_pieces<P>(manifest, step_dir, s.params);
    for (const auto& e : s.params.entries()) {
      const auto found = saved.by_param.find(e.name);
      STRATA_CHECK(found != saved.by_param.end(), "checkpoint '", step_dir, "' holds no parameter '", e.name, "'");
      pieces::install_rank_part(e, pieces::assemble_serial(e, found->second, step_dir), s);
    }
    loaded_checkpoint out = saved_progress(manifest, step_dir);
    s.optimizer.restore_steps_taken(out.progress.optimizer_steps);
    return out;
  }

  // Where the run stood when the checkpoint was saved: the step, the optimizer's and loss
  // scaler's counts, and the data's seed and position.
  static loaded_checkpoint saved_progress(const json& manifest, const std::string& step_dir) {
    loaded_checkpoint out;
    out.path = step_dir;
    out.layout = manifest.at("layout");
    auto& pr = out.progress;
    pr.step = manifest.at("step").get<int>();
    pr.optimizer_steps = manifest.at("optimizer").at("steps").get<int>();
    pr.scaler.scale = manifest.at("loss_scaler").at("scale").get<double>();
    pr.scaler.clean_steps = manifest.at("loss_scaler").at("clean_steps").get<int>();
    pr.scaler.skipped = manifest.at("loss_scaler").at("skipped").get<long>();
    pr.seed = manifest.at("data").at("seed").get<std::uint64_t>();
    pr.data_position = manifest.at("data").at("position").get<std::uint64_t>();
    return out;
  }

  // Keeps the newest `keep` complete checkpoints (step <= newest) and drops older incomplete
  // ones. COMPLETE goes first, so a crash mid-delete leaves nothing that looks loadable.
  void prune(int newest) {
    namespace fs = std::filesystem;
    const auto all = checkpoint_files::steps(opt_.dir);
    int complete_seen = 0;
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      if (*it > newest) continue;
      const std::string d = checkpoint_files::step_dir(opt_.dir, *it);
      const bool complete = fs::exists(fs::path(d) / checkpoint_files::complete);
      if (complete && (opt_.keep == 0 || complete_seen < opt_.keep)) {
        ++complete_seen;
        continue;
      }
      fs::remove(fs::path(d) / checkpoint_files::complete);
      fs::remove_all(d);
    }
    detail::fsync_directory(opt_.dir);
  }

  // ---- the run that owns the directory ----

  // Runs `body` on rank 0 and gives every rank its answer: "" when all is well, otherwise the
  // reason it returned or threw - so that every rank can fail with the same words.
  template <class F>
  std::string rank0_verdict(F&& body) {
    std::string text;
    if (world_.rank() == 0) {
      try {
        text = body();
      } catch (const std::exception& e) {
        text = e.what();
        if (text.empty()) text = "failed";
      }
    }
    double size = double(text.size());
    world_.broadcast(std::span<double>(&size, 1), 0);
    std::vector<double> chars(static_cast<std::size_t>(size));
    for (std::size_t i = 0; i < chars.size() && world_.rank() == 0; ++i) chars[i] = static_cast<unsigned char>(text[i]);
    if (!chars.empty()) world_.broadcast(std::span<double>(chars), 0);
    text.assign(chars.size(), ' ');
    for (std::size_t i = 0; i < chars.size(); ++i) text[i] = static_cast<char>(static_cast<int>(chars[i]));
    return text;
  }

  // 128 random bits: two runs of the same model and seed are still two runs.
  static std::string new_run_id() {
    std::random_device bits;
    std::string id;
    for (int i = 0; i < 4; ++i) id += checkpoint_files::hex32(static_cast<std::uint32_t>(bits()));
    return id;
  }

  template <class P>
  json identity_json() const {
    json r{{"format", "strata-run"},
           {"version", 1},
           {"run", run_id_},
           {"model", model_},
           {"precision", detail::precision_json<P>()}};
    if (seed_) r["seed"] = *seed_;
    return r;
  }

  // Rank 0, at the first save: writes run.json when the directory has none, atomically (a hard
  // link fails if another run got there first); otherwise it must name this run.
  template <class P>
  std::string claim() {
    namespace fs = std::filesystem;
    const fs::path path = fs::path(opt_.dir) / checkpoint_files::run_file;
    auto owner = checkpoint_files::read_run_file(opt_.dir);
    if (!owner) {
      fs::create_directories(opt_.dir);
      const std::string mine = path.string() + "." + run_id_;
      write_file_durably(mine, identity_json<P>().dump(1) + "\n");
      std::error_code not_linked;
      fs::create_hard_link(mine, path, not_linked);
      std::error_code ec;
      if (not_linked && !fs::exists(fs::symlink_status(path, ec)))
        fs::rename(mine, path);  // a filesystem without hard links: not atomic, but still a claim
      else fs::remove(mine);
      detail::fsync_directory(opt_.dir);
      owner = checkpoint_files::read_run_file(opt_.dir);
      STRATA_CHECK(owner.has_value(), "cannot write '", path.string(), "'");
    }
    if (owner->at("run").get<std::string>() == run_id_) return {};
    return "checkpoint directory '" + opt_.dir + "' belongs to another run (" + detail::describe_run(*owner) +
           "); this run will not write into it: resume that run (gpt2_train --resume), or save under another directory";
  }

  // COMPLETE first, so that a crash mid-delete leaves nothing that looks loadable.
  static void remove_step_dir(const std::string& d) {
    std::filesystem::remove(std::filesystem::path(d) / checkpoint_files::complete);
    std::filesystem::remove_all(d);
  }

  checkpoint_options opt_;
  group_ref world_;
  json layout_, model_;
  std::optional<std::uint64_t> seed_;
  // Rank 0 only: this run's id (adopted from the directory on resume) and the directory's run.
  std::string run_id_;
  std::optional<json> dir_run_;
  bool claimed_ = false;  // run.json checked (and written if absent) by this checkpointer
  bool writable_checked_ = false;
  std::shared_ptr<directory_lock> lock_;  // rank 0's, held while any copy of this checkpointer lives
  fault_injection fault_;
};

}  // namespace strata
