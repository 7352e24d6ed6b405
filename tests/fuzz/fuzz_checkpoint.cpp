// Fuzzes checkpoint loading through the real resume path (checkpointer::resume: scan, manifest
// against COMPLETE, each rank file against the manifest's size and CRC-32, then every piece's
// shard fields against the model) with a tiny GPT-2's checkpoints, in fp32 and in bf16 with an
// fp32 master copy. One file of the step directory is mutated at a time. Half of the inputs are
// re-checksummed afterwards (the manifest's bytes and crc32 of each rank file, COMPLETE's crc32
// of the manifest), as a buggy or foreign writer would leave them, so the checks behind the CRCs
// see the damage; a quarter get a structure-aware edit of one piece's shard fields (index, parts,
// dim, blocks, ...) in a re-encoded rank file.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <strata/parallel/sequential_model.hpp>
#include <strata/train/checkpoint.hpp>

#include "strata/models/gpt2.hpp"
#include "mutate.hpp"

namespace st = strata;
namespace fz = strata_fuzz;
using json = nlohmann::json;

namespace {

const strata::models::gpt2::dims tiny{.vocab = 8, .seq = 4, .layers = 1, .heads = 1, .d_model = 4};
const json model_json{{"model", "gpt2"}, {"vocab", 8}, {"seq", 4}, {"layers", 1}, {"d_model", 4}};
constexpr int saved_step = 3;

using P32 = st::policy<st::host, st::serial, st::fp32>;
using PBF16 = st::policy<st::host, st::serial, st::mixed<st::bf16, float>>;

// A model, its optimizer and a checkpointer on `dir`, kept across inputs (loading overwrites them).
template <class P>
struct run_state {
  st::memory_ledger ledger{st::host_memory()};
  st::sequential_model<strata::models::gpt2::model<P>> model{ledger, tiny, st::seed{3}};
  st::adamw<P> opt{model, {.lr = 3e-3}};
  st::checkpointer ckpt;
  explicit run_state(const std::string& dir) : ckpt({dir, 0}, st::group_ref(), {{"world", 1}}, model_json) {}
  st::train_state_ref<P> state() { return {model.parameters(), opt, {}}; }
  std::string save() {
    return ckpt.save(st::train_progress{saved_step, saved_step, {1024.0, 2, 1}, 11, saved_step}, state());
  }
};

// The runs live in a directory of their own; each input is written to <ck>/step-00000003.
struct runs {
  fz::fs::path ck;
  run_state<P32> fp32;
  run_state<PBF16> bf16;
  explicit runs(const fz::fs::path& dir) : ck(dir), fp32(dir.string()), bf16(dir.string()) {}
};
runs& shared_runs() {
  static runs r(fz::scratch_root(fz::fs::temp_directory_path()) /
                ("strata-fuzz-checkpoint-" + std::to_string(::getpid())));
  return r;
}

void write_step(const fz::input& in, const fz::fs::path& ck) {
  fz::fs::remove_all(ck);
  const auto dir = fz::fs::path(st::checkpoint_files::step_dir(ck.string(), saved_step));
  fz::fs::create_directories(dir);
  for (const auto& f : in) fz::write_bytes(dir / f.name, f.data);
}

template <class P>
bool resume(const fz::input& in, runs& r, run_state<P>& s) {
  write_step(in, r.ck);  // afresh: a resume may clean up what it refuses
  const auto loaded = s.ckpt.resume(s.state());
  if (!loaded) return false;
  volatile float sum = 0;  // every weight and moment read back
  auto& p = s.model.parameters();
  for (std::int64_t i = 0; i < p.size(); ++i) sum = sum + float(st::convert<float>(p.weights_data()[i]));
  for (float v : s.opt.first_moments()) sum = sum + v;
  for (float v : s.opt.second_moments()) sum = sum + v;
  return true;
}

void run(const fz::input& in, const fz::fs::path&, fz::tally& tl) {
  auto& r = shared_runs();
  tl.attempt("resume fp32", [&] { return resume(in, r, r.fp32); });
  tl.attempt("resume bf16+master", [&] { return resume(in, r, r.bf16); });
}

fz::file* find(fz::input& in, const std::string& name) {
  for (auto& f : in)
    if (f.name == name) return &f;
  return nullptr;
}

// Replaces the value after `"key":` (a number, or a string's contents) inside [from, to).
bool set_field(std::string& text, std::size_t from, std::size_t to, const std::string& key, const std::string& value,
               bool quoted) {
  const std::size_t k = text.find("\"" + key + "\"", from);
  if (k == std::string::npos || k >= to) return false;
  std::size_t v = text.find(':', k);
  if (v == std::string::npos) return false;
  ++v;
  while (v < text.size() && text[v] == ' ') ++v;
  std::size_t end = v;
  if (quoted) {
    if (v >= text.size() || text[v] != '"') return false;
    end = text.find('"', v + 1);
    if (end == std::string::npos) return false;
    text.replace(v + 1, end - v - 1, value);
  } else {
    while (end < text.size() && text[end] != ',' && text[end] != '}' && text[end] != '\n') ++end;
    text.replace(v, end - v, value);
  }
  return true;
}

// What a writer that computes its checksums after the damage leaves: each rank file's size and
// CRC-32 in the manifest (edited in its text, so the rest of a mutated manifest stays as it is),
// then COMPLETE's CRC-32 of the manifest.
void fixup(fz::input& in) {
  auto* manifest = find(in, st::checkpoint_files::manifest);
  if (!manifest) return;
  std::string m = fz::to_text(manifest->data);
  for (const auto& f : in) {
    if (!fz::ends_with(f.name, ".safetensors")) continue;
    const std::size_t at = m.find("\"" + f.name + "\"");
    if (at == std::string::npos) continue;
    const std::size_t end = std::min(m.find('}', at), m.size());
    set_field(m, at, end, "crc32", st::checkpoint_files::hex32(st::crc32_of(f.data)), true);
    set_field(m, at, std::min(m.find('}', at), m.size()), "bytes", std::to_string(f.data.size()), false);
  }
  manifest->data = fz::to_bytes(m);
  auto* complete = find(in, st::checkpoint_files::complete);
  const std::string marker = "crc32 " + st::checkpoint_files::hex32(st::crc32_of(manifest->data)) + "\n";
  if (complete) complete->data = fz::to_bytes(marker);
  else in.push_back({st::checkpoint_files::complete, fz::to_bytes(marker)});
}

// One piece's shard fields, or one of its tensors, edited in a decoded and re-encoded rank file.
bool edit_pieces(fz::input& in, fz::rng& r) {
  std::vector<fz::file*> ranks;
  for (auto& f : in)
    if (fz::ends_with(f.name, ".safetensors")) ranks.push_back(&f);
  if (ranks.empty()) return false;
  fz::file& f = *r.pick(ranks);
  std::map<std::string, std::string> meta;
  std::vector<st::named_tensor> tensors;
  json pieces;
  try {
    tensors = st::decode_safetensors(f.data, f.name, &meta);
    pieces = json::parse(meta.at("pieces"));
  } catch (const std::exception&) {
    return false;  // not a rank file the edit understands (already damaged)
  }
  if (!pieces.is_array() || pieces.empty()) return false;
  json& p = pieces[r.below(pieces.size())];
  static const std::vector<std::string> fields{"begin", "count",  "numel",     "full",        "dim",         "parts",
                                               "index", "blocks", "real_rows", "block_sizes", "block_parts", "param"};
  static const std::vector<long long> values{
      0, -1, 1, 2, 3, 4, 5, 7, 16, 64, 65, 300, 2147483647, -2147483648LL, 4294967296LL, 9223372036854775807LL};
  const std::string field = r.pick(fields);
  long long v = r.pick(values);
  if (p.contains(field) && p[field].is_number_integer() && r.chance(30))  // a neighbour (wrapping, defined)
    v = static_cast<long long>(p[field].get<std::uint64_t>() + (r.chance(50) ? 1 : ~std::uint64_t(0)));
  switch (r.below(6)) {
    case 0: p.erase(field); break;
    case 1: {  // an array of 0-6 interesting values
      json a = json::array();
      for (std::size_t k = 0, n = r.below(7); k < n; ++k) a.push_back(r.pick(values));
      p[field] = a;
      break;
    }
    case 2:  // a sharded split that may or may not fit: parts/index/blocks together
      p["parts"] = r.pick(values) % 9;
      p["index"] = r.pick(values) % 9;
      p["dim"] = r.below(6) - 1;
      if (r.chance(50)) p["blocks"] = 1 + r.below(4);
      break;
    case 3:  // a tensor of the piece dropped, renamed or resized
      if (!tensors.empty()) {
        auto& t = tensors[r.below(tensors.size())];
        if (r.chance(30)) tensors.erase(tensors.begin() + std::ptrdiff_t(&t - tensors.data()));
        else if (r.chance(50)) t.name += "x";
        else {
          const std::size_t n = r.below(5);
          t = st::make_tensor<float>(t.name, {std::int64_t(n)}, std::vector<double>(n, 0.5));
        }
      }
      break;
    default: p[field] = field == "param" ? json("h.0.ln_1.weight") : json(v); break;
  }
  meta["pieces"] = pieces.dump();
  try {
    f.data = st::encode_safetensors(tensors, meta);
  } catch (const std::exception&) { return false; }
  fixup(in);
  return true;
}

fz::input read_dir(const fz::fs::path& dir) {
  fz::input in;
  for (const auto& e : fz::fs::directory_iterator(dir))
    if (e.is_regular_file() && !fz::ends_with(e.path().string(), ".tmp"))
      in.push_back({e.path().filename().string(), fz::read_bytes(e.path())});
  std::sort(in.begin(), in.end(), [](const fz::file& a, const fz::file& b) { return a.name < b.name; });
  return in;
}
void write_dir(const fz::fs::path& dir, const fz::input& in) {
  fz::fs::remove_all(dir);
  fz::fs::create_directories(dir);
  for (const auto& f : in) fz::write_bytes(dir / f.name, f.data);
}

// The fp32 checkpoint as two ranks would save it under ZeRO: each piece split in two halves,
// the first halves in rank 0's file and the second in rank 1's.
fz::input two_ranks(const fz::input& one) {
  fz::input in = one;
  auto* rank0 = find(in, st::checkpoint_files::rank_file(0));
  std::map<std::string, std::string> meta;
  const auto tensors = st::decode_safetensors(rank0->data, rank0->name, &meta);
  std::map<std::string, const st::named_tensor*> named;
  for (const auto& t : tensors) named[t.name] = &t;
  json halves[2] = {json::array(), json::array()};
  std::vector<st::named_tensor> files[2];
  for (const auto& p : json::parse(meta.at("pieces"))) {
    const std::int64_t begin = p.at("begin"), count = p.at("count"), h = count / 2;
    const std::string key = p.at("param").get<std::string>() + "@" + std::to_string(begin);
    for (int half = 0; half < 2; ++half) {
      const std::int64_t b = half == 0 ? begin : begin + h, n = half == 0 ? h : count - h;
      if (n == 0) continue;
      json q = p;
      q["begin"] = b;
      q["count"] = n;
      halves[half].push_back(q);
      const std::string k = p.at("param").get<std::string>() + "@" + std::to_string(b);
      for (const char* kind : {"weights", "master", "exp_avg", "exp_avg_sq"}) {
        const auto it = named.find(std::string(kind) + "/" + key);
        if (it == named.end()) continue;
        const auto* t = it->second;
        const std::size_t width = t->bytes.size() / std::size_t(t->numel());
        st::named_tensor part{std::string(kind) + "/" + k, t->dtype, {n}, {}};
        part.bytes.assign(t->bytes.begin() + std::ptrdiff_t(std::size_t(b - begin) * width),
                          t->bytes.begin() + std::ptrdiff_t(std::size_t(b - begin + n) * width));
        files[half].push_back(std::move(part));
      }
    }
  }
  json manifest = json::parse(find(in, st::checkpoint_files::manifest)->data);
  manifest["layout"]["world"] = 2;
  manifest["files"] = json::array();
  in.clear();
  for (int rank = 0; rank < 2; ++rank) {
    const auto bytes = st::encode_safetensors(files[rank], {{"format", "strata-checkpoint-shard"},
                                                            {"step", std::to_string(saved_step)},
                                                            {"rank", std::to_string(rank)},
                                                            {"pieces", halves[rank].dump()}});
    manifest["files"].push_back({{"name", st::checkpoint_files::rank_file(rank)},
                                 {"rank", rank},
                                 {"bytes", bytes.size()},
                                 {"crc32", st::checkpoint_files::hex32(st::crc32_of(bytes))}});
    in.push_back({st::checkpoint_files::rank_file(rank), bytes});
  }
  in.push_back({st::checkpoint_files::manifest, fz::to_bytes(manifest.dump(1) + "\n")});
  fixup(in);
  return in;
}

// A copy of `in` with one field of one piece set, re-encoded and re-checksummed.
fz::input with_piece_field(fz::input in, const std::string& field, const json& value) {
  auto* f = find(in, st::checkpoint_files::rank_file(0));
  std::map<std::string, std::string> meta;
  const auto tensors = st::decode_safetensors(f->data, f->name, &meta);
  json pieces = json::parse(meta.at("pieces"));
  for (auto& p : pieces)
    if (p.at("param") == "h.0.attn.qkv.weight") p[field] = value;
  meta["pieces"] = pieces.dump();
  f->data = st::encode_safetensors(tensors, meta);
  fixup(in);
  return in;
}
fz::input with_manifest(fz::input in, const std::string& from, const std::string& to) {
  auto* m = find(in, st::checkpoint_files::manifest);
  std::string text = fz::to_text(m->data);
  text.replace(text.find(from), from.size(), to);
  m->data = fz::to_bytes(text);
  fixup(in);
  return in;
}

void write_corpus(const fz::fs::path& dir) {
  auto& r = shared_runs();
  fz::fs::remove_all(r.ck);
  const fz::input fp32 = read_dir(r.fp32.save());
  fz::fs::remove_all(r.ck);
  const fz::input bf16 = read_dir(r.bf16.save());
  write_dir(dir / "ok-fp32", fp32);
  write_dir(dir / "ok-bf16-master", bf16);
  write_dir(dir / "ok-fp32-two-ranks", two_ranks(fp32));

  fz::input incomplete = fp32;
  incomplete.erase(std::remove_if(incomplete.begin(), incomplete.end(),
                                  [](const fz::file& f) { return f.name == st::checkpoint_files::complete; }),
                   incomplete.end());
  write_dir(dir / "bad-no-complete", incomplete);
  fz::input flipped = fp32;
  find(flipped, st::checkpoint_files::rank_file(0))->data[100] ^= 1;
  write_dir(dir / "bad-rank-crc", flipped);
  // Damage behind matching checksums: the shard fields the loader must check itself.
  write_dir(dir / "bad-piece-index", with_piece_field(fp32, "index", 7));
  write_dir(dir / "bad-piece-parts-zero", with_piece_field(fp32, "parts", 0));
  write_dir(dir / "bad-piece-blocks-zero", with_piece_field(fp32, "blocks", 0));
  write_dir(dir / "bad-piece-dim", with_piece_field(fp32, "dim", 4));
  write_dir(dir / "bad-piece-begin", with_piece_field(fp32, "begin", -4));
  write_dir(dir / "bad-step-mismatch", with_manifest(fp32, "\"step\": 3", "\"step\": 7"));
  write_dir(dir / "bad-nested-layout",
            with_manifest(fp32, "\"world\": 1", "\"world\": " + std::string(5000, '[') + std::string(5000, ']')));
  fz::fs::remove_all(r.ck);
}

}  // namespace

int main(int argc, char** argv) {
  fz::target t;
  t.name = "checkpoint";
  t.directories = true;
  t.run = run;
  t.write_corpus = write_corpus;
  t.structured = edit_pieces;
  t.fixup = fixup;
  const int rc = fz::main(argc, argv, t, (strata_test::program_dir() / "corpus" / "checkpoint").string());
  fz::fs::remove_all(shared_runs().ck);
  return rc;
}
