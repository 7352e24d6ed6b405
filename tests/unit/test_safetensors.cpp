// safetensors: a round trip keeps every byte; a bad file is refused with its name and the
// offset; the example GPT-2 exports with Hugging Face's GPT-2 names, shapes and dtypes, and a
// model loaded from the export holds exactly the exported weights.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <strata/parallel/gather.hpp>
#include <strata/strata.hpp>
#include <strata/train/safetensors.hpp>

#include "gpt2/gpt2_hf.hpp"

namespace st = strata;

namespace {

std::string temp_path(const std::string& name) { return "/tmp/strata_test_" + name; }

std::vector<double> weights_of(st::parameter_store<float>& p) {
  return std::vector<double>(p.weights_data(), p.weights_data() + p.size());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

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
  CHECK_THROWS_WITH_AS(st::read_safetensors(path), doctest::Contains("strata_test_bad.safetensors': tensor 'w' has data_offsets [0, 16] outside the 12 data bytes"),
                       st::error);
  // A header length past the end of the file.
  write_bytes(path, std::string("\xff\x00\x00\x00\x00\x00\x00\x00", 8) + "{}");
  CHECK_THROWS_WITH_AS(st::read_safetensors(path), doctest::Contains("the header length at offset 0 says 255 bytes, but the file has 2 after it"),
                       st::error);
  // A header that is not JSON.
  write_bytes(path, std::string("\x04\x00\x00\x00\x00\x00\x00\x00", 8) + "{oops");
  CHECK_THROWS_WITH_AS(st::read_safetensors(path), doctest::Contains("the header (bytes 8 to 12) is not valid JSON"), st::error);
  // A dtype strata does not read.
  write_bytes(path, file_with(R"({"w":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})", "abcd"));
  CHECK_THROWS_WITH_AS(st::read_safetensors(path), doctest::Contains("tensor 'w' has dtype I8"), st::error);
  CHECK_THROWS_WITH_AS(st::read_safetensors(temp_path("missing.safetensors")), doctest::Contains("cannot open"), st::error);
  std::remove(path.c_str());
}

TEST_CASE("the example GPT-2 exports with GPT-2's names and loads back exactly") {
  const gpt2::dims d{.vocab = 50, .seq = 8, .layers = 2, .heads = 2, .d_model = 16};
  // The layout the exporter walks is the model's own flat order.
  st::memory_ledger ledger;
  st::sequential_model<gpt2::model<st::policy<st::host, st::serial, st::fp32>>> a(ledger, d, st::seed{1});
  const auto layout = gpt2::hf_layout(d);
  REQUIRE(layout.size() == a.parameters().entries().size());
  for (std::size_t i = 0; i < layout.size(); ++i) {
    CHECK(layout[i].name == a.parameters().entries()[i].name);
    CHECK(layout[i].numel() == a.parameters().entries()[i].numel);
  }
  const std::string path = temp_path("gpt2.safetensors");
  gpt2::export_hf<float>(path, d, weights_of(a.parameters()));
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
  st::sequential_model<gpt2::model<st::policy<st::host, st::serial, st::fp32>>> b(ledger, d, st::seed{2});
  CHECK(weights_of(b.parameters()) != weights_of(a.parameters()));
  auto& p = b.parameters();
  st::scatter_model_weights(p, std::span<float>(p.weights_data(), std::size_t(p.size())), st::sequential_model<gpt2::model<st::policy<st::host, st::serial, st::fp32>>>::serial_parameters(d),
                            gpt2::import_hf(path, d));
  CHECK(weights_of(b.parameters()) == weights_of(a.parameters()));
  // bf16 models write BF16.
  gpt2::export_hf<st::bf16>(path, d, weights_of(a.parameters()));
  CHECK(st::read_safetensors(path).front().dtype == "BF16");
  // A file for another shape is refused with the tensor and both shapes.
  const gpt2::dims wider{.vocab = 50, .seq = 8, .layers = 2, .heads = 2, .d_model = 32};
  CHECK_THROWS_WITH_AS(gpt2::import_hf(path, wider),
                       doctest::Contains("tensor 'transformer.wte.weight' has shape [50, 16], the model expects [50, 32]"),
                       st::error);
  std::remove(path.c_str());
}
