// strata/train/checkpoint_format.hpp - a checkpoint directory's files: their names and their readers.
//
// A checkpoint is one directory per step:
//   DIR/step-00000600/rank-00000.safetensors ... rank-NNNNN.safetensors   one per world rank
//                     manifest.json    step, layout, model, precision, optimizer and data
//                                      state, and each rank file's size and CRC-32
//                     COMPLETE         written last; holds the manifest's CRC-32
//   DIR/run.json                       the run that owns DIR: its id, model, precision and seed
// Every file is written durably (train/durable_file.hpp), and the manifest and then COMPLETE only
// after every rank file is on disk. So a step directory either verifies - COMPLETE matches the
// manifest, each rank file its size and CRC-32 - or lacks COMPLETE (a crash while saving), and
// the readers here tell those apart from damage to a finished checkpoint.
//
// The files may be damaged, hand-edited or written by someone else, so every reader treats them
// as untrusted: each manifest value is checked before anything uses it, and a failure is one
// error naming the file and the field. Nothing here needs communication or a model, so a tool
// can verify a directory on its own.
#pragma once
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/core/error.hpp"
#include "strata/train/durable_file.hpp"
#include "strata/train/untrusted_json.hpp"

namespace strata {

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

namespace detail {

// check_manifest_values' checks of one manifest m, read from `path`: each failure names the file
// and the field.
struct manifest_checker {
  using json = nlohmann::json;
  const json& m;
  const std::string& path;

  static std::string shown(const json& v) {
    std::string s = v.dump();
    return s.size() > 60 ? s.substr(0, 57) + "..." : s;
  }
  // The field at `keys` ("loss_scaler", "scale"), which must be there.
  const json& field(std::initializer_list<const char*> keys, std::string& name) const {
    const json* v = &m;
    name.clear();
    for (const char* k : keys) {
      if (!name.empty()) name += '.';  // appended piece by piece: GCC 12 misreads "." + string (-Wrestrict)
      name += k;
      STRATA_CHECK(v->is_object() && v->contains(k), "checkpoint manifest '", path, "' has no field ", name);
      v = &(*v)[k];
    }
    return *v;
  }
  // An integer field in [lo, hi]: not 2.5, not "2", not a value that would wrap.
  long long integer(std::initializer_list<const char*> keys, long long lo, long long hi) const {
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
  }
  void unsigned64(std::initializer_list<const char*> keys) const {
    std::string name;
    const json& v = field(keys, name);
    STRATA_CHECK(v.is_number_unsigned(), "checkpoint manifest '", path, "': ", name, " is ", shown(v),
                 "; expected a whole number from 0 to 2^64 - 1");
  }
  void object(std::initializer_list<const char*> keys) const {
    std::string name;
    const json& v = field(keys, name);
    STRATA_CHECK(v.is_object(), "checkpoint manifest '", path, "': ", name, " is ", shown(v), "; expected an object");
  }
  void loss_scale() const {
    std::string name;
    const json& scale = field({"loss_scaler", "scale"}, name);
    STRATA_CHECK(scale.is_number() && std::isfinite(scale.get<double>()) && scale.get<double>() > 0,
                 "checkpoint manifest '", path, "': ", name, " is ", shown(scale),
                 "; expected a positive finite number (every gradient is divided by it)");
  }
  void run_id() const {
    std::string name;
    const json& run = field({"run"}, name);
    STRATA_CHECK(run.is_string() && !run.get<std::string>().empty() && run.get<std::string>().size() <= 64,
                 "checkpoint manifest '", path, "': run is ", shown(run), "; expected a run id");
  }
  // The training settings: names to numbers, strings or booleans, shown in messages as they are.
  void settings() const {
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
  void files() const {
    std::string name;
    const json& files = field({"files"}, name);
    STRATA_CHECK(files.is_array() && !files.empty() && files.size() <= (1u << 20), "checkpoint manifest '", path,
                 "': files is ", shown(files), "; expected one entry per rank");
    for (std::size_t r = 0; r < files.size(); ++r) file_entry(files[r], r);
  }
  void file_entry(const json& e, std::size_t r) const {
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
};

}  // namespace detail

// Every manifest value strata uses, checked before use: a manifest edited and re-checksummed,
// or written by a buggy or foreign writer, is refused naming the file and the field, never
// narrowed (a step of 2^32 + 2 would read as 2) nor trusted (a loss scale of 0 divides by zero).
inline void check_manifest_values(const nlohmann::json& m, const std::string& path, const std::string& step_dir) {
  const detail::manifest_checker check{m, path};
  const long long step = check.integer({"step"}, 0, INT_MAX);
  const auto dir_step = step_of_name(std::filesystem::path(step_dir).filename().string());
  STRATA_CHECK(!dir_step || step == *dir_step, "checkpoint manifest '", path, "': step is ", step,
               ", but its directory is that of step ", dir_step.value_or(-1));
  check.object({"layout"});
  check.object({"model"});
  check.object({"precision"});
  check.integer({"optimizer", "steps"}, 0, step);  // AdamW counts applied steps only
  check.loss_scale();
  check.integer({"loss_scaler", "clean_steps"}, 0, INT_MAX);
  check.integer({"loss_scaler", "skipped"}, 0, step);
  check.unsigned64({"data", "seed"});
  check.unsigned64({"data", "position"});
  if (m.contains("run")) check.run_id();
  if (m.contains("settings")) check.settings();
  check.files();
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

}  // namespace strata
