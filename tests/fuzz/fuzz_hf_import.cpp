// Fuzzes gpt2_train's --init-from readers: the GPT-2 and Llama importers
// (strata/models/gpt2_hf.hpp, strata/models/llama_hf.hpp over strata/train/hf_weights.hpp),
// which find each tensor with or without its prefix, skip tensors nobody uses (of any dtype),
// crop a longer position table and compare a stored head with the embedding: logic of their own
// on top of safetensors_reader, fed here with tiny models' files.
#include <cstdint>
#include <string>
#include <vector>

#include "strata/models/gpt2_hf.hpp"
#include "strata/models/llama_hf.hpp"

#include "mutate.hpp"

namespace st = strata;
namespace fz = strata_fuzz;

namespace {

const strata::models::gpt2::dims gdims{.vocab = 8, .seq = 4, .layers = 1, .heads = 1, .d_model = 4};
const strata::models::llama::dims ldims{
    .vocab = 8, .seq = 4, .layers = 1, .heads = 2, .d_model = 4, .kv_heads = 1, .ffn = 8};

void run(const fz::input& in, const fz::fs::path& work, fz::tally& tl) {
  const std::string path = (work / "model.safetensors").string();
  fz::write_bytes(path, in[0].data);
  const auto expect = [](const std::vector<double>& w, std::size_t n, const char* model) {
    if (w.size() != n) st::fail("fuzz: ", model, " import returned ", w.size(), " weights for ", n);
    volatile double sum = 0;  // every weight read
    for (double v : w) sum = sum + v;
    return true;
  };
  std::size_t gn = 0, ln = 0;
  for (const auto& p : strata::models::gpt2::hf_layout(gdims)) gn += std::size_t(p.numel());
  for (const auto& p : strata::models::llama::hf_layout(ldims)) ln += std::size_t(p.numel());
  tl.attempt("strata::models::gpt2::import_hf", [&] {
    std::vector<std::string> notes;
    return expect(strata::models::gpt2::import_hf(path, gdims, &notes), gn, "gpt2");
  });
  tl.attempt("strata::models::llama::import_hf", [&] {
    std::vector<std::string> notes;
    return expect(strata::models::llama::import_hf(path, ldims, &notes), ln, "llama");
  });
}

std::vector<double> ramp(std::size_t n) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 0.01 * double((i * 37) % 101) - 0.5;
  return v;
}

// GPT-2 tensors in the file's layout, under `prefix`, with the position table `positions` long.
std::vector<st::named_tensor> gpt2_tensors(const std::string& prefix, std::int64_t positions) {
  std::vector<st::named_tensor> out;
  for (auto p : strata::models::gpt2::hf_layout(gdims)) {
    std::string name = p.parts[0].name.substr(std::string("transformer.").size());
    auto shape = p.transposed ? std::vector<std::int64_t>{p.shape[1], p.shape[0]} : p.shape;
    if (name == "wpe.weight") shape[0] = positions;
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    out.push_back(st::make_tensor<float>(prefix + name, shape, ramp(std::size_t(n))));
  }
  return out;
}

// A safetensors file of tensors of any dtype (encode_safetensors writes strata's dtypes only).
fz::bytes encode_any(const std::vector<st::named_tensor>& tensors) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + t.bytes.size()}}};
    at += t.bytes.size();
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  fz::bytes b(8);
  for (int i = 0; i < 8; ++i) b[std::size_t(i)] = static_cast<unsigned char>(std::uint64_t(text.size()) >> (8 * i));
  b.insert(b.end(), text.begin(), text.end());
  for (const auto& t : tensors) b.insert(b.end(), t.bytes.begin(), t.bytes.end());
  return b;
}

void write_corpus(const fz::fs::path& dir) {
  const auto save = [&](const std::string& name, const std::vector<st::named_tensor>& t) {
    fz::write_bytes(dir / name, encode_any(t));
  };
  std::size_t gn = 0, ln = 0;
  for (const auto& p : strata::models::gpt2::hf_layout(gdims)) gn += std::size_t(p.numel());
  for (const auto& p : strata::models::llama::hf_layout(ldims)) ln += std::size_t(p.numel());
  const std::string tmp = (dir / "tmp.safetensors").string();
  strata::models::gpt2::export_hf<float>(tmp, gdims, ramp(gn));
  fz::fs::rename(tmp, dir / "ok-gpt2.safetensors");
  strata::models::llama::export_hf<st::bf16>(tmp, ldims, ramp(ln));
  fz::fs::rename(tmp, dir / "ok-llama-bf16.safetensors");

  // The hub's layout: no prefix, a longer position table, BOOL masks and a head equal to wte.
  auto hub = gpt2_tensors("", 8);
  st::named_tensor mask{"h.0.attn.bias", "BOOL", {1, 1, 4, 4}, fz::bytes(16, 1)};
  hub.push_back(mask);
  hub.push_back(st::make_tensor<float>("lm_head.weight", {8, 4}, ramp(32)));
  save("ok-gpt2-hub-layout.safetensors", hub);

  auto both = gpt2_tensors("transformer.", 4);
  both.push_back(st::make_tensor<float>("wte.weight", {8, 4}, ramp(32)));
  save("bad-gpt2-both-forms.safetensors", both);
  save("bad-gpt2-short-wpe.safetensors", gpt2_tensors("transformer.", 2));
  auto untied = gpt2_tensors("", 4);
  untied.push_back(st::make_tensor<float>("lm_head.weight", {8, 4}, std::vector<double>(32, 1.0)));
  save("bad-gpt2-untied-head.safetensors", untied);
  auto ints = gpt2_tensors("", 4);
  ints[0] = st::named_tensor{"wte.weight", "I32", {8, 4}, fz::bytes(128, 0)};
  save("bad-gpt2-int-weights.safetensors", ints);
}

}  // namespace

int main(int argc, char** argv) {
  fz::target t;
  t.name = "hf_import";
  t.run = run;
  t.write_corpus = write_corpus;
  return fz::main(argc, argv, t, (strata_test::program_dir() / "corpus" / "hf_import").string());
}
