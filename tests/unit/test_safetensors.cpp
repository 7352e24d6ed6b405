// safetensors: a round trip keeps every byte; a bad file is refused with its name and the
// offset; the example GPT-2 exports with Hugging Face's GPT-2 names, shapes and dtypes, and a
// model loaded from the export holds exactly the exported weights. Files as users hold them (a
// hub-layout GPT-2 written byte by byte here: no "transformer." prefix, BOOL and F32 masks,
// masked_bias, an lm_head, a longer position table) load, the extras skipped and named.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <strata/parallel/gather.hpp>
#include <strata/strata.hpp>
#include <strata/train/safetensors.hpp>

#include "strata/models/gpt2_hf.hpp"

namespace st = strata;

namespace {

std::string temp_path(const std::string& name) { return "/tmp/strata_test_" + name; }

std::vector<double> weights_of(st::parameter_store<float>& p) {
  return std::vector<double>(p.weights_data(), p.weights_data() + p.size());
}

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// A file with this header text and these data bytes.
std::string file_with(const std::string& header, const std::string& data) {
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[std::size_t(i)] = char((header.size() >> (8 * i)) & 0xff);
  return len + header + data;
}

}  // namespace

TEST_CASE("a safetensors round trip keeps names, dtypes, shapes, bytes and metadata") {
  const std::string path = temp_path("round.safetensors");
  const std::vector<st::named_tensor> out{st::make_tensor<float>("a", {2, 3}, {1, 2, 3, 4, 5, 6}),
                                          st::make_tensor<st::bf16>("b.c", {4}, {0.5, -1.25, 3.0, 1e-3}),
                                          st::make_tensor<st::fp16>("d", {1, 1}, {65504.0})};
  st::write_safetensors(path, out, {{"format", "pt"}});
  std::map<std::string, std::string> meta;
  auto in = st::read_safetensors(path, &meta);
  REQUIRE(in.size() == 3);
  CHECK(meta["format"] == "pt");
  for (const auto& t : out) {
    const auto it = std::find_if(in.begin(), in.end(), [&](const auto& x) { return x.name == t.name; });
    REQUIRE(it != in.end());
    CHECK(it->dtype == t.dtype);
    CHECK(it->shape == t.shape);
    CHECK(it->bytes == t.bytes);
  }
  CHECK(in[0].at(4) == 5.0);
  std::remove(path.c_str());
}

