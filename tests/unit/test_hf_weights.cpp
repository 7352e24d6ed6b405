// strata/train/hf_weights.hpp: a model's parameters mapped onto a Hugging Face safetensors file by
// rules. A toy model's rules place each parameter (layer and expert indices carried from strata's
// names to the file's, fused tensors stacked by rows, a Conv1D-style matrix transposed, a longer
// table cropped); a file written tensor by tensor here reads into exactly the serial weights the
// rules say, with or without the prefix; every error names what it must, in the exact text; and
// export then import gives the weights back.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <strata/train/hf_weights.hpp>
#include <strata/train/safetensors.hpp>

#include "strata/models/gpt2.hpp"

namespace st = strata;

namespace {

const std::string path = "hf_weights_test.safetensors";

// Two layers: a fused QKV weight and bias (4 query rows, 2 key, 2 value), a projection stored
// transposed, a gate|up pair of equal halves, two experts in layer 0, a position table that may be
// cropped, and a head tied to the embedding.
st::hf_weight_map toy_map() {
  st::hf_weight_map m("toy", "model.");
  m.rename("wte", "model.embed_tokens.weight")
      .add({.param = "wpe", .parts = {"model.wpe.weight"}, .crop_rows = true})
      .stack("h.{i}.attn.qkv.weight",
             {{"model.layers.{i}.q.weight", 4}, {"model.layers.{i}.k.weight", 2}, {"model.layers.{i}.v.weight", 2}})
      .stack("h.{i}.attn.qkv.bias",
             {{"model.layers.{i}.q.bias", 4}, {"model.layers.{i}.k.bias", 2}, {"model.layers.{i}.v.bias", 2}})
      .transpose("h.{i}.attn.proj.weight", "model.layers.{i}.attn.c_proj.weight")
      .stack("h.{i}.mlp.gate_up.weight", {"model.layers.{i}.mlp.gate.weight", "model.layers.{i}.mlp.up.weight"})
      .rename("h.{i}.mlp.experts.{e}.down.weight", "model.layers.{i}.experts.{e}.w2.weight")
      .rename("norm.weight", "model.norm.weight")
      .tie("lm_head.weight", "wte", "the toy ties them");
  return m;
}

st::hf_parameter_shapes toy_params() {
  st::hf_parameter_shapes p{{"wte", {6, 4}}, {"wpe", {3, 4}}};
  for (const std::string l : {"0", "1"}) {
    p.push_back({"h." + l + ".attn.qkv.weight", {8, 4}});
    p.push_back({"h." + l + ".attn.qkv.bias", {8}});
    p.push_back({"h." + l + ".attn.proj.weight", {4, 3}});
    p.push_back({"h." + l + ".mlp.gate_up.weight", {6, 4}});
  }
  p.push_back({"h.0.mlp.experts.0.down.weight", {4, 2}});
  p.push_back({"h.0.mlp.experts.1.down.weight", {4, 2}});
  p.push_back({"norm.weight", {4}});
  return p;
}

// Tensor k of a file: values 100k + i, distinct across the file.
st::named_tensor numbered(const std::string& name, std::vector<std::int64_t> shape, int k) {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  std::vector<double> v(std::size_t(n), 0.0);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 100.0 * k + double(i);
  return st::make_tensor<double>(name, std::move(shape), v);
}

std::vector<double> values_of(const st::named_tensor& t) { return t.values(); }

// The toy's file as transformers would write it (under `prefix`), with `positions` rows of wpe,
// and the serial weights it holds, assembled here tensor by tensor.
struct toy_file {
  std::vector<st::named_tensor> tensors;
  std::vector<double> serial;

