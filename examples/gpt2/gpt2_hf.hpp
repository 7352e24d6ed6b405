// examples/gpt2/gpt2_hf.hpp - the example GPT-2's weights as Hugging Face's GPT-2 names them.
//
// strata's parameters in serial order (sequential_model::serial_parameters), each with its name
// in a transformers GPT2LMHeadModel
// safetensors file ("transformer.h.3.attn.c_attn.weight", ...). GPT-2's projections are Conv1D
// layers that store [in, out]; strata's linear layers store [out, in] (PyTorch's nn.Linear), so
// those four weights per block are transposed on the way out and back. The head is tied to
// transformer.wte, as in GPT-2, and is not written. A vocabulary of 50257 with seq 1024 and
// d_model 768 / 12 layers / 12 heads is GPT-2 small: its released weights load as they are.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <strata/train/safetensors.hpp>

#include "gpt2.hpp"

namespace gpt2 {

struct hf_param {
  std::string name, hf_name;
  std::vector<std::int64_t> shape;  // strata's [rows, cols] (or [n])
  bool transposed = false;           // stored [cols, rows] in the file
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
};

// Every parameter of the unsplit model, in its flat (serial) order.
inline std::vector<hf_param> hf_layout(const dims& d) {
  const std::int64_t C = d.d_model, V = d.vocab, T = d.seq, F = d.ffn_width();
  std::vector<hf_param> out{{"wte", "transformer.wte.weight", {V, C}}, {"wpe", "transformer.wpe.weight", {T, C}}};
  for (std::int64_t l = 0; l < d.layers; ++l) {
    const std::string s = "h." + std::to_string(l) + ".", hf = "transformer.h." + std::to_string(l) + ".";
    const std::vector<hf_param> block{
        {s + "ln_1.weight", hf + "ln_1.weight", {C}},           {s + "ln_1.bias", hf + "ln_1.bias", {C}},
        {s + "attn.qkv.weight", hf + "attn.c_attn.weight", {3 * C, C}, true},
        {s + "attn.qkv.bias", hf + "attn.c_attn.bias", {3 * C}},
        {s + "attn.proj.weight", hf + "attn.c_proj.weight", {C, C}, true},
        {s + "attn.proj.bias", hf + "attn.c_proj.bias", {C}},   {s + "ln_2.weight", hf + "ln_2.weight", {C}},
        {s + "ln_2.bias", hf + "ln_2.bias", {C}},               {s + "mlp.fc.weight", hf + "mlp.c_fc.weight", {F, C}, true},
        {s + "mlp.fc.bias", hf + "mlp.c_fc.bias", {F}},         {s + "mlp.proj.weight", hf + "mlp.c_proj.weight", {C, F}, true},
        {s + "mlp.proj.bias", hf + "mlp.c_proj.bias", {C}}};
    out.insert(out.end(), block.begin(), block.end());
  }
  out.push_back({"ln_f.weight", "transformer.ln_f.weight", {C}});
  out.push_back({"ln_f.bias", "transformer.ln_f.bias", {C}});
  return out;
}

// Writes the serial weights as a GPT-2 safetensors file, in storage type T.
template <class T>
void export_hf(const std::string& path, const dims& d, const std::vector<double>& serial) {
  std::vector<st::named_tensor> tensors;
  std::size_t at = 0;
  for (const auto& p : hf_layout(d)) {
    std::vector<double> values(serial.begin() + std::ptrdiff_t(at), serial.begin() + std::ptrdiff_t(at + p.numel()));
    std::vector<std::int64_t> shape = p.shape;
    if (p.transposed) {
      const std::int64_t rows = p.shape[0], cols = p.shape[1];
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) values[std::size_t(c * rows + r)] = serial[at + std::size_t(r * cols + c)];
      shape = {cols, rows};
    }
    tensors.push_back(st::make_tensor<T>(p.hf_name, shape, values));
    at += std::size_t(p.numel());
  }
  STRATA_CHECK(at == serial.size(), "gpt2: exporting ", serial.size(), " weights, the model has ", at);
  write_safetensors(path, tensors, {{"format", "pt"}, {"written_by", "strata"}});
}

// Reads a GPT-2 safetensors file into serial weights for dims `d`; every tensor must be there
// with GPT-2's shape (the error names the file, tensor and shapes). Extra tensors (lm_head.weight,
// attention masks) are ignored.
inline std::vector<double> import_hf(const std::string& path, const dims& d) {
  std::map<std::string, st::named_tensor> by_name;
  for (auto& t : st::read_safetensors(path)) by_name.emplace(t.name, std::move(t));
  std::vector<double> serial;
  for (const auto& p : hf_layout(d)) {
    auto it = by_name.find(p.hf_name);
    STRATA_CHECK(it != by_name.end(), "gpt2: '", path, "' has no tensor '", p.hf_name, "'");
    const auto& t = it->second;
    std::vector<std::int64_t> want = p.shape;
    if (p.transposed) want = {p.shape[1], p.shape[0]};
    auto text = [](const std::vector<std::int64_t>& s) {
      std::string r = "[";
      for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
      return r + "]";
    };
    STRATA_CHECK(t.shape == want, "gpt2: '", path, "': tensor '", p.hf_name, "' has shape ", text(t.shape),
                 ", the model expects ", text(want));
    if (!p.transposed) {
      for (std::int64_t i = 0; i < t.numel(); ++i) serial.push_back(t.at(i));
    } else {
      const std::int64_t rows = p.shape[0], cols = p.shape[1];  // strata's; the file holds [cols, rows]
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) serial.push_back(t.at(c * rows + r));
    }
  }
  return serial;
}

}  // namespace gpt2
