// Fuzzes the safetensors readers: read_safetensors (a whole file of strata's dtypes, as
// checkpoints are read) and safetensors_reader (the header, then each tensor on demand, as
// Hugging Face files are read). Every tensor that loads is read element by element, so a size
// the header got wrong shows as an out-of-bounds read under the sanitizers.
#include <string>
#include <vector>

#include <strata/train/safetensors.hpp>

#include "mutate.hpp"

namespace st = strata;
namespace fz = strata_fuzz;

namespace {

double touch(const st::named_tensor& t) {
  double sum = 0;
  for (double v : t.values()) sum += v;
  if (t.numel() > 0) sum += t.at(t.numel() - 1);
  return sum;
}

void run(const fz::input& in, const fz::fs::path& work, fz::tally& tl) {
  const std::string path = (work / "model.safetensors").string();
  fz::write_bytes(path, in[0].data);
  tl.attempt("read_safetensors", [&] {
    std::map<std::string, std::string> meta;
    for (const auto& t : st::read_safetensors(path, &meta)) touch(t);
    return true;
  });
  tl.attempt("safetensors_reader", [&] {
    st::safetensors_reader r(path);
    for (const auto& e : r.entries()) {
      if (r.find(e.name) == nullptr) st::fail("fuzz: entry '", e.name, "' not found by its name");
      if (e.convertible()) touch(r.read(e.name));
    }
    return true;
  });
}

// A file from its header text and data bytes, the length prefix as given or computed.
fz::bytes raw_file(const std::string& header, const fz::bytes& data, long long length = -1) {
  const auto n = static_cast<std::uint64_t>(length < 0 ? static_cast<long long>(header.size()) : length);
  fz::bytes b;
  b.reserve(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<unsigned char>(n >> (8 * i)));
  for (char c : header) b.push_back(static_cast<unsigned char>(c));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

void write_corpus(const fz::fs::path& dir) {
  using st::make_tensor;
  const auto save = [&](const std::string& name, const fz::bytes& b) { fz::write_bytes(dir / name, b); };
  save("ok-f32.safetensors", st::encode_safetensors({make_tensor<float>("a", {2, 3}, {1, 2, 3, 4, 5, 6}),
                                                     make_tensor<float>("b", {4}, {-1, 0.5, 1e30, -0.0})}));
  save("ok-mixed-dtypes.safetensors",
       st::encode_safetensors(
           {make_tensor<float>("f32", {2, 2}, {1, 2, 3, 4}), make_tensor<st::bf16>("bf16", {3}, {1, -2, 3.5}),
            make_tensor<st::fp16>("f16", {1, 2}, {0.25, 65504}), make_tensor<double>("f64", {2}, {1e300, -1e-300})},
           {{"format", "pt"}, {"written_by", "strata"}}));
  save("ok-empty-and-scalar.safetensors",
       st::encode_safetensors({make_tensor<float>("empty", {0, 4}, {}), make_tensor<float>("scalar", {}, {7})}));
  save("ok-no-tensors.safetensors", raw_file("{}      ", {}));
  // Not strata's dtypes: safetensors_reader keeps the entries, read_safetensors refuses the file.
  save("ok-bool-mask.safetensors", raw_file(R"({"mask":{"dtype":"BOOL","shape":[2,2],"data_offsets":[0,4]},)"
                                            R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                            {1, 0, 1, 1, 0, 0, 0x80, 0x3f}));
  const fz::bytes eight{0, 0, 0x80, 0x3f, 0, 0, 0, 0x40};
  save("bad-length-past-end.safetensors",
       raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", eight, 1 << 20));
  save("bad-offsets-overlap.safetensors", raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                                   eight));
  save("bad-offsets-gap.safetensors", raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight));
  save("bad-duplicate-key.safetensors", raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                                 R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                                 eight));
  save("bad-fractional-shape.safetensors",
       raw_file(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", eight));
  save("bad-shape-overflow.safetensors",
       raw_file(R"({"a":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,0]}})", {}));
  save("bad-negative-shape.safetensors",
       raw_file(R"({"a":{"dtype":"F32","shape":[-2,-1],"data_offsets":[0,8]}})", eight));
  save("bad-nested-metadata.safetensors",
       raw_file(R"({"__metadata__":{"x":)" + std::string(5000, '[') + std::string(5000, ']') +
                    R"(},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                {0, 0, 0x80, 0x3f}));
  save("bad-not-json.safetensors", raw_file(R"({"a":{"dtype":"F32",)", eight));
  save("bad-short.safetensors", fz::bytes{8, 0, 0});
}

}  // namespace

int main(int argc, char** argv) {
  fz::target t;
  t.name = "safetensors";
  t.run = run;
  t.write_corpus = write_corpus;
  return fz::main(argc, argv, t, (strata_test::program_dir() / "corpus" / "safetensors").string());
}