  explicit toy_file(const std::string& prefix, std::int64_t positions = 3) {
    int k = 0;
    const auto add = [&](const std::string& name, std::vector<std::int64_t> shape) -> const st::named_tensor& {
      tensors.push_back(numbered(prefix + name, std::move(shape), ++k));
      return tensors.back();
    };
    const auto append = [&](const st::named_tensor& t, std::size_t count = SIZE_MAX) {
      const auto v = values_of(t);
      serial.insert(serial.end(), v.begin(), v.begin() + std::ptrdiff_t(std::min(count, v.size())));
    };
    append(add("embed_tokens.weight", {6, 4}), 24);
    append(add("wpe.weight", {positions, 4}), 12);  // the first 3 rows
    for (const std::string l : {"0", "1"}) {
      const std::string h = "layers." + l + ".";
      for (const char* part : {"q", "k", "v"}) append(add(h + part + ".weight", {part[0] == 'q' ? 4 : 2, 4}));
      for (const char* part : {"q", "k", "v"}) append(add(h + part + ".bias", {part[0] == 'q' ? 4 : 2}));
      // Stored [in 3, out 4]: strata's element (r, c) is the file's (c, r).
      const auto conv = values_of(add(h + "attn.c_proj.weight", {3, 4}));
      for (std::size_t r = 0; r < 4; ++r)
        for (std::size_t c = 0; c < 3; ++c) serial.push_back(conv[c * 4 + r]);
      append(add(h + "mlp.gate.weight", {3, 4}), 12);
      append(add(h + "mlp.up.weight", {3, 4}), 12);
    }
    append(add("layers.0.experts.0.w2.weight", {4, 2}), 8);
    append(add("layers.0.experts.1.w2.weight", {4, 2}), 8);
    append(add("norm.weight", {4}), 4);
  }
};

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const st::error& e) { return e.what(); }
  return "(no error)";
}

std::vector<double> import_toy(std::vector<std::string>* notes = nullptr) {
  return st::read_hf_weights(path, toy_map(), toy_params(), notes);
}

}  // namespace

TEST_CASE("rules place each parameter: layer and expert indices carried, parts stacked, a matrix transposed") {
  const auto placed = toy_map().place(toy_params());
  REQUIRE(placed.size() == toy_params().size());
  std::map<std::string, const st::hf_parameter*> by_name;
  for (const auto& p : placed) by_name[p.name] = &p;
  const auto& qkv = *by_name.at("h.1.attn.qkv.weight");
  REQUIRE(qkv.parts.size() == 3);
  CHECK(qkv.parts[0].name == "model.layers.1.q.weight");
  CHECK(qkv.parts[0].shape == std::vector<std::int64_t>{4, 4});
  CHECK(qkv.parts[1].name == "model.layers.1.k.weight");
  CHECK(qkv.parts[1].shape == std::vector<std::int64_t>{2, 4});
  CHECK(qkv.parts[2].name == "model.layers.1.v.weight");
  CHECK(qkv.parts[2].rows == 2);
  const auto& bias = *by_name.at("h.0.attn.qkv.bias");
  CHECK(bias.parts[1].shape == std::vector<std::int64_t>{2});  // a vector's parts are vectors
  const auto& gate_up = *by_name.at("h.0.mlp.gate_up.weight");
  REQUIRE(gate_up.parts.size() == 2);
  CHECK(gate_up.parts[0].shape == std::vector<std::int64_t>{3, 4});  // equal shares of 6 rows
  CHECK(gate_up.parts[1].name == "model.layers.0.mlp.up.weight");
  const auto& proj = *by_name.at("h.1.attn.proj.weight");
  CHECK(proj.transposed);
  CHECK(proj.shape == std::vector<std::int64_t>{4, 3});
  CHECK(proj.parts[0].name == "model.layers.1.attn.c_proj.weight");
  CHECK(proj.parts[0].shape == std::vector<std::int64_t>{3, 4});  // stored [cols, rows]
  CHECK(by_name.at("h.0.mlp.experts.1.down.weight")->parts[0].name == "model.layers.0.experts.1.w2.weight");
  CHECK(by_name.at("wpe")->crop_rows);
  CHECK(by_name.at("wte")->parts[0].name == "model.embed_tokens.weight");
  // Serial order is the parameters' order, whatever the rules' order.
  for (std::size_t i = 0; i < placed.size(); ++i) CHECK(placed[i].name == toy_params()[i].first);

  // A placeholder matches a whole number, the same one wherever it recurs; the first rule wins.
  st::hf_weight_map m("toy");
  m.rename("x.{i}.y.{i}", "a.{i}").rename("x.{i}.y.{j}", "b.{i}.{j}").rename("x.{i}.y.z", "never");
  const auto p = m.place({{"x.2.y.2", {1}}, {"x.12.y.3", {1}}, {"x.4.y.z", {1}}});
  CHECK(p[0].parts[0].name == "a.2");
  CHECK(p[1].parts[0].name == "b.12.3");
  CHECK(message_of([&] {
          m.place({{"x.y.1", {1}}});
        }) == "toy: no rule maps parameter 'x.y.1' to a Hugging Face tensor");
  CHECK(p[2].parts[0].name == "never");
}

