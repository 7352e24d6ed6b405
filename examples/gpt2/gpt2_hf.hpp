// examples/gpt2/gpt2_hf.hpp - the example GPT-2's weights as Hugging Face's GPT-2 names them.
//
// strata's parameters in serial order (sequential_model::serial_parameters), each with its name
// in a transformers GPT2LMHeadModel
// safetensors file ("transformer.h.3.attn.c_attn.weight", ...). GPT-2's projections are Conv1D
// layers that store [in, out]; strata's linear layers store [out, in] (PyTorch's nn.Linear), so
// those four weights per block are transposed on the way out and back. The head is tied to
// transformer.wte, as in GPT-2, and is not written.
//
// import_hf reads the files users hold (examples/common/hf_names.hpp finds the names): names with
// or without the "transformer." prefix (GPT2Model and the released hub `gpt2` file have none; a
// file with both forms of one tensor is refused, naming it); tensors strata does not use, of any
// dtype (BOOL or F32 h.N.attn.bias masks, h.N.attn.masked_bias), skipped and named in a note; an
// lm_head.weight, if there, must equal wte (the head is tied); a position table longer than the
// model's seq is cropped to its first seq rows (as nanoGPT does; said in a note), a shorter one
// refused. A vocabulary of 50257 with d_model 768 / 12 layers / 12 heads and seq up to 1024 is
// GPT-2 small: its released weights load as they are.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <strata/train/safetensors.hpp>

#include "../common/hf_names.hpp"

#include "gpt2.hpp"

namespace gpt2 {

struct hf_param {
  std::string name, hf_name;
  std::vector<std::int64_t> shape;  // strata's [rows, cols] (or [n])
  bool transposed = false;          // stored [cols, rows] in the file
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
    const std::vector<hf_param> block{{s + "ln_1.weight", hf + "ln_1.weight", {C}},
                                      {s + "ln_1.bias", hf + "ln_1.bias", {C}},
                                      {s + "attn.qkv.weight", hf + "attn.c_attn.weight", {3 * C, C}, true},
                                      {s + "attn.qkv.bias", hf + "attn.c_attn.bias", {3 * C}},
                                      {s + "attn.proj.weight", hf + "attn.c_proj.weight", {C, C}, true},
                                      {s + "attn.proj.bias", hf + "attn.c_proj.bias", {C}},
                                      {s + "ln_2.weight", hf + "ln_2.weight", {C}},
                                      {s + "ln_2.bias", hf + "ln_2.bias", {C}},
                                      {s + "mlp.fc.weight", hf + "mlp.c_fc.weight", {F, C}, true},
                                      {s + "mlp.fc.bias", hf + "mlp.c_fc.bias", {F}},
                                      {s + "mlp.proj.weight", hf + "mlp.c_proj.weight", {C, F}, true},
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
        for (std::int64_t c = 0; c < cols; ++c)
          values[std::size_t(c * rows + r)] = serial[at + std::size_t(r * cols + c)];
      shape = {cols, rows};
    }
    tensors.push_back(st::make_tensor<T>(p.hf_name, shape, values));
    at += std::size_t(p.numel());
  }
  STRATA_CHECK(at == serial.size(), "gpt2: exporting ", serial.size(), " weights, the model has ", at);
  write_safetensors(path, tensors, {{"format", "pt"}, {"written_by", "strata"}});
}

// Reads a GPT-2 safetensors file into serial weights for dims `d`; every tensor must be there
// with GPT-2's shape (the error names the file, tensor and shapes), except that the position
// table may have more rows than d.seq (the first d.seq are used). `notes`, if given, receives one
// line per thing a user should know: the cropped table, a head found equal to wte, the tensors
// skipped.
inline std::vector<double> import_hf(const std::string& path, const dims& d,
                                     std::vector<std::string>* notes = nullptr) {
  hf_names::hf_file file("gpt2", path, "transformer.");
  std::vector<double> serial;
  for (const auto& p : hf_layout(d)) {
    const std::vector<std::int64_t> want = p.transposed ? std::vector<std::int64_t>{p.shape[1], p.shape[0]} : p.shape;
    const bool positions = p.name == "wpe";
    const auto t = file.read(p.hf_name, want, positions);
    if (positions) {
      const std::int64_t have = t.shape[0];
      STRATA_CHECK(have >= d.seq, "gpt2: '", path, "': tensor '", t.name, "' has ", have,
                   " positions, fewer than --seq ", d.seq, " (a position table can be cropped, not extended)");
      if (have > d.seq && notes)
        notes->push_back("wpe has " + std::to_string(have) + " positions, using the first " + std::to_string(d.seq) +
                         " (--seq " + std::to_string(d.seq) + ")");
      for (std::int64_t i = 0; i < p.numel(); ++i) serial.push_back(t.at(i));  // the first d.seq rows
    } else if (!p.transposed) {
      for (std::int64_t i = 0; i < t.numel(); ++i) serial.push_back(t.at(i));
    } else {
      const std::int64_t rows = p.shape[0], cols = p.shape[1];  // strata's; the file holds [cols, rows]
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) serial.push_back(t.at(c * rows + r));
    }
  }
  // The head is tied to wte (serial's first V x C weights): a file's own copy must be the same.
  if (file.find("lm_head.weight") != nullptr) {
    const auto head = file.read("lm_head.weight", {d.vocab, d.d_model});
    for (std::int64_t i = 0; i < head.numel(); ++i)
      STRATA_CHECK(head.at(i) == serial[std::size_t(i)], "gpt2: '", path,
                   "': tensor 'lm_head.weight' differs from wte "
                   "at element ",
                   i, " (", head.at(i), " vs ", serial[std::size_t(i)],
                   "); strata's GPT-2 ties its head "
                   "to wte and cannot load an untied one");
    if (notes) notes->push_back("lm_head.weight equals wte (GPT-2 ties them): read once");
  }
  if (notes && !file.skipped_note().empty()) notes->push_back(file.skipped_note());
  return serial;
}

}  // namespace gpt2
