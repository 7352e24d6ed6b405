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
// does not split the optimizer, nothing a pipeline stage holds as a replica of another's.
//
// Loading rebuilds each of this rank's parameters whole from every piece that holds part of it
// (whatever layout wrote them) and keeps its own part: model state exactly (values travel in
// their own dtype), optimizer state re-sharded to the segments this rank now owns. Each rank
// reads every rank file, so loading costs the whole checkpoint's bytes per rank; all ranks must
// see DIR (a shared filesystem).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/comm/group_ref.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/layers/parameters.hpp"
#include "strata/optim/adamw.hpp"
#include "strata/optim/loss_scaler.hpp"
#include "strata/train/durable_file.hpp"
#include "strata/train/fault.hpp"
#include "strata/train/safetensors.hpp"

namespace strata {

// Where a rank sits, to decide which of several identical copies it saves.
struct checkpoint_place {
  int dp_rank = 0, tp_rank = 0, zero_stage = 0;
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

// The steps with a directory under `dir`, complete or not, oldest first.
inline std::vector<int> steps(const std::string& dir) {
  std::vector<int> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    int step = -1;
    char tail = 0;
    if (entry.is_directory() && std::sscanf(name.c_str(), "step-%d%c", &step, &tail) == 1 && step >= 0 &&
        name == std::filesystem::path(step_dir("", step)).filename().string())
      out.push_back(step);
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
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
               crc.substr(0, crc.size() - 1), " against the marker's '",
               expected.substr(0, expected.find('\n')), "'): corrupt");
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint manifest '", path, "' is not valid JSON: ", e.what());
  }
  STRATA_CHECK(m.is_object() && m.value("format", "") == "strata-checkpoint", "checkpoint manifest '", path,
               "' is not a strata checkpoint manifest");
  STRATA_CHECK(m.value("version", 0) == 1, "checkpoint manifest '", path, "' has format version ",
               m.value("version", 0), "; this strata reads version 1");
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
  } catch (const error& e) {
    return e.what();
  } catch (const nlohmann::json::exception& e) {
    return "checkpoint manifest in '" + step_dir + "' is malformed: " + e.what();
  }
}

// The newest checkpoint under `dir` that verifies, and why each newer one was passed over.
struct scan_result {
  std::optional<int> newest;
  std::vector<std::string> refused;
};
inline scan_result scan(const std::string& dir) {
  scan_result r;
  const auto all = steps(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string why = problem(step_dir(dir, *it));
    if (why.empty()) {
      r.newest = *it;
      break;
    }
    r.refused.push_back(why);
  }
  return r;
}

}  // namespace checkpoint_files

// Saves and restores one run's checkpoints. Every call is collective over `world`.
class checkpointer {
 public:
  // `layout` and `model` describe the run (as JSON objects): the layout is recorded, the model
  // must match on load (a checkpoint of another model is refused, naming the field).
  checkpointer(checkpoint_options o, group_ref world, nlohmann::json layout, nlohmann::json model)
      : opt_(std::move(o)), world_(std::move(world)), layout_(std::move(layout)), model_(std::move(model)),
        fault_(fault_injection::from_env()) {
    STRATA_CHECK(!opt_.dir.empty(), "checkpoint: no directory given");
    STRATA_CHECK(opt_.keep >= 0, "checkpoint: keep (", opt_.keep, ") must be >= 0");
    // At start-up, not hours later at the first save: the directory must be writable.
    on_rank0_or_fail("cannot write checkpoints under '" + opt_.dir + "'", [&] {
      std::filesystem::create_directories(opt_.dir);
      const std::string probe = (std::filesystem::path(opt_.dir) / ".strata-write-test").string();
      write_file_durably(probe, std::string("ok\n"));
      std::filesystem::remove(probe);
    });
  }

  const std::string& dir() const { return opt_.dir; }