TEST_CASE("a file reads into exactly the serial weights its rules say, with or without the prefix") {
  for (const std::string prefix : {"model.", ""}) {
    const toy_file f(prefix);
    REQUIRE(f.serial.size() == 208);
    st::write_safetensors(path, f.tensors);
    std::vector<std::string> notes;
    CHECK(import_toy(&notes) == f.serial);
    CHECK(notes.empty());
  }
  // A longer table is cropped to the model's rows; unused tensors, of any name, are skipped and
  // named in one note.
  toy_file f("model.", 5);
  f.tensors.push_back(numbered("model.layers.0.rotary.inv_freq", {2}, 90));
  f.tensors.push_back(numbered("model.layers.1.rotary.inv_freq", {2}, 91));
  f.tensors.push_back(numbered("extra", {1}, 92));
  st::write_safetensors(path, f.tensors);
  std::vector<std::string> notes;
  CHECK(import_toy(&notes) == f.serial);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0] == "skipped 3 tensors strata does not use: extra, model.layers.{0..1}.rotary.inv_freq (F64)");
}

TEST_CASE("a tied tensor, when there, must equal its parameter; it is not written") {
  toy_file f("model.");
  auto head = f.tensors.front();  // the embedding's values under the head's name
  head.name = "lm_head.weight";
  f.tensors.push_back(head);
  st::write_safetensors(path, f.tensors);
  std::vector<std::string> notes;
  CHECK(import_toy(&notes) == f.serial);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0] == "lm_head.weight equals wte (the toy ties them): read once");
  f.tensors.back() = st::make_tensor<double>("lm_head.weight", {6, 4}, std::vector<double>(24, 100.0));
  st::write_safetensors(path, f.tensors);
  CHECK(message_of([] { import_toy(); }) ==
        "toy: 'hf_weights_test.safetensors': tensor 'lm_head.weight' differs from wte at element 1 (100 vs 101); "
        "the toy ties them, so an untied one cannot be loaded");
  st::write_hf_weights<double>(path, toy_map(), toy_params(), f.serial);
  const st::safetensors_reader written(path);
  CHECK(written.find("lm_head.weight") == nullptr);
}

TEST_CASE("export then import gives the weights back; the file holds the rules' names and shapes") {
  std::vector<double> serial(208);
  for (std::size_t i = 0; i < serial.size(); ++i) serial[i] = std::sin(0.37 * double(i)) + 0.001 * double(i);
  st::write_hf_weights<double>(path, toy_map(), toy_params(), serial);
  CHECK(import_toy() == serial);
  const st::safetensors_reader file(path);
  CHECK(file.entries().size() == 2 + 2 * (3 + 3 + 1 + 2) + 2 + 1);
  CHECK(file.find("model.layers.1.attn.c_proj.weight")->shape == std::vector<std::int64_t>{3, 4});
  CHECK(file.find("model.layers.0.k.bias")->shape == std::vector<std::int64_t>{2});
  CHECK(file.find("model.layers.0.experts.1.w2.weight")->dtype == "F64");
  CHECK(file.metadata().at("format") == "pt");
  // The transposed matrix: strata's (r, c) = the file's (c, r). h.0.attn.proj.weight starts after
  // wte (24), wpe (12), h.0's qkv (32) and bias (8).
  const auto conv = file.read("model.layers.0.attn.c_proj.weight").values();
  for (std::size_t r = 0; r < 4; ++r)
    for (std::size_t c = 0; c < 3; ++c) CHECK(conv[c * 4 + r] == serial[76 + r * 3 + c]);
  // The k part of h.1's QKV: its rows 4 and 5, after h.0 (76) and h.1's q rows (16).
  const auto k = file.read("model.layers.1.k.weight").values();
  for (std::size_t i = 0; i < 8; ++i) CHECK(k[i] == serial[36 + 76 + 16 + i]);
  // float storage: the weights rounded to float, and those read back exactly.
  st::write_hf_weights<float>(path, toy_map(), toy_params(), serial);
  const auto rounded = import_toy();
  REQUIRE(rounded.size() == serial.size());
  for (std::size_t i = 0; i < serial.size(); ++i) CHECK(rounded[i] == double(float(serial[i])));
  st::write_hf_weights<float>(path, toy_map(), toy_params(), rounded);
  CHECK(import_toy() == rounded);
}