TEST_CASE("a truncated or corrupt safetensors file is refused with its name and the offset") {
  const std::string path = temp_path("bad.safetensors");
  st::write_safetensors(path, {st::make_tensor<float>("w", {4}, {1, 2, 3, 4})});
  std::ifstream in(path, std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The data cut short: the tensor's bytes run past the end.
  write_bytes(path, good.substr(0, good.size() - 4));
  CHECK_THROWS_WITH_AS(
      st::read_safetensors(path),
      doctest::Contains("strata_test_bad.safetensors': tensor 'w' has data_offsets [0, 16] outside the 12 data bytes"),
      st::error);
  // A header length past the end of the file.
  write_bytes(path, std::string("\xff\x00\x00\x00\x00\x00\x00\x00", 8) + "{}");
  CHECK_THROWS_WITH_AS(st::read_safetensors(path),
                       doctest::Contains("the header length at offset 0 says 255 bytes, but the file has 2 after it"),
                       st::error);
  // A header that is not JSON.
  write_bytes(path, std::string("\x04\x00\x00\x00\x00\x00\x00\x00", 8) + "{oops");
  CHECK_THROWS_WITH_AS(st::read_safetensors(path), doctest::Contains("the header (bytes 8 to 12) is not valid JSON"),
                       st::error);
  // A dtype strata does not read.
  write_bytes(path, file_with(R"({"w":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})", "abcd"));
  CHECK_THROWS_WITH_AS(st::read_safetensors(path), doctest::Contains("tensor 'w' has dtype I8"), st::error);
  CHECK_THROWS_WITH_AS(st::read_safetensors(temp_path("missing.safetensors")), doctest::Contains("cannot open"),
                       st::error);
  std::remove(path.c_str());
}

TEST_CASE("the example GPT-2 exports with GPT-2's names and loads back exactly") {
  const strata::models::gpt2::dims d{.vocab = 50, .seq = 8, .layers = 2, .heads = 2, .d_model = 16};
  // The layout the exporter walks is the model's own flat order.
  st::memory_ledger ledger;
  st::sequential_model<strata::models::gpt2::model<st::policy<st::host, st::serial, st::fp32>>> a(ledger, d,
                                                                                                  st::seed{1});
  const auto layout = strata::models::gpt2::hf_layout(d);
  REQUIRE(layout.size() == a.parameters().entries().size());
  for (std::size_t i = 0; i < layout.size(); ++i) {
    CHECK(layout[i].name == a.parameters().entries()[i].name);
    CHECK(layout[i].numel() == a.parameters().entries()[i].numel);
  }
  const std::string path = temp_path("gpt2.safetensors");
  strata::models::gpt2::export_hf<float>(path, d, weights_of(a.parameters()));
  const auto tensors = st::read_safetensors(path);
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const auto& t : tensors) {
    shapes[t.name] = t.shape;
    CHECK(t.dtype == "F32");
  }
  CHECK(shapes.size() == 2 + 12 * 2 + 2);
  CHECK(shapes["transformer.wte.weight"] == std::vector<std::int64_t>{50, 16});
  CHECK(shapes["transformer.wpe.weight"] == std::vector<std::int64_t>{8, 16});
  CHECK(shapes["transformer.h.1.attn.c_attn.weight"] == std::vector<std::int64_t>{16, 48});  // Conv1D: [in, out]
  CHECK(shapes["transformer.h.1.attn.c_proj.weight"] == std::vector<std::int64_t>{16, 16});
  CHECK(shapes["transformer.h.0.mlp.c_fc.weight"] == std::vector<std::int64_t>{16, 64});
  CHECK(shapes["transformer.h.0.mlp.c_proj.weight"] == std::vector<std::int64_t>{64, 16});
  CHECK(shapes["transformer.ln_f.bias"] == std::vector<std::int64_t>{16});
  // Another seed, then the file: exactly the first model's weights.
  st::sequential_model<strata::models::gpt2::model<st::policy<st::host, st::serial, st::fp32>>> b(ledger, d,
                                                                                                  st::seed{2});
  CHECK(weights_of(b.parameters()) != weights_of(a.parameters()));
  auto& p = b.parameters();
  st::scatter_model_weights(
      p, std::span<float>(p.weights_data(), std::size_t(p.size())),
      st::sequential_model<strata::models::gpt2::model<st::policy<st::host, st::serial, st::fp32>>>::serial_parameters(
          d),
      strata::models::gpt2::import_hf(path, d));
  CHECK(weights_of(b.parameters()) == weights_of(a.parameters()));
  // bf16 models write BF16.
  strata::models::gpt2::export_hf<st::bf16>(path, d, weights_of(a.parameters()));
  CHECK(st::read_safetensors(path).front().dtype == "BF16");
  // A file for another shape is refused with the tensor and both shapes.
  const strata::models::gpt2::dims wider{.vocab = 50, .seq = 8, .layers = 2, .heads = 2, .d_model = 32};
  CHECK_THROWS_WITH_AS(
      strata::models::gpt2::import_hf(path, wider),
      doctest::Contains("tensor 'transformer.wte.weight' has shape [50, 16], the model expects [50, 32]"), st::error);
  std::remove(path.c_str());
}

// --- Hugging Face files as users hold them (issue 17): the released hub `gpt2` layout ---------

namespace {

// One tensor of a hand-written file: its name, dtype, shape and raw bytes.
struct raw_tensor {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::string bytes;
};

// The bytes of a safetensors file holding `tensors` in this order: header JSON (padded to 8),
// then the data - written here without strata's writer.
std::string raw_file(const std::vector<raw_tensor>& tensors) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}", data;
  for (const auto& t : tensors) {
    std::string shape;
    for (auto s : t.shape) {
      if (!shape.empty()) shape += ',';
      shape += std::to_string(s);
    }
    for (const std::string& part :
         {std::string(",\""), t.name, std::string("\":{\"dtype\":\""), t.dtype, std::string("\",\"shape\":["), shape,
          std::string("],\"data_offsets\":["), std::to_string(data.size()), std::string(","),
          std::to_string(data.size() + t.bytes.size()), std::string("]}")})
      header += part;
    data += t.bytes;
  }
  header += "}";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  return file_with(header, data);
}

