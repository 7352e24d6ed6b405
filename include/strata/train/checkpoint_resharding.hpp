// strata/train/checkpoint_resharding.hpp - a rank's share of a checkpoint, saved as pieces and loaded under any layout.
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
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/core/checked_math.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/core/tensor.hpp"
#include "strata/layers/parameters.hpp"
#include "strata/optim/adamw.hpp"
#include "strata/train/checkpoint_format.hpp"
#include "strata/train/safetensors.hpp"
#include "strata/train/untrusted_json.hpp"

namespace strata {

// Where a rank sits, to decide which of several identical copies it saves.
struct checkpoint_place {
  int dp_rank = 0, tp_rank = 0, zero_stage = 0;
  int expert_data_rank = 0;  // among the ranks holding the same experts (expert parallelism)
};

// One rank's training state, by reference.
template <class P>
struct train_state_ref {
  parameter_store<typename P::storage>& params;
  adamw<P>& optimizer;
  checkpoint_place place{};
};

// Writing this rank's pieces and rebuilding its state from pieces of any layout, for checkpointer.
namespace detail::resharding {

using json = nlohmann::json;

// Whether this rank saves e's pieces (one copy of each).
inline bool saves(const param_info& e, const checkpoint_place& at) {
  if (e.replica) return false;
  if (!e.shard.sharded() && at.tp_rank != 0) return false;
  return at.zero_stage > 0 || (e.expert ? at.expert_data_rank : at.dp_rank) == 0;
}
inline bool whole(const tensor_shard& s) { return !s.sharded() && s.real_rows < 0; }
// Elements of the serial (unsplit, unpadded) tensor.
inline std::int64_t serial_numel(const tensor_shard& s, std::int64_t local_numel) {
  if (whole(s)) return local_numel;
  if (s.real_rows < 0) return s.full.numel();
  return s.real_rows * (s.full.rank >= 2 ? s.full[1] : 1);
}
inline const param_info& entry_at(const std::vector<param_info>& entries, std::int64_t flat) {
  for (const auto& e : entries)
    if (flat >= e.offset && flat < e.offset + e.numel) return e;
  fail("checkpoint: no parameter at flat offset ", flat);
}

template <class U>
named_tensor raw(std::string name, const U* p, std::int64_t n) {
  named_tensor t{std::move(name), safetensors_dtype<U>(), {n}, {}};
  t.bytes.resize(static_cast<std::size_t>(n) * sizeof(U));
  std::memcpy(t.bytes.data(), p, t.bytes.size());
  return t;
}

// n elements at p, wherever the model's memory space keeps them, as a host vector.
template <class U>
std::vector<U> fetch(const memory_space& space, const U* p, std::int64_t n) {
  std::vector<U> out(static_cast<std::size_t>(n));
  if (n > 0) space.copy(out.data(), p, out.size() * sizeof(U), copy_direction::space_to_host);
  return out;
}
template <class U>
void put(const memory_space& space, U* p, const std::vector<U>& values) {
  if (!values.empty()) space.copy(p, values.data(), values.size() * sizeof(U), copy_direction::host_to_space);
}

// This rank's rank file for the checkpoint of `step`: the pieces it saves (saves()), each with
// its tensors and its entry in the metadata's piece list.
template <class P>
std::vector<unsigned char> encode_shard(train_state_ref<P> s, int step, int rank) {
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
                                      {"step", std::to_string(step)},
                                      {"rank", std::to_string(rank)},
                                      {"pieces", pieces.dump()}});
}

struct piece {
  std::string file;
  std::string param;
  tensor_shard shard;
  std::int64_t begin = 0, count = 0, numel = 0;
  const named_tensor *weights = nullptr, *master = nullptr, *m = nullptr, *v = nullptr;
};

// A tensor's shape with padding rows taken off: what must agree between layouts.
inline std::vector<std::int64_t> serial_shape(const tensor_shard& s) {
  std::vector<std::int64_t> out(s.full.dims.begin(), s.full.dims.begin() + s.full.rank);
  if (s.real_rows >= 0 && !out.empty()) out[0] = s.real_rows;
  return out;
}

inline std::string shape_text(const std::vector<std::int64_t>& d) {
  std::string out = "[";
  for (std::size_t i = 0; i < d.size(); ++i) out += (i ? ", " : "") + std::to_string(d[i]);
  return out + "]";
}

// Piece k of the list in rank file `path`, every field checked before it is used - CRCs only
// say the file is as written, not that its writer was right: its split consistent, its element
// range inside its shard, and, for a parameter of `model` (this rank's; a pipeline stage's
// pieces of other stages' parameters are never used), the same serial shape as here.
inline piece read_piece(const json& pj, const std::string& path, std::size_t k,
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

// Every rank file's tensors and its pieces by parameter; the pieces point into the tensors.
struct saved_pieces {
  std::vector<std::vector<named_tensor>> files;
  std::map<std::string, std::vector<piece>> by_param;
};

// One rank file of the manifest: its tensors, and each piece of its list with the tensors of
// each kind it names.
template <class P>
void read_rank_file_pieces(const json& entry, const std::string& step_dir,
                           const std::map<std::string, const param_info*>& model_params, saved_pieces& saved) {
  const std::string file_name =
      json_string_field(entry, "name", "checkpoint '" + step_dir + "': a manifest file entry");
  // A name, not a path: the manifest must not send the reader outside the step directory.
  STRATA_CHECK(!file_name.empty() && file_name != "." && file_name != ".." && file_name.find('/') == std::string::npos,
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
    saved.by_param[p.param].push_back(p);
  }
}

// Every rank file the manifest lists, checked, and its pieces by parameter.
template <class P>
saved_pieces read_pieces(const json& manifest, const std::string& step_dir,
                         const parameter_store<typename P::storage>& params) {
  saved_pieces saved;
  saved.files.reserve(manifest.at("files").size());
  std::map<std::string, const param_info*> model_params;
  for (const auto& e : params.entries()) model_params[e.name] = &e;
  for (const auto& entry : manifest.at("files")) read_rank_file_pieces<P>(entry, step_dir, model_params, saved);
  return saved;
}

// One parameter's whole (serial) tensor of each kind.
struct serial_tensors {
  std::vector<double> weights, master, m1, m2;
};

// Parameter e's serial tensors, from every piece of it; every element must be covered.
inline serial_tensors assemble_serial(const param_info& e, const std::vector<piece>& pieces,
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
void install_rank_part(const param_info& e, const serial_tensors& t, train_state_ref<P> s) {
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

}  // namespace detail::resharding
}  // namespace strata