TEST_CASE("a file's errors name the file, the tensor, the shapes or the index") {
  const toy_file good("model.");
  const auto with = [&](const std::function<void(std::vector<st::named_tensor>&)>& change) {
    auto t = good.tensors;
    change(t);
    st::write_safetensors(path, t);
    return message_of([] { import_toy(); });
  };
  const auto find = [](std::vector<st::named_tensor>& t, const std::string& name) -> st::named_tensor& {
    for (auto& x : t)
      if (x.name == name) return x;
    FAIL("no tensor " << name);
    return t.front();
  };
  CHECK(with([](auto& t) { t.pop_back(); }) ==
        "toy: 'hf_weights_test.safetensors' has no tensor 'model.norm.weight' (nor 'norm.weight')");
  CHECK(with([&](auto& t) {
          find(t, "model.layers.1.k.weight") = numbered("model.layers.1.k.weight", {4, 4}, 7);
        }) ==
        "toy: 'hf_weights_test.safetensors': tensor 'model.layers.1.k.weight' has shape [4, 4], the model expects "
        "[2, 4]");
  // The transposed tensor is expected as the file stores it.
  CHECK(with([&](auto& t) {
          find(t, "model.layers.0.attn.c_proj.weight") = numbered("model.layers.0.attn.c_proj.weight", {4, 3}, 7);
        }) ==
        "toy: 'hf_weights_test.safetensors': tensor 'model.layers.0.attn.c_proj.weight' has shape [4, 3], the "
        "model expects [3, 4]");
  CHECK(with([&](auto& t) { t.push_back(numbered("layers.0.q.bias", {4}, 7)); }) ==
        "toy: 'hf_weights_test.safetensors' holds tensor 'layers.0.q.bias' twice, as 'model.layers.0.q.bias' and as "
        "'layers.0.q.bias'; keep one of them");
  CHECK(with([&](auto& t) {
          auto v = values_of(find(t, "model.layers.1.v.bias"));
          v[1] = std::numeric_limits<double>::quiet_NaN();
          find(t, "model.layers.1.v.bias") = st::make_tensor<double>("model.layers.1.v.bias", {2}, v);
        }) ==
        "toy: 'hf_weights_test.safetensors': tensor 'model.layers.1.v.bias' holds nan at flat index 1 of its 2 "
        "values; weights must be finite numbers");
  CHECK(with([&](auto& t) {
          auto v = values_of(find(t, "model.embed_tokens.weight"));
          v[13] = -std::numeric_limits<double>::infinity();
          find(t, "model.embed_tokens.weight") = st::make_tensor<double>("model.embed_tokens.weight", {6, 4}, v);
        }) ==
        "toy: 'hf_weights_test.safetensors': tensor 'model.embed_tokens.weight' holds -inf at flat index 13 of "
        "its 24 values; weights must be finite numbers");
  CHECK(with([&](auto& t) {
          find(t, "model.wpe.weight") = numbered("model.wpe.weight", {2, 4}, 7);
        }) ==
        "toy: 'hf_weights_test.safetensors': tensor 'model.wpe.weight' has 2 rows, fewer than the model's 3 (a "
        "tensor can be cropped, not extended)");
  // A name without the prefix is looked for as it is.
  st::hf_weight_map head("toy", "model.");
  head.rename("lm_head.weight", "lm_head.weight");
  st::write_safetensors(path, good.tensors);
  CHECK(message_of([&] {
          st::read_hf_weights(path, head, {{"lm_head.weight", {6, 4}}});
        }) == "toy: 'hf_weights_test.safetensors' has no tensor 'lm_head.weight'");
  // Exporting the wrong number of weights.
  CHECK(message_of([] { st::write_hf_weights<float>(path, toy_map(), toy_params(), std::vector<double>(207)); }) ==
        "toy: exporting 207 weights, the model has 208");
}