std::string f32_bytes(const std::vector<float>& v) {
  std::string b(v.size() * 4, '\0');
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A small GPT-2 as the hub ships one: Conv1D weights [in, out], names with or without
// "transformer.", the attention masks beside the weights. Element i of the k-th weight tensor is
// (k + 1) / 8 + i / 1024 (exact in float); `serial` receives strata's flat order, transposing the
// Conv1D weights back to [out, in], computed here independently of gpt2_hf.hpp.
struct hub_gpt2 {
  static constexpr std::int64_t V = 16, T = 12, C = 8, F = 32, L = 2;
  std::vector<raw_tensor> tensors;
  std::vector<double> serial;

  explicit hub_gpt2(const std::string& prefix, bool masks = true) {
    int k = 0;
    const auto values = [&](std::int64_t n) {
      std::vector<float> v(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) v[std::size_t(i)] = float(k + 1) / 8.0f + float(i) / 1024.0f;
      ++k;
      return v;
    };
    // A plain tensor: the file's order is strata's.
    const auto plain = [&](const std::string& name, std::vector<std::int64_t> shape) {
      std::int64_t n = 1;
      for (auto s : shape) n *= s;
      const auto v = values(n);
      tensors.push_back({prefix + name, "F32", shape, f32_bytes(v)});
      serial.insert(serial.end(), v.begin(), v.end());
    };
    // A Conv1D weight, [in, out] in the file, [out, in] in strata.
    const auto conv = [&](const std::string& name, std::int64_t in, std::int64_t out) {
      const auto v = values(in * out);
      tensors.push_back({prefix + name, "F32", {in, out}, f32_bytes(v)});
      for (std::int64_t o = 0; o < out; ++o)
        for (std::int64_t i = 0; i < in; ++i) serial.push_back(v[std::size_t(i * out + o)]);
    };
    plain("wte.weight", {V, C});
    plain("wpe.weight", {T, C});
    for (int l = 0; l < L; ++l) {
      const std::string h = "h." + std::to_string(l) + ".";
      plain(h + "ln_1.weight", {C});
      plain(h + "ln_1.bias", {C});
      if (masks) {
        // The causal mask: BOOL in block 0, F32 in block 1; masked_bias a F32 scalar.
        std::string mask(std::size_t(T * T), '\0');
        for (std::int64_t r = 0; r < T; ++r)
          for (std::int64_t c = 0; c <= r; ++c) mask[std::size_t(r * T + c)] = 1;
        if (l == 0) {
          tensors.push_back({h + "attn.bias", "BOOL", {1, 1, T, T}, mask});
        } else {
          std::vector<float> m(mask.begin(), mask.end());
          tensors.push_back({h + "attn.bias", "F32", {1, 1, T, T}, f32_bytes(m)});
        }
        tensors.push_back({h + "attn.masked_bias", "F32", {}, f32_bytes({-1e4f})});
      }
      conv(h + "attn.c_attn.weight", C, 3 * C);
      plain(h + "attn.c_attn.bias", {3 * C});
      conv(h + "attn.c_proj.weight", C, C);
      plain(h + "attn.c_proj.bias", {C});
      plain(h + "ln_2.weight", {C});
      plain(h + "ln_2.bias", {C});
      conv(h + "mlp.c_fc.weight", C, F);
      plain(h + "mlp.c_fc.bias", {F});
      conv(h + "mlp.c_proj.weight", F, C);
      plain(h + "mlp.c_proj.bias", {C});
    }
    plain("ln_f.weight", {C});
    plain("ln_f.bias", {C});
  }
  static strata::models::gpt2::dims dims(std::int64_t seq = T) {
    return {.vocab = V, .seq = seq, .layers = L, .heads = 2, .d_model = C};
  }
  const raw_tensor& tensor(const std::string& name) const {
    for (const auto& t : tensors)
      if (t.name == name) return t;
    FAIL("no tensor " << name);
    return tensors.front();
  }
};

}  // namespace

