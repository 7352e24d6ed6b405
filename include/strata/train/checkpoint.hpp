// strata/train/checkpoint.hpp - checkpoints that survive crashes and load under another layout.
//
// A checkpoint is one directory per step:
//   DIR/step-00000600/rank-00000.safetensors ... rank-NNNNN.safetensors   one per world rank
//                     manifest.json    step, layout, model, precision, optimizer and data
//                                      state, and each rank file's size and CRC-32
//                     COMPLETE         written last; holds the manifest's CRC-32
// Every file goes through write_file_durably (tmp, fsync, rename, fsync the directory), and
// rank 0 writes the manifest and then COMPLETE only after every rank has reported its file
// written. So a crash at any point leaves either a checkpoint that verifies or one without
// COMPLETE, which resume() passes over for the one before.
//
// A rank file holds the pieces of parameters that rank updates (its optimizer segments): the
// weights (storage type), the fp32 master copy when the policy keeps one, and AdamW's two
// moments, each piece described in the file's metadata by its parameter name, its place in the
// rank's tensor-parallel shard, and that shard's split of the full tensor. Copies are saved
// once: replicated parameters by tensor rank 0, everything by data-parallel rank 0 when ZeRO
// does not split the optimizer (a rank's share of the experts by expert-data rank 0), nothing a
// pipeline stage holds as a replica of another's.
//
// Loading rebuilds each of this rank's parameters whole from every piece that holds part of it
// (whatever layout wrote them) and keeps its own part: model state exactly (values travel in
// their own dtype), optimizer state re-sharded to the segments this rank now owns. Each rank
// reads every rank file, so loading costs the whole checkpoint's bytes per rank; all ranks must
// see DIR (a shared filesystem).
//
// One run at a time writes DIR: rank 0 holds an exclusive lock on DIR/run.lock for the
// checkpointer's life (train/directory_lock.hpp), and a second process is refused at start-up,
// on every rank, naming the holder's host and process id.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/comm/group_ref.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/layers/parameters.hpp"
#include "strata/optim/adamw.hpp"
#include "strata/optim/loss_scaler.hpp"
#include "strata/train/directory_lock.hpp"
#include "strata/train/durable_file.hpp"
#include "strata/train/fault.hpp"
#include "strata/train/run_settings.hpp"
#include "strata/train/safetensors.hpp"
#include "strata/train/untrusted_json.hpp"