  // Writes the checkpoint of step `at.step`; returns its directory once it is complete.
  template <class P>
  std::string save(const train_progress& at, train_state_ref<P> s) {
    const std::string step_dir = checkpoint_files::step_dir(opt_.dir, at.step);
    const int rank = world_.rank(), ranks = world_.size();
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
    try {
      write_file_durably(path, bytes);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "checkpoint: rank %d: %s\n", rank, e.what());
      mine[0] = 0;
    }
    std::vector<double> all(3 * static_cast<std::size_t>(ranks));
    world_.all_gather(std::span<const double>(mine, 3), std::span<double>(all));
    for (int r = 0; r < ranks; ++r)
      STRATA_CHECK(all[3 * std::size_t(r)] == 1.0, "checkpoint: rank ", r, " could not write its file in '", step_dir, "'");

    // Every file is on disk: the manifest, then the marker that makes the checkpoint count.
    on_rank0_or_fail("cannot complete checkpoint '" + step_dir + "'", [&] {
      nlohmann::ordered_json m;
      m["format"] = "strata-checkpoint";
      m["version"] = 1;
      m["step"] = at.step;
      m["layout"] = layout_;
      m["model"] = model_;
      m["precision"] = precision_json<P>();
      m["optimizer"] = {{"steps", at.optimizer_steps}};
      m["loss_scaler"] = {{"scale", at.scaler.scale}, {"clean_steps", at.scaler.clean_steps}, {"skipped", at.scaler.skipped}};
      m["data"] = {{"seed", at.seed}, {"position", at.data_position}};
      m["files"] = nlohmann::json::array();
      for (int r = 0; r < ranks; ++r)
        m["files"].push_back({{"name", checkpoint_files::rank_file(r)},
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
  // newer ones that do not. None there: nullopt, a fresh start. Some there but none verifies:
  // an error listing why each was refused (starting over would silently throw the run away).
  template <class P>
  std::optional<loaded_checkpoint> resume(train_state_ref<P> s) {
    double chosen = -1, refused = 0;
    if (world_.rank() == 0) {
      const auto scan = checkpoint_files::scan(opt_.dir);
      for (const auto& why : scan.refused) std::fprintf(stderr, "resume: skipping %s\n", why.c_str());
      chosen = scan.newest ? *scan.newest : -1;
      refused = double(scan.refused.size());
    }
    double both[2] = {chosen, refused};
    world_.broadcast(std::span<double>(both, 2), 0);
    if (both[0] < 0) {
      STRATA_CHECK(both[1] == 0, "resume: none of the ", both[1], " checkpoints in '", opt_.dir,
                   "' can be loaded (the reasons are printed above)");
      return std::nullopt;
    }
    return load(checkpoint_files::step_dir(opt_.dir, static_cast<int>(both[0])), s);
  }

  // Loads the checkpoint in `step_dir` into this rank's state, whatever layout saved it.
  template <class P>
  loaded_checkpoint load(const std::string& step_dir, train_state_ref<P> s) {
    try {
      return load_unchecked(step_dir, s);
    } catch (const nlohmann::json::exception& e) {
      fail("checkpoint '", step_dir, "' is malformed: ", e.what());
    }
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

  template <class P>
  static json precision_json() {
    using T = typename P::storage;
    using M = typename P::master;
    return {{"storage", safetensors_dtype<T>()}, {"master", safetensors_dtype<M>()},
            {"master_copy", P::precision::keeps_master_copy}};
  }

  // Whether this rank saves e's pieces (one copy of each).
  static bool saves(const param_info& e, const checkpoint_place& at) {
    if (e.replica) return false;
    if (!e.shard.sharded() && at.tp_rank != 0) return false;
    return at.zero_stage > 0 || at.dp_rank == 0;
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
      json piece{{"param", e.name}, {"begin", begin}, {"count", seg.count}, {"numel", e.numel},
                 {"full", std::vector<std::int64_t>(sh.full.dims.begin(), sh.full.dims.begin() + sh.full.rank)},
                 {"dim", sh.dim}, {"parts", sh.parts}, {"index", sh.index}, {"blocks", sh.blocks},
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
    tensor_shard shard;
    std::int64_t begin = 0, count = 0, numel = 0;
    const named_tensor *weights = nullptr, *master = nullptr, *m = nullptr, *v = nullptr;
  };

  template <class P>
  loaded_checkpoint load_unchecked(const std::string& step_dir, train_state_ref<P> s) {
    using T = typename P::storage;
    using M = typename P::master;
    const json manifest = checkpoint_files::read_manifest(step_dir);
    STRATA_CHECK(manifest.at("model") == model_, "checkpoint '", step_dir, "' is of another model: ",
                 model_difference(manifest.at("model"), model_));
    const json precision = precision_json<P>();
    STRATA_CHECK(manifest.at("precision") == precision, "checkpoint '", step_dir, "' was saved in precision ",
                 manifest.at("precision").dump(), "; this run uses ", precision.dump());

    // Every rank file, checked, and its pieces by parameter.
    std::vector<std::vector<named_tensor>> files;
    files.reserve(manifest.at("files").size());
    std::map<std::string, std::vector<piece>> by_param;
    for (const auto& entry : manifest.at("files")) {
      const std::string path = (std::filesystem::path(step_dir) / entry.at("name").get<std::string>()).string();
      std::map<std::string, std::string> meta;
      files.push_back(decode_safetensors(checkpoint_files::read_rank_file(step_dir, entry), path, &meta));
      std::map<std::string, const named_tensor*> named;
      for (const auto& t : files.back()) named[t.name] = &t;
      STRATA_CHECK(meta.count("pieces"), "checkpoint file '", path, "' has no piece list in its metadata");
      for (const auto& pj : json::parse(meta["pieces"])) {
        piece p;
        p.file = path;
        p.begin = pj.at("begin").get<std::int64_t>();
        p.count = pj.at("count").get<std::int64_t>();
        p.numel = pj.at("numel").get<std::int64_t>();
        const auto full = pj.at("full").get<std::vector<std::int64_t>>();
        STRATA_CHECK(full.size() <= p.shard.full.dims.size(), "checkpoint file '", path, "': a shape of rank ",
                     full.size());
        for (auto d : full) p.shard.full.dims[static_cast<std::size_t>(p.shard.full.rank++)] = d;
        p.shard.dim = pj.at("dim").get<int>();
        p.shard.parts = pj.at("parts").get<int>();
        p.shard.index = pj.at("index").get<int>();
        p.shard.blocks = pj.at("blocks").get<int>();
        p.shard.real_rows = pj.at("real_rows").get<std::int64_t>();
        STRATA_CHECK(p.shard.blocks >= 1 && p.shard.blocks <= tensor_shard::max_blocks, "checkpoint file '", path,
                     "': a piece of ", p.shard.blocks, " blocks (at most ", tensor_shard::max_blocks, ")");
        if (pj.contains("block_sizes")) {
          const auto sizes = pj.at("block_sizes").get<std::vector<std::int64_t>>();
          STRATA_CHECK(sizes.size() == std::size_t(p.shard.blocks), "checkpoint file '", path, "': ", sizes.size(),
                       " block sizes for ", p.shard.blocks, " blocks");
          std::copy(sizes.begin(), sizes.end(), p.shard.block_sizes.begin());
        }
        if (pj.contains("block_parts")) {
          const auto cut = pj.at("block_parts").get<std::vector<int>>();
          STRATA_CHECK(cut.size() == std::size_t(p.shard.blocks), "checkpoint file '", path, "': ", cut.size(),
                       " block piece counts for ", p.shard.blocks, " blocks");
          std::copy(cut.begin(), cut.end(), p.shard.block_parts.begin());
        }
        STRATA_CHECK(p.shard.consistent(), "checkpoint file '", path, "': the split of parameter '",
                     pj.at("param").get<std::string>(), "' (", p.shard.parts, " parts of ", p.shard.blocks,
                     " blocks along dimension ", p.shard.dim, " of ", p.shard.full.str(), ") does not fit its shape");
        const std::string name = pj.at("param").get<std::string>();
        const std::string key = name + "@" + std::to_string(p.begin);
        const auto find = [&](const std::string& kind, bool required) -> const named_tensor* {
          const auto it = named.find(kind + "/" + key);
          STRATA_CHECK(!required || it != named.end(), "checkpoint file '", path, "' lacks tensor '", kind, "/", key, "'");
          if (it == named.end()) return nullptr;
          STRATA_CHECK(it->second->numel() == p.count, "checkpoint file '", path, "': tensor '", kind, "/", key, "' has ",
                       it->second->numel(), " elements, its piece ", p.count);
          return it->second;
        };
        p.weights = find("weights", true);
        p.master = find("master", P::precision::keeps_master_copy);
        p.m = find("exp_avg", true);
        p.v = find("exp_avg_sq", true);
        STRATA_CHECK(p.begin >= 0 && p.count >= 0 && p.begin + p.count <= p.numel, "checkpoint file '", path,
                     "': piece ", key, " of ", p.count, " elements runs past its shard's ", p.numel);
        by_param[name].push_back(p);
      }
    }

    auto& params = s.params;
    auto& opt = s.optimizer;
    const auto& space = params.ledger().space();
    const auto m = opt.first_moments(), v = opt.second_moments(), master = opt.master_weights();
    for (const auto& e : params.entries()) {
      const auto found = by_param.find(e.name);
      STRATA_CHECK(found != by_param.end(), "checkpoint '", step_dir, "' holds no parameter '", e.name, "'");
      // The whole (serial) tensor of each kind, from every piece of it.
      const std::int64_t n = serial_numel(e.shard, e.numel);
      const auto count = static_cast<std::size_t>(n);
      std::vector<double> w(count), mw(count), m1(count), m2(count);
      std::vector<char> covered(count, 0);
      for (const auto& p : found->second) {
        const std::int64_t theirs = serial_numel(p.shard, p.numel);
        STRATA_CHECK(theirs == n, "checkpoint file '", p.file, "': parameter '", e.name, "' has ", theirs,
                     " elements there, ", n, " in this model");
        const auto pw = p.weights->values(), pm1 = p.m->values(), pm2 = p.v->values();
        const auto pmw = p.master ? p.master->values() : std::vector<double>();
        for (std::int64_t k = 0; k < p.count; ++k) {
          const std::int64_t i = p.begin + k;
          if (!whole(p.shard) && p.shard.is_padding(i)) continue;
          const auto g = std::size_t(whole(p.shard) ? i : p.shard.global_index(i));
          const auto at = std::size_t(k);
          w[g] = pw[at];
          if (p.master) mw[g] = pmw[at];
          m1[g] = pm1[at];
          m2[g] = pm2[at];
          covered[g] = 1;
        }
      }
      const auto gap = std::find(covered.begin(), covered.end(), 0);
      STRATA_CHECK(gap == covered.end(), "checkpoint '", step_dir, "': no file holds element ", gap - covered.begin(),
                   " of parameter '", e.name, "'");
      // This rank's part: the flat weights (absent under ZeRO-3), then the optimizer's segments.
      const auto serial_of = [&](std::int64_t i) -> std::int64_t {
        if (whole(e.shard)) return i;
        return e.shard.is_padding(i) ? -1 : e.shard.global_index(i);
      };
      // Built on the host, then copied to wherever the state lives.
      if (!params.weights_released()) {
        std::vector<T> mine(static_cast<std::size_t>(e.numel));
        for (std::int64_t i = 0; i < e.numel; ++i) {
          const auto g = serial_of(i);
          mine[std::size_t(i)] = convert<T>(g < 0 ? 0.0 : w[std::size_t(g)]);
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
          sw[k] = convert<T>(value(w));
          if (!master.empty()) smw[k] = convert<M>(value(mw));
          sm1[k] = convert<M>(value(m1));
          sm2[k] = convert<M>(value(m2));
        }
        put(space, opt.segment_weights(seg), sw);
        if (!master.empty()) put(space, master.data() + seg.state, smw);
        put(space, m.data() + seg.state, sm1);
        put(space, v.data() + seg.state, sm2);
      }
    }

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
    opt.restore_steps_taken(pr.optimizer_steps);
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

  checkpoint_options opt_;
  group_ref world_;
  json layout_, model_;
  fault_injection fault_;
};

}  // namespace strata