TEST_CASE("rules that cannot make a parameter are refused, naming it") {
  const auto place = [](const st::hf_weight_map& m, const st::hf_parameter_shapes& p) {
    return message_of([&] { m.place(p); });
  };
  st::hf_weight_map rows("toy");
  rows.stack("qkv", {{"q", 4}, {"k", 2}, {"v", 2}});
  CHECK(place(rows, {{"qkv", {6, 4}}}) ==
        "toy: parameter 'qkv' of shape [6, 4] has 6 rows; its rule's 3 tensors give 8");
  st::hf_weight_map shares("toy");
  shares.stack("w", {{"a", 1}, "b", "c"});
  CHECK(place(shares, {{"w", {6, 4}}}) ==
        "toy: parameter 'w' of shape [6, 4] has 6 rows; its rule's tensors give 1, and the 5 left do not make 2 equal "
        "shares");
  CHECK(shares.place({{"w", {5, 4}}})[0].parts[2].shape == std::vector<std::int64_t>{2, 4});
  st::hf_weight_map vec("toy");
  vec.transpose("b", "b");
  CHECK(place(vec, {{"b", {4}}}) == "toy: parameter 'b' of shape [4] is not a matrix; its rule transposes it");
  st::hf_weight_map twice("toy");
  twice.rename("a", "t").rename("b", "t");
  CHECK(place(twice, {{"a", {2}}, {"b", {2}}}) == "toy: parameters 'a' and 'b' both map to tensor 't'");
  st::hf_weight_map tied("toy");
  tied.rename("a", "t").tie("t", "a", "tied");
  CHECK(place(tied, {{"a", {2}}}) == "toy: tensor 't' is tied to parameter 'a' and also makes parameter 'a'");
  st::hf_weight_map lost("toy");
  lost.rename("a", "t").tie("head", "b", "tied");
  st::write_safetensors(path, {st::make_tensor<float>("t", {2}, {1, 2})});
  CHECK(message_of([&] {
          st::read_hf_weights(path, lost, {{"a", {2}}});
        }) == "toy: tensor 'head' is tied to parameter 'b', which the model does not have");
  // Rules themselves.
  st::hf_weight_map m("toy");
  CHECK(message_of([&] { m.rename("h.{i}.w", "layers.{j}.w"); }) ==
        "toy: the rule for 'h.{i}.w' names tensor 'layers.{j}.w', whose {j} the parameter's pattern does not have");
  CHECK(message_of([&] { m.rename("h.{i.w", "x"); }) ==
        "toy: pattern 'h.{i.w': the '{' at offset 2 needs a name and a '}' after it");
  CHECK(message_of([&] {
          m.add({.param = "w", .parts = {"a", "b"}, .crop_rows = true});
        }) == "toy: the rule for 'w' crops rows; only one untransposed tensor can be cropped");
  CHECK(message_of([&] { m.stack("w", {}); }) == "toy: the rule for 'w' names no tensor");
  CHECK(m.rules().empty());
}

TEST_CASE("a model's serial parameter shapes are its serial parameters, with their whole shapes") {
  using M = st::sequential_model<strata::models::gpt2::model<st::policy<st::host, st::serial, st::fp32>>>;
  const strata::models::gpt2::dims d{.vocab = 50, .seq = 8, .layers = 2, .heads = 2, .d_model = 16};
  const auto shapes = M::serial_parameter_shapes(d);
  const auto params = M::serial_parameters(d);
  REQUIRE(shapes.size() == params.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    CHECK(shapes[i].first == params[i].first);
    CHECK(shapes[i].second.numel() == params[i].second);
  }
  CHECK(shapes[0].first == "wte");
  CHECK(shapes[0].second == st::shape{50, 16});
  CHECK(shapes[4].first == "h.0.attn.qkv.weight");
  CHECK(shapes[4].second == st::shape{48, 16});  // [out, in]
}