namespace strata {

// Where a rank sits, to decide which of several identical copies it saves.
struct checkpoint_place {
  int dp_rank = 0, tp_rank = 0, zero_stage = 0;
  int expert_data_rank = 0;  // among the ranks holding the same experts (expert parallelism)
};

// What a checkpoint restores besides tensors. strata's random streams are counter-based
// (seed, counter), so the seed and the data position are the whole of their state.
struct train_progress {
  int step = 0;             // optimizer steps done
  int optimizer_steps = 0;  // AdamW's own count (smaller when fp16 overflows skipped steps)
  loss_scaler::state scaler{};
  std::uint64_t seed = 0, data_position = 0;
};

// One rank's training state, by reference.
template <class P>
struct train_state_ref {
  parameter_store<typename P::storage>& params;
  adamw<P>& optimizer;
  checkpoint_place place{};
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

// Names and checks that need no communication.
namespace checkpoint_files {

inline constexpr const char* manifest = "manifest.json";
inline constexpr const char* complete = "COMPLETE";
// Who owns DIR: written by the first save of a run, checked by every later run (resume() adopts
// it; a run that does not resume refuses a directory that has one).
inline constexpr const char* run_file = "run.json";

inline std::string step_dir(const std::string& dir, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", step);
  return (std::filesystem::path(dir) / name).string();
}
inline std::string rank_file(int rank) {
  char name[40];
  std::snprintf(name, sizeof name, "rank-%05d.safetensors", rank);
  return name;
}

// The step a directory name stands for ("step-00000600": 600), or nullopt for any other name,
// including one whose number does not fit an int (no sscanf: its overflow is undefined).
inline std::optional<int> step_of_name(const std::string& name) {
  const std::string digits = name.size() > 5 && name.compare(0, 5, "step-") == 0 ? name.substr(5) : "";
  if (digits.empty() || digits.size() > 10 || digits.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  const long long step = std::stoll(digits);
  if (step > INT_MAX) return std::nullopt;
  const int s = static_cast<int>(step);
  if (name != std::filesystem::path(step_dir("", s)).filename().string()) return std::nullopt;  // one spelling
  return s;
}

// The steps with a directory under `dir`, complete or not, oldest first.
inline std::vector<int> steps(const std::string& dir) {
  std::vector<int> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (const auto step = step_of_name(entry.path().filename().string()); step && entry.is_directory(ec))
      out.push_back(*step);
  std::sort(out.begin(), out.end());
  return out;
}
// Whether a step directory carries its COMPLETE marker (a crash before it: an incomplete attempt).
inline bool marked_complete(const std::string& step_dir) {
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::path(step_dir) / complete, ec);
}

inline std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// Every manifest value strata uses, checked before use: a manifest edited and re-checksummed,
// or written by a buggy or foreign writer, is refused naming the file and the field, never
// narrowed (a step of 2^32 + 2 would read as 2) nor trusted (a loss scale of 0 divides by zero).
inline void check_manifest_values(const nlohmann::json& m, const std::string& path, const std::string& step_dir) {
  using json = nlohmann::json;
  const auto shown = [](const json& v) {
    std::string s = v.dump();
    return s.size() > 60 ? s.substr(0, 57) + "..." : s;
  };
  // The field at `keys` ("loss_scaler", "scale"), which must be there.
  const auto field = [&](std::initializer_list<const char*> keys, std::string& name) -> const json& {
    const json* v = &m;
    name.clear();
    for (const char* k : keys) {
      if (!name.empty()) name += '.';  // appended piece by piece: GCC 12 misreads "." + string (-Wrestrict)
      name += k;
      STRATA_CHECK(v->is_object() && v->contains(k), "checkpoint manifest '", path, "' has no field ", name);
      v = &(*v)[k];
    }
    return *v;
  };
  // An integer field in [lo, hi]: not 2.5, not "2", not a value that would wrap.
  const auto integer = [&](std::initializer_list<const char*> keys, long long lo, long long hi) {
    std::string name;
    const json& v = field(keys, name);
    long long x = 0;
    bool ok = false;
    if (v.is_number_unsigned()) {
      ok = v.get<std::uint64_t>() <= static_cast<std::uint64_t>(hi);
      if (ok) x = static_cast<long long>(v.get<std::uint64_t>());
    } else if (v.is_number_integer()) {
      x = v.get<std::int64_t>();
      ok = true;
    }
    STRATA_CHECK(ok && x >= lo && x <= hi, "checkpoint manifest '", path, "': ", name, " is ", shown(v),
                 "; expected a whole number from ", lo, " to ", hi);
    return x;
  };
  const auto unsigned64 = [&](std::initializer_list<const char*> keys) {
    std::string name;
    const json& v = field(keys, name);
    STRATA_CHECK(v.is_number_unsigned(), "checkpoint manifest '", path, "': ", name, " is ", shown(v),
                 "; expected a whole number from 0 to 2^64 - 1");
  };
  const auto object = [&](std::initializer_list<const char*> keys) {
    std::string name;
    const json& v = field(keys, name);
    STRATA_CHECK(v.is_object(), "checkpoint manifest '", path, "': ", name, " is ", shown(v), "; expected an object");
  };

  const long long step = integer({"step"}, 0, INT_MAX);
  const auto dir_step = step_of_name(std::filesystem::path(step_dir).filename().string());
  STRATA_CHECK(!dir_step || step == *dir_step, "checkpoint manifest '", path, "': step is ", step,
               ", but its directory is that of step ", dir_step.value_or(-1));
  object({"layout"});
  object({"model"});
  object({"precision"});
  integer({"optimizer", "steps"}, 0, step);  // AdamW counts applied steps only
  {
    std::string name;
    const json& scale = field({"loss_scaler", "scale"}, name);
    STRATA_CHECK(scale.is_number() && std::isfinite(scale.get<double>()) && scale.get<double>() > 0,
                 "checkpoint manifest '", path, "': ", name, " is ", shown(scale),
                 "; expected a positive finite number (every gradient is divided by it)");
  }
  integer({"loss_scaler", "clean_steps"}, 0, INT_MAX);
  integer({"loss_scaler", "skipped"}, 0, step);
  unsigned64({"data", "seed"});
  unsigned64({"data", "position"});
  if (m.contains("run")) {
    std::string name;
    const json& run = field({"run"}, name);
    STRATA_CHECK(run.is_string() && !run.get<std::string>().empty() && run.get<std::string>().size() <= 64,
                 "checkpoint manifest '", path, "': run is ", shown(run), "; expected a run id");
  }
  // The training settings: names to numbers, strings or booleans, shown in messages as they are.
  if (m.contains("settings")) {
    std::string name;
    const json& settings = field({"settings"}, name);
    STRATA_CHECK(settings.is_object() && settings.size() <= 1024, "checkpoint manifest '", path, "': settings is ",
                 shown(settings), "; expected an object of named settings");
    for (auto it = settings.begin(); it != settings.end(); ++it) {
      const json& v = it.value();
      const bool ok = (v.is_number() && std::isfinite(v.get<double>())) || v.is_boolean() ||
                      (v.is_string() && v.get<std::string>().size() <= 1024);
      STRATA_CHECK(ok && !it.key().empty() && it.key().size() <= 64, "checkpoint manifest '", path, "': settings.",
                   it.key().substr(0, 64), " is ", shown(v), "; expected a finite number, a string or a boolean");
    }
  }
  // One entry per world rank, in order, each naming that rank's file: a name is never a path
  // elsewhere ("../x"), and the loader can trust sizes and CRCs to be what they claim.
  std::string name;
  const json& files = field({"files"}, name);
  STRATA_CHECK(files.is_array() && !files.empty() && files.size() <= (1u << 20), "checkpoint manifest '", path,
               "': files is ", shown(files), "; expected one entry per rank");
  for (std::size_t r = 0; r < files.size(); ++r) {
    const json& e = files[r];
    const std::string at = "files[" + std::to_string(r) + "]";
    STRATA_CHECK(e.is_object(), "checkpoint manifest '", path, "': ", at, " is ", shown(e), "; expected an object");
    const auto entry = [&](const char* key) -> const json& {
      STRATA_CHECK(e.contains(key), "checkpoint manifest '", path, "' has no field ", at, ".", key);
      return e.at(key);
    };
    STRATA_CHECK(entry("name") == rank_file(int(r)), "checkpoint manifest '", path, "': ", at, ".name is ",
                 shown(entry("name")), "; expected \"", rank_file(int(r)), "\"");
    STRATA_CHECK(entry("rank").is_number_unsigned() && entry("rank") == r, "checkpoint manifest '", path, "': ", at,
                 ".rank is ", shown(entry("rank")), "; expected ", r);
    STRATA_CHECK(entry("bytes").is_number_unsigned(), "checkpoint manifest '", path, "': ", at, ".bytes is ",
                 shown(entry("bytes")), "; expected a whole number of bytes");
    const json& crc = entry("crc32");
    STRATA_CHECK(crc.is_string() && crc.get<std::string>().size() == 8 &&
                     crc.get<std::string>().find_first_not_of("0123456789abcdef") == std::string::npos,
                 "checkpoint manifest '", path, "': ", at, ".crc32 is ", shown(crc), "; expected 8 hex digits");
  }
}

// The manifest of a step directory, after checking it against COMPLETE.
inline nlohmann::json read_manifest(const std::string& step_dir) {
  const std::string marker = (std::filesystem::path(step_dir) / complete).string();
  const std::string path = (std::filesystem::path(step_dir) / manifest).string();
  std::error_code ec;
  STRATA_CHECK(std::filesystem::exists(marker, ec), "checkpoint '", step_dir, "' is incomplete (no ", complete,
               " marker: the run stopped while saving it)");
  const auto marker_bytes = read_whole_file(marker);
  const std::string expected(marker_bytes.begin(), marker_bytes.end());
  const auto bytes = read_whole_file(path);
  const std::string crc = "crc32 " + hex32(crc32_of(bytes)) + "\n";
  STRATA_CHECK(crc == expected, "checkpoint manifest '", path, "' does not match its ", complete, " marker (",
               crc.substr(0, crc.size() - 1), " against the marker's '", expected.substr(0, expected.find('\n')),
               "'): corrupt");
  nlohmann::json m;
  try {
    m = parse_untrusted_json(bytes.begin(), bytes.end(),
                             "checkpoint manifest '" + path + "'");  // depth, duplicate keys
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint manifest '", path, "' is not valid JSON: ", e.what());
  }
  STRATA_CHECK(m.is_object() && m.value("format", "") == "strata-checkpoint", "checkpoint manifest '", path,
               "' is not a strata checkpoint manifest");
  STRATA_CHECK(m.value("version", 0) == 1, "checkpoint manifest '", path, "' has format version ",
               m.value("version", 0), "; this strata reads version 1");
  check_manifest_values(m, path, step_dir);
  return m;
}

// A rank file's bytes, checked against the manifest's size and CRC-32.
inline std::vector<unsigned char> read_rank_file(const std::string& step_dir, const nlohmann::json& entry) {
  const std::string path = (std::filesystem::path(step_dir) / entry.at("name").get<std::string>()).string();
  const auto bytes = read_whole_file(path);
  const auto size = entry.at("bytes").get<std::uint64_t>();
  STRATA_CHECK(bytes.size() == size, "checkpoint file '", path, "' has ", bytes.size(), " bytes, the manifest says ",
               size, bytes.size() < size ? " (truncated)" : " (grown)");
  const std::string crc = hex32(crc32_of(bytes)), expected = entry.at("crc32").get<std::string>();
  STRATA_CHECK(crc == expected, "checkpoint file '", path, "' has CRC-32 ", crc, ", the manifest says ", expected,
               " (corrupt)");
  return bytes;
}

// Why the checkpoint in `step_dir` cannot be loaded, or "" when every file verifies.
inline std::string problem(const std::string& step_dir) {
  try {
    const auto m = read_manifest(step_dir);
    for (const auto& entry : m.at("files")) read_rank_file(step_dir, entry);
    return {};
  } catch (const error& e) { return e.what(); } catch (const nlohmann::json::exception& e) {
    return "checkpoint manifest in '" + step_dir + "' is malformed: " + e.what();
  }
}

// The newest checkpoint under `dir` that verifies, and why each newer one was passed over. An
// incomplete one (no COMPLETE marker) is what a crash while saving leaves: resume removes it. A
// damaged one (marked COMPLETE, failing to verify) is damage to a finished checkpoint: reported,
// and never removed or silently replaced by a fresh start.
struct scan_result {
  std::optional<int> newest;
  std::vector<std::string> refused;  // every newer one passed over, with why (incomplete ones too)
  std::vector<std::string> damaged;  // those of refused marked COMPLETE
  std::vector<int> incomplete;       // every step directory without a COMPLETE marker, oldest first
};
inline scan_result scan(const std::string& dir) {
  scan_result r;
  const auto all = steps(dir);
  for (const int s : all)
    if (!marked_complete(step_dir(dir, s))) r.incomplete.push_back(s);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string why = problem(step_dir(dir, *it));
    if (why.empty()) {
      r.newest = *it;
      break;
    }
    r.refused.push_back(why);
    if (marked_complete(step_dir(dir, *it))) r.damaged.push_back(why);
  }
  return r;
}

// The run that owns `dir` (its run.json: run id, model, precision, seed), or nullopt when no
// run has saved there yet. A malformed one is an error naming the file.
inline std::optional<nlohmann::json> read_run_file(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / run_file).string();
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return std::nullopt;
  const auto bytes = read_whole_file(path);
  // A run file is a handful of fields: anything nested deeper is not one.
  nlohmann::json r = parse_untrusted_json(bytes.begin(), bytes.end(), "checkpoint run file '" + path + "'");
  const auto bad = [&](const char* field, const char* expected) {
    fail("checkpoint run file '", path, "': ", field, " is missing or not ", expected,
         "; it is not a strata run file (remove it only if no run uses '", dir, "')");
  };
  if (!r.is_object() || r.value("format", nlohmann::json()) != "strata-run") bad("format", "\"strata-run\"");
  if (!r.contains("run") || !r["run"].is_string() || r["run"].get<std::string>().empty() ||
      r["run"].get<std::string>().size() > 64)
    bad("run", "a run id");
  if (!r.contains("model") || !r["model"].is_object()) bad("model", "an object");
  if (!r.contains("precision") || !r["precision"].is_object()) bad("precision", "an object");
  if (r.contains("seed") && !r["seed"].is_number_unsigned()) bad("seed", "a whole number");
  return r;
}

}  // namespace checkpoint_files

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
        return "checkpoint directory '" + opt_.dir + "' belongs to another run (" + describe_run(*other) +
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
    const auto bytes = encode_shard(at, s);
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
      m["precision"] = precision_json<P>();
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
        return continuation<P>(checkpoint_files::step_dir(opt_.dir, *scan.newest));
      }
      if (!scan.damaged.empty())
        return detail::concat("resume: none of the ", scan.damaged.size(), " checkpoints in '", opt_.dir,
                              "' can be loaded (the reasons are printed above)");
      return other_run<P>();
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

  // Rank 0, about to resume from `step_dir`: "" to go on, or why not. Another run's checkpoint
  // (model, precision, seed) is refused first, in load()'s words; then each training setting
  // that differs from the checkpoint's is printed, and those that change the steps refused
  // unless allowed.
  template <class P>
  std::string continuation(const std::string& step_dir) const {
    const json m = checkpoint_files::read_manifest(step_dir);
    check_same_model_and_precision<P>(m, step_dir);
    const auto seed = m.at("data").at("seed").get<std::uint64_t>();
    if (seed_ && seed != *seed_)
      return "the checkpoint in '" + step_dir + "' was trained with seed " + std::to_string(seed) +
             "; this run has seed " + std::to_string(*seed_) + " (the data order would change)";
    if (!m.contains("settings")) {
      if (!opt_.settings.values.empty())
        std::fprintf(stderr, "resume: '%s' records no training settings (an older strata saved it): not compared\n",
                     step_dir.c_str());
      return {};
    }
    const auto changes = compare_settings(m.at("settings"), opt_.settings);
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
    if (shared_steps(m.at("settings"), opt_.settings, step) == 0 &&
        (only_length || steps_to_take(opt_.settings, step) == 0)) {
      std::fprintf(stderr, "resume: no step the saved run had still to take is taken here: the new settings apply\n");
      return {};
    }
    if (opt_.allow_setting_changes) {
      std::fprintf(stderr, "resume: continuing under the changed settings, as allowed\n");
      return {};
    }
    return "resume: the training settings differ from those '" + step_dir + "' was saved with (" + refused +
           "), so the run would not continue as it was trained: resume with its settings, or allow the change "
           "(gpt2_train --resume-with-changes)";
  }

  template <class P>
  static json precision_json() {
    using T = typename P::storage;
    using M = typename P::master;
    return {{"storage", safetensors_dtype<T>()},
            {"master", safetensors_dtype<M>()},
            {"master_copy", P::precision::keeps_master_copy}};
  }

  // Whether this rank saves e's pieces (one copy of each).
  static bool saves(const param_info& e, const checkpoint_place& at) {
    if (e.replica) return false;
    if (!e.shard.sharded() && at.tp_rank != 0) return false;
    return at.zero_stage > 0 || (e.expert ? at.expert_data_rank : at.dp_rank) == 0;
  }
  static bool whole(const tensor_shard& s) { return !s.sharded() && s.real_rows < 0; }
  // Elements of the serial (unsplit, unpadded) tensor.
  static std::int64_t serial_numel(const tensor_shard& s, std::int64_t local_numel) {
    if (whole(s)) return local_numel;
    if (s.real_rows < 0) return s.full.numel();
    return s.real_rows * (s.full.rank >= 2 ? s.full[1] : 1);
  }
  static const param_info& entry_at(const std::vector<param_info>& entries, std::int64_t flat) {
    for (const auto& e : entries)
      if (flat >= e.offset && flat < e.offset + e.numel) return e;
    fail("checkpoint: no parameter at flat offset ", flat);
  }

  template <class U>
  static named_tensor raw(std::string name, const U* p, std::int64_t n) {
    named_tensor t{std::move(name), safetensors_dtype<U>(), {n}, {}};
    t.bytes.resize(static_cast<std::size_t>(n) * sizeof(U));
    std::memcpy(t.bytes.data(), p, t.bytes.size());
    return t;
  }

  // n elements at p, wherever the model's memory space keeps them, as a host vector.
  template <class U>
  static std::vector<U> fetch(const memory_space& space, const U* p, std::int64_t n) {
    std::vector<U> out(static_cast<std::size_t>(n));
    if (n > 0) space.copy(out.data(), p, out.size() * sizeof(U), copy_direction::space_to_host);
    return out;
  }
  template <class U>
  static void put(const memory_space& space, U* p, const std::vector<U>& values) {
    if (!values.empty()) space.copy(p, values.data(), values.size() * sizeof(U), copy_direction::host_to_space);
  }

  template <class P>
  std::vector<unsigned char> encode_shard(const train_progress& at, train_state_ref<P> s) {
    auto& opt = s.optimizer;
    const auto& space = s.params.ledger().space();
    const auto m = opt.first_moments(), v = opt.second_moments(), master = opt.master_weights();
    std::vector<named_tensor> tensors;
    json pieces = json::array();
    for (const auto& seg : opt.segments()) {
      const param_info& e = entry_at(s.params.entries(), seg.flat);
      if (!saves(e, s.place)) continue;
      const std::int64_t begin = seg.flat - e.offset;
      const std::string key = e.name + "@" + std::to_string(begin);
      tensors.push_back(raw("weights/" + key, fetch(space, opt.segment_weights(seg), seg.count).data(), seg.count));
      if (!master.empty())
        tensors.push_back(raw("master/" + key, fetch(space, master.data() + seg.state, seg.count).data(), seg.count));
      tensors.push_back(raw("exp_avg/" + key, fetch(space, m.data() + seg.state, seg.count).data(), seg.count));
      tensors.push_back(raw("exp_avg_sq/" + key, fetch(space, v.data() + seg.state, seg.count).data(), seg.count));
      const auto& sh = e.shard;
      json piece{{"param", e.name},
                 {"begin", begin},
                 {"count", seg.count},
                 {"numel", e.numel},
                 {"full", std::vector<std::int64_t>(sh.full.dims.begin(), sh.full.dims.begin() + sh.full.rank)},
                 {"dim", sh.dim},
                 {"parts", sh.parts},
                 {"index", sh.index},
                 {"blocks", sh.blocks},
                 {"real_rows", sh.real_rows}};
      // Unequal blocks (grouped-query QKV) and blocks held by several ranks, only where present.
      if (sh.block_sizes[0] > 0)
        piece["block_sizes"] = std::vector<std::int64_t>(sh.block_sizes.begin(), sh.block_sizes.begin() + sh.blocks);
      if (sh.has_shared_pieces()) {
        std::vector<int> cut;
        for (int b = 0; b < sh.blocks; ++b) cut.push_back(sh.pieces(b));
        piece["block_parts"] = cut;
      }
      pieces.push_back(std::move(piece));
    }
    return encode_safetensors(tensors, {{"format", "strata-checkpoint-shard"},
                                        {"step", std::to_string(at.step)},
                                        {"rank", std::to_string(world_.rank())},
                                        {"pieces", pieces.dump()}});
  }

  // A field of the model description that differs, for the refusal message.
  static std::string model_difference(const json& saved, const json& here) {
    for (auto it = here.begin(); it != here.end(); ++it) {
      const auto there = saved.find(it.key());
      if (there == saved.end()) return it.key() + " is missing there (" + it.value().dump() + " here)";
      if (*there != it.value()) return it.key() + " " + there->dump() + " there, " + it.value().dump() + " here";
    }
    return "it has fields this run does not (" + saved.dump() + ")";
  }

  struct piece {
    std::string file;
    std::string param;
    tensor_shard shard;
    std::int64_t begin = 0, count = 0, numel = 0;
    const named_tensor *weights = nullptr, *master = nullptr, *m = nullptr, *v = nullptr;
  };

  // A tensor's shape with padding rows taken off: what must agree between layouts.
  static std::vector<std::int64_t> serial_shape(const tensor_shard& s) {
    std::vector<std::int64_t> out(s.full.dims.begin(), s.full.dims.begin() + s.full.rank);
    if (s.real_rows >= 0 && !out.empty()) out[0] = s.real_rows;
    return out;
  }

  // Piece k of the list in rank file `path`, every field checked before it is used - CRCs only
  // say the file is as written, not that its writer was right: its split consistent, its element
  // range inside its shard, and, for a parameter of `model` (this rank's; a pipeline stage's
  // pieces of other stages' parameters are never used), the same serial shape as here.
  static piece read_piece(const json& pj, const std::string& path, std::size_t k,
                          const std::map<std::string, const param_info*>& model) {
    constexpr std::int64_t big = std::int64_t(1) << 62;
    std::string where = "checkpoint file '" + path + "': piece " + std::to_string(k);
    STRATA_CHECK(pj.is_object(), where, " is ", json_shown(pj), ", expected an object");
    for (auto f = pj.begin(); f != pj.end(); ++f) {
      static const char* const known[] = {"param", "begin", "count",  "numel",     "full",        "dim",
                                          "parts", "index", "blocks", "real_rows", "block_sizes", "block_parts"};
      STRATA_CHECK(std::find(std::begin(known), std::end(known), f.key()) != std::end(known), where,
                   " has the unknown field '", f.key(), "'");
    }
    piece p;
    p.file = path;
    p.param = json_string_field(pj, "param", where);
    where += " (parameter '" + p.param + "')";
    auto& sh = p.shard;
    const auto full = json_integer_array_field(pj, "full", 1, big, max_rank, where);
    STRATA_CHECK(!full.empty(), where, ": field 'full' is [], expected a shape of 1 to ", max_rank, " dimensions");
    STRATA_CHECK(checked_numel(full).has_value(), where, ": field 'full' ", json_shown(pj.at("full")),
                 " has more than 2^63 elements");
    for (auto d : full) sh.full.dims[static_cast<std::size_t>(sh.full.rank++)] = d;
    sh.dim = int(json_integer_field(pj, "dim", 0, sh.full.rank - 1, where));
    sh.parts = int(json_integer_field(pj, "parts", 1, 1 << 20, where));
    sh.index = int(json_integer_field(pj, "index", 0, sh.parts - 1, where));
    sh.blocks = int(json_integer_field(pj, "blocks", 1, tensor_shard::max_blocks, where));
    sh.real_rows = json_integer_field(pj, "real_rows", -1, full[0], where);
    STRATA_CHECK(sh.real_rows != 0, where, ": field 'real_rows' is 0, expected -1 (no padding) or 1 to ", full[0]);
    if (pj.contains("block_sizes")) {
      const auto sizes = json_integer_array_field(pj, "block_sizes", 1, big, tensor_shard::max_blocks, where);
      STRATA_CHECK(sizes.size() == std::size_t(sh.blocks), where, ": field 'block_sizes' has ", sizes.size(),
                   " sizes for ", sh.blocks, " blocks");
      std::copy(sizes.begin(), sizes.end(), sh.block_sizes.begin());
    }
    if (pj.contains("block_parts")) {
      const auto cut = json_integer_array_field(pj, "block_parts", 1, sh.parts, tensor_shard::max_blocks, where);
      STRATA_CHECK(cut.size() == std::size_t(sh.blocks), where, ": field 'block_parts' has ", cut.size(),
                   " piece counts for ", sh.blocks, " blocks");
      for (std::size_t b = 0; b < cut.size(); ++b) sh.block_parts[b] = int(cut[b]);
    }
    STRATA_CHECK(sh.consistent(), where, ": its split (", sh.parts, " parts of ", sh.blocks, " blocks along dimension ",
                 sh.dim, " of ", sh.full.str(), ") does not fit its shape");
    // Elements are placed by (row, column): a split or padded piece has rank 1 or 2.
    STRATA_CHECK(whole(sh) || sh.full.rank <= 2, where, ": a split or padded tensor of shape ", sh.full.str(),
                 " (rank 1 or 2 expected)");
    if (const auto found = model.find(p.param); found != model.end()) {
      const auto ours = serial_shape(found->second->shard), theirs = serial_shape(sh);
      STRATA_CHECK(theirs == ours, where, " has shape ", shape_text(theirs), " (fields 'full' ", sh.full.str(),
                   " and 'real_rows' ", sh.real_rows, "), this model ", shape_text(ours));
    }
    const std::int64_t local = sh.local().numel();  // <= the full tensor's count: no overflow
    p.numel = json_integer_field(pj, "numel", local, local, where);
    p.begin = json_integer_field(pj, "begin", 0, p.numel, where);
    p.count = json_integer_field(pj, "count", 0, p.numel - p.begin, where);
    return p;
  }
  static std::string shape_text(const std::vector<std::int64_t>& d) {
    std::string out = "[";
    for (std::size_t i = 0; i < d.size(); ++i) out += (i ? ", " : "") + std::to_string(d[i]);
    return out + "]";
  }

  template <class P>
  loaded_checkpoint load_unchecked(const std::string& step_dir, train_state_ref<P> s) {
    const json manifest = checkpoint_files::read_manifest(step_dir);
    check_same_model_and_precision<P>(manifest, step_dir);
    const saved_pieces saved = read_pieces<P>(manifest, step_dir, s.params);
    for (const auto& e : s.params.entries()) {
      const auto found = saved.by_param.find(e.name);
      STRATA_CHECK(found != saved.by_param.end(), "checkpoint '", step_dir, "' holds no parameter '", e.name, "'");
      install_rank_part(e, assemble_serial(e, found->second, step_dir), s);
    }
    loaded_checkpoint out = saved_progress(manifest, step_dir);
    s.optimizer.restore_steps_taken(out.progress.optimizer_steps);
    return out;
  }

  // A checkpoint of another model, or saved in another precision, is refused, naming the difference.
  template <class P>
  void check_same_model_and_precision(const json& manifest, const std::string& step_dir) const {
    STRATA_CHECK(manifest.at("model") == model_, "checkpoint '", step_dir,
                 "' is of another model: ", model_difference(manifest.at("model"), model_));
    const json precision = precision_json<P>();
    STRATA_CHECK(manifest.at("precision") == precision, "checkpoint '", step_dir, "' was saved in precision ",
                 manifest.at("precision").dump(), "; this run uses ", precision.dump());
  }

  // Every rank file's tensors and its pieces by parameter; the pieces point into the tensors.
  struct saved_pieces {
    std::vector<std::vector<named_tensor>> files;
    std::map<std::string, std::vector<piece>> by_param;
  };

  // Every rank file the manifest lists, checked, and its pieces by parameter.
  template <class P>
  static saved_pieces read_pieces(const json& manifest, const std::string& step_dir,
                                  const parameter_store<typename P::storage>& params) {
    saved_pieces saved;
    saved.files.reserve(manifest.at("files").size());
    std::map<std::string, const param_info*> model_params;
    for (const auto& e : params.entries()) model_params[e.name] = &e;
    for (const auto& entry : manifest.at("files")) read_rank_file_pieces<P>(entry, step_dir, model_params, saved);
    return saved;
  }

  // One rank file of the manifest: its tensors, and each piece of its list with the tensors of
  // each kind it names.
  template <class P>
  static void read_rank_file_pieces(const json& entry, const std::string& step_dir,
                                    const std::map<std::string, const param_info*>& model_params, saved_pieces& saved) {
    const std::string file_name =
        json_string_field(entry, "name", "checkpoint '" + step_dir + "': a manifest file entry");
    // A name, not a path: the manifest must not send the reader outside the step directory.
    STRATA_CHECK(
        !file_name.empty() && file_name != "." && file_name != ".." && file_name.find('/') == std::string::npos,
        "checkpoint '", step_dir, "': the manifest names the rank file '", file_name,
        "', which is not a plain file name");
    const std::string path = (std::filesystem::path(step_dir) / file_name).string();
    std::map<std::string, std::string> meta;
    saved.files.push_back(decode_safetensors(checkpoint_files::read_rank_file(step_dir, entry), path, &meta));
    std::map<std::string, const named_tensor*> named;
    for (const auto& t : saved.files.back()) named[t.name] = &t;
    STRATA_CHECK(meta.count("pieces"), "checkpoint file '", path, "' has no piece list in its metadata");
    const json list = parse_untrusted_json(meta["pieces"], "checkpoint file '" + path + "': the piece list");
    STRATA_CHECK(list.is_array(), "checkpoint file '", path, "': the piece list is ", json_shown(list),
                 ", expected an array");
    for (std::size_t k = 0; k < list.size(); ++k) {
      piece p = read_piece(list[k], path, k, model_params);
      const std::string key = p.param + "@" + std::to_string(p.begin);
      const auto find = [&](const std::string& kind, bool required) -> const named_tensor* {
        const auto it = named.find(kind + "/" + key);
        STRATA_CHECK(!required || it != named.end(), "checkpoint file '", path, "' lacks tensor '", kind, "/", key,
                     "'");
        if (it == named.end()) return nullptr;
        STRATA_CHECK(it->second->numel() == p.count, "checkpoint file '", path, "': tensor '", kind, "/", key, "' has ",
                     it->second->numel(), " elements, its piece ", p.count);
        return it->second;
      };
      p.weights = find("weights", true);
      p.master = find("master", P::precision::keeps_master_copy);
      p.m = find("exp_avg", true);
      p.v = find("exp_avg_sq", true);
      saved.by_param[p.param].push_back(p);
    }
  }

  // One parameter's whole (serial) tensor of each kind.
  struct serial_tensors {
    std::vector<double> weights, master, m1, m2;
  };

  // Parameter e's serial tensors, from every piece of it; every element must be covered.
  static serial_tensors assemble_serial(const param_info& e, const std::vector<piece>& pieces,
                                        const std::string& step_dir) {
    const std::int64_t n = serial_numel(e.shard, e.numel);
    const auto count = static_cast<std::size_t>(n);
    serial_tensors t{std::vector<double>(count), std::vector<double>(count), std::vector<double>(count),
                     std::vector<double>(count)};
    std::vector<char> covered(count, 0);
    for (const auto& p : pieces) {
      const std::int64_t theirs = serial_numel(p.shard, p.numel);
      STRATA_CHECK(theirs == n, "checkpoint file '", p.file, "': parameter '", e.name, "' has ", theirs,
                   " elements there, ", n, " in this model");
      const auto pw = p.weights->values(), pm1 = p.m->values(), pm2 = p.v->values();
      const auto pmw = p.master ? p.master->values() : std::vector<double>();
      for (std::int64_t k = 0; k < p.count; ++k) {
        const std::int64_t i = p.begin + k;
        if (!whole(p.shard) && p.shard.is_padding(i)) continue;
        const auto g = std::size_t(whole(p.shard) ? i : p.shard.global_index(i));
        // read_piece made this impossible; kept so that no piece list can ever write past the tensors.
        STRATA_CHECK(g < count, "checkpoint file '", p.file, "': element ", i, " of parameter '", e.name, "' lands at ",
                     g, ", past its ", count, " elements");
        const auto at = std::size_t(k);
        t.weights[g] = pw[at];
        if (p.master) t.master[g] = pmw[at];
        t.m1[g] = pm1[at];
        t.m2[g] = pm2[at];
        covered[g] = 1;
      }
    }
    const auto gap = std::find(covered.begin(), covered.end(), 0);
    STRATA_CHECK(gap == covered.end(), "checkpoint '", step_dir, "': no file holds element ", gap - covered.begin(),
                 " of parameter '", e.name, "'");
    return t;
  }

  // This rank's part of parameter e: its flat weights (absent under ZeRO-3), then the optimizer's
  // segments. Built on the host, then copied to wherever the state lives.
  template <class P>
  static void install_rank_part(const param_info& e, const serial_tensors& t, train_state_ref<P> s) {
    using T = typename P::storage;
    using M = typename P::master;
    auto& params = s.params;
    auto& opt = s.optimizer;
    const auto& space = params.ledger().space();
    const auto m = opt.first_moments(), v = opt.second_moments(), master = opt.master_weights();
    const auto serial_of = [&](std::int64_t i) -> std::int64_t {
      if (whole(e.shard)) return i;
      return e.shard.is_padding(i) ? -1 : e.shard.global_index(i);
    };
    if (!params.weights_released()) {
      std::vector<T> mine(static_cast<std::size_t>(e.numel));
      for (std::int64_t i = 0; i < e.numel; ++i) {
        const auto g = serial_of(i);
        mine[std::size_t(i)] = convert<T>(g < 0 ? 0.0 : t.weights[std::size_t(g)]);
      }
      put(space, params.weights_data() + e.offset, mine);
    }
    for (const auto& seg : opt.segments()) {
      if (seg.flat < e.offset || seg.flat >= e.offset + e.numel) continue;
      const auto n = std::size_t(seg.count);
      std::vector<T> sw(n);
      std::vector<M> smw(master.empty() ? 0 : n), sm1(n), sm2(n);
      for (std::size_t k = 0; k < n; ++k) {
        const auto g = serial_of(seg.flat - e.offset + std::int64_t(k));
        const auto value = [&](const std::vector<double>& x) { return g < 0 ? 0.0 : x[std::size_t(g)]; };
        sw[k] = convert<T>(value(t.weights));
        if (!master.empty()) smw[k] = convert<M>(value(t.master));
        sm1[k] = convert<M>(value(t.m1));
        sm2[k] = convert<M>(value(t.m2));
      }
      put(space, opt.segment_weights(seg), sw);
      if (!master.empty()) put(space, master.data() + seg.state, smw);
      put(space, m.data() + seg.state, sm1);
      put(space, v.data() + seg.state, sm2);
    }
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
           {"precision", precision_json<P>()}};
    if (seed_) r["seed"] = *seed_;
    return r;
  }
  static std::string describe_run(const json& r) {
    std::string s = "run " + r.at("run").get<std::string>();
    if (r.contains("seed")) s += ", seed " + std::to_string(r.at("seed").get<std::uint64_t>());
    const std::string model = r.at("model").dump();
    return s + ", model " + (model.size() > 120 ? model.substr(0, 117) + "..." : model);
  }

  // Rank 0, resuming with no complete checkpoint: why the directory's run.json is another run's
  // (another model, precision or seed), or "" when it is this run's or there is none. The layout
  // is not part of a run's identity: a resume may change it.
  template <class P>
  std::string other_run() const {
    if (!dir_run_) return {};
    const json& r = *dir_run_;
    const std::string head = "checkpoint directory '" + opt_.dir + "' belongs to another run (" +
                             checkpoint_files::run_file + ": run " + r.at("run").get<std::string>() + "): ";
    if (r.at("model") != model_) return head + "it is of another model: " + model_difference(r.at("model"), model_);
    if (r.at("precision") != precision_json<P>())
      return head + "it was saved in precision " + r.at("precision").dump() + "; this run uses " +
             precision_json<P>().dump();
    if (seed_ && r.contains("seed") && r.at("seed").get<std::uint64_t>() != *seed_)
      return head + "it was trained with seed " + std::to_string(r.at("seed").get<std::uint64_t>()) +
             "; this run has seed " + std::to_string(*seed_) + " (the data order would change)";
    return {};
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
    return "checkpoint directory '" + opt_.dir + "' belongs to another run (" + describe_run(*owner) +
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