TEST_CASE("a hub-layout GPT-2 file loads: names without prefix, BOOL and F32 masks and masked_bias skipped and named") {
  const std::string path = temp_path("hub_gpt2.safetensors");
  const hub_gpt2 hub("");
  write_bytes(path, raw_file(hub.tensors));
  std::vector<std::string> notes;
  const auto serial = strata::models::gpt2::import_hf(path, hub_gpt2::dims(), &notes);
  REQUIRE(serial.size() == hub.serial.size());
  CHECK(serial == hub.serial);  // every weight, the Conv1D transposes included
  REQUIRE(notes.size() == 1);
  CHECK(notes[0] ==
        "skipped 4 tensors strata does not use: h.{0..1}.attn.bias (BOOL/F32), h.{0..1}.attn.masked_bias (F32)");
  // The same weights under "transformer." (GPT2LMHeadModel's names) load the same.
  const hub_gpt2 prefixed("transformer.");
  write_bytes(path, raw_file(prefixed.tensors));
  notes.clear();
  CHECK(strata::models::gpt2::import_hf(path, hub_gpt2::dims(), &notes) == hub.serial);
  CHECK(notes[0].find("skipped 4 tensors") == 0);
  // strata's own export of them reads back the same, with nothing skipped.
  strata::models::gpt2::export_hf<float>(path, hub_gpt2::dims(), hub.serial);
  notes.clear();
  CHECK(strata::models::gpt2::import_hf(path, hub_gpt2::dims(), &notes) == hub.serial);
  CHECK(notes.empty());

  // One tensor under both names is refused, naming both.
  auto both = hub.tensors;
  auto copy = hub.tensor("h.1.mlp.c_fc.bias");
  copy.name = "transformer.h.1.mlp.c_fc.bias";
  both.push_back(copy);
  write_bytes(path, raw_file(both));
  CHECK_THROWS_WITH_AS(strata::models::gpt2::import_hf(path, hub_gpt2::dims()),
                       doctest::Contains("hub_gpt2.safetensors' holds tensor 'h.1.mlp.c_fc.bias' twice, as "
                                         "'transformer.h.1.mlp.c_fc.bias' and as 'h.1.mlp.c_fc.bias'"),
                       st::error);
  // A missing tensor is named in the file's two possible forms.
  auto missing = hub.tensors;
  missing.erase(
      std::find_if(missing.begin(), missing.end(), [](const raw_tensor& t) { return t.name == "ln_f.bias"; }));
  write_bytes(path, raw_file(missing));
  CHECK_THROWS_WITH_AS(strata::models::gpt2::import_hf(path, hub_gpt2::dims()),
                       doctest::Contains("has no tensor 'transformer.ln_f.bias' (nor 'ln_f.bias')"), st::error);
  std::remove(path.c_str());
}

TEST_CASE("a used tensor keeps its checks: a wrong dtype or shape is refused, an unused one of any dtype is not") {
  const std::string path = temp_path("hub_gpt2_bad.safetensors");
  const hub_gpt2 hub("");
  // A weight the model uses stored as I8: refused with the reader's dtype message.
  auto bad = hub.tensors;
  for (auto& t : bad)
    if (t.name == "h.0.ln_2.bias") t = {t.name, "I8", t.shape, std::string(std::size_t(hub_gpt2::C), '\1')};
  write_bytes(path, raw_file(bad));
  CHECK_THROWS_WITH_AS(
      strata::models::gpt2::import_hf(path, hub_gpt2::dims()),
      doctest::Contains(
          "hub_gpt2_bad.safetensors': tensor 'h.0.ln_2.bias' has dtype I8 (F32, F64, BF16 or F16 expected)"),
      st::error);
  // A used weight of another shape: the tensor as the file names it, and both shapes.
  CHECK_THROWS_WITH_AS(
      strata::models::gpt2::import_hf(path, {.vocab = 16, .seq = 12, .layers = 2, .heads = 2, .d_model = 16}),
      doctest::Contains("tensor 'wte.weight' has shape [16, 8], the model expects [16, 16]"), st::error);
  // An unused BOOL entry is still checked: bytes that do not match its shape are refused.
  auto short_mask = hub.tensors;
  for (auto& t : short_mask)
    if (t.name == "h.0.attn.bias") t.bytes.resize(t.bytes.size() - 1);
  write_bytes(path, raw_file(short_mask));
  CHECK_THROWS_WITH_AS(strata::models::gpt2::import_hf(path, hub_gpt2::dims()),
                       doctest::Contains("tensor 'h.0.attn.bias' spans 143 bytes at file offset"), st::error);
  // A dtype no safetensors file has is refused wherever it is.
  auto odd = hub.tensors;
  odd.push_back({"extra", "Q3", {2}, "ab"});
  write_bytes(path, raw_file(odd));
  CHECK_THROWS_WITH_AS(strata::models::gpt2::import_hf(path, hub_gpt2::dims()),
                       doctest::Contains("tensor 'extra' has dtype Q3, which is not a safetensors dtype"), st::error);
  // read_safetensors (checkpoints) still reads only strata's dtypes, the reader any.
  write_bytes(path, raw_file(hub.tensors));
  CHECK_THROWS_WITH_AS(st::read_safetensors(path),
                       doctest::Contains("tensor 'h.0.attn.bias' has dtype BOOL (F32, F64, BF16 or F16 expected)"),
                       st::error);
  const st::safetensors_reader reader(path);
  REQUIRE(reader.find("h.0.attn.bias") != nullptr);
  CHECK(!reader.find("h.0.attn.bias")->convertible());
  CHECK(reader.find("h.0.attn.masked_bias")->shape.empty());
  CHECK(reader.read("h.0.attn.masked_bias").at(0) == -1e4);
  CHECK(reader.metadata().at("format") == "pt");
  CHECK_THROWS_WITH_AS(reader.read("h.0.attn.bias"), doctest::Contains("tensor 'h.0.attn.bias' has dtype BOOL"),
                       st::error);
  std::remove(path.c_str());
}

TEST_CASE("a longer position table is cropped to --seq, a shorter one refused; lm_head must equal wte") {
  const std::string path = temp_path("hub_gpt2_seq.safetensors");
  const hub_gpt2 hub("");
  write_bytes(path, raw_file(hub.tensors));
  // seq 5 of the file's 12 positions: the first 5 rows of wpe, everything else as it is.
  std::vector<std::string> notes;
  const auto serial = strata::models::gpt2::import_hf(path, hub_gpt2::dims(5), &notes);
  const auto V = hub_gpt2::V, C = hub_gpt2::C, T = hub_gpt2::T;
  std::vector<double> want(hub.serial.begin(), hub.serial.begin() + (V + 5) * C);
  want.insert(want.end(), hub.serial.begin() + (V + T) * C, hub.serial.end());
  CHECK(serial == want);
  REQUIRE(notes.size() == 2);
  CHECK(notes[0] == "wpe has 12 positions, using the first 5 (--seq 5)");
  CHECK_THROWS_WITH_AS(strata::models::gpt2::import_hf(path, hub_gpt2::dims(16)),
                       doctest::Contains("tensor 'wpe.weight' has 12 positions, fewer than --seq 16"), st::error);

  // An lm_head.weight equal to wte loads (it is the tied head); another one is refused.
  auto with_head = hub.tensors;
  auto head = hub.tensor("wte.weight");
  head.name = "lm_head.weight";
  with_head.push_back(head);
  write_bytes(path, raw_file(with_head));
  notes.clear();
  CHECK(strata::models::gpt2::import_hf(path, hub_gpt2::dims(), &notes) == hub.serial);
  CHECK(notes.size() == 2);
  CHECK(notes[0] == "lm_head.weight equals wte (GPT-2 ties them): read once");
  with_head.back().bytes[5] ^= 0x40;
  write_bytes(path, raw_file(with_head));
  CHECK_THROWS_WITH_AS(strata::models::gpt2::import_hf(path, hub_gpt2::dims()),
                       doctest::Contains("tensor 'lm_head.weight' differs from wte at element 1"), st::error);
  std::remove(path.c_str());
}

TEST_CASE("the skipped-tensor note groups names by their layer number") {
  CHECK(st::hf_name_groups({{"a.bias", "F32"}}) == "a.bias (F32)");
  CHECK(st::hf_name_groups({{"h.0.attn.bias", "BOOL"}, {"h.1.attn.bias", "BOOL"}, {"h.10.attn.bias", "BOOL"}}) ==
        "h.{0,1,10}.attn.bias (BOOL)");
  CHECK(st::hf_name_groups({{"h.2.x", "F32"}, {"h.3.x", "F32"}, {"h.4.x", "F32"}, {"y", "I64"}}) ==
        "h.{2..4}.x (F32), y (I64)");
}
