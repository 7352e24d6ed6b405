// strata/models/gpt2_hf.hpp - GPT-2's weights as Hugging Face's GPT-2 names them.
//
// strata's parameters in serial order (sequential_model::serial_parameters), each with its name
// in a transformers GPT2LMHeadModel
// safetensors file ("transformer.h.3.attn.c_attn.weight", ...). GPT-2's projections are Conv1D
// layers that store [in, out]; strata's linear layers store [out, in] (PyTorch's nn.Linear), so
// those four weights per block are transposed on the way out and back. The head is tied to
// transformer.wte, as in GPT-2, and is not written.
//
// import_hf reads the files users hold through the library's rules (strata/train/hf_weights.hpp):
// names with or without the "transformer." prefix (GPT2Model and the released hub `gpt2` file
// have none; a file with both forms of one tensor is refused, naming it); tensors strata does not
// use, of any dtype (BOOL or F32 h.N.attn.bias masks, h.N.attn.masked_bias), skipped and named in
// a note; an lm_head.weight, if there, must equal wte (the head is tied); a position table longer
// than the model's seq is cropped to its first seq rows (as nanoGPT does; said in a note), a
// shorter one refused. A vocabulary of 50257 with d_model 768 / 12 layers / 12 heads and seq up
// to 1024 is GPT-2 small: its released weights load as they are.
#pragma once
#include <string>
#include <vector>

#include <strata/parallel/sequential_model.hpp>
#include <strata/policy/policy.hpp>
#include <strata/train/hf_file.hpp>
#include <strata/train/hf_weights.hpp>

#include "strata/models/gpt2.hpp"

namespace strata::models::gpt2 {

// The rules from strata's parameter names to GPT2LMHeadModel's.
inline st::hf_weight_map hf_map() {
  st::hf_weight_map m("gpt2", "transformer.");
  m.rename("wte", "transformer.wte.weight")
      .add({.param = "wpe", .parts = {"transformer.wpe.weight"}, .crop_rows = true})
      .tie("lm_head.weight", "wte", "GPT-2 ties them");
  for (const char* norm : {"ln_1", "ln_2"})
    for (const char* field : {"weight", "bias"})
      m.rename(std::string("h.{i}.") + norm + "." + field, std::string("transformer.h.{i}.") + norm + "." + field);
  for (const auto& [ours, theirs] : {std::pair{"attn.qkv", "attn.c_attn"}, std::pair{"attn.proj", "attn.c_proj"},
                                     std::pair{"mlp.fc", "mlp.c_fc"}, std::pair{"mlp.proj", "mlp.c_proj"}}) {
    m.transpose(std::string("h.{i}.") + ours + ".weight", std::string("transformer.h.{i}.") + theirs + ".weight");
    m.rename(std::string("h.{i}.") + ours + ".bias", std::string("transformer.h.{i}.") + theirs + ".bias");
  }
  return m.rename("ln_f.weight", "transformer.ln_f.weight").rename("ln_f.bias", "transformer.ln_f.bias");
}

// The unsplit model's parameters in serial order, with their shapes.
inline st::hf_parameter_shapes hf_shapes(const dims& d) {
  return st::sequential_model<model<st::policy<st::host, st::serial, st::fp32>>>::serial_parameter_shapes(d);
}

// Every parameter of the unsplit model, in its flat (serial) order, with its GPT-2 tensor.
inline std::vector<st::hf_parameter> hf_layout(const dims& d) { return hf_map().place(hf_shapes(d)); }

// Writes the serial weights as a GPT-2 safetensors file, in storage type T.
template <class T>
void export_hf(const std::string& path, const dims& d, const std::vector<double>& serial) {
  st::write_hf_weights<T>(path, hf_map(), hf_shapes(d), serial);
}

// Reads a GPT-2 safetensors file into serial weights for dims `d`; every tensor must be there
// with GPT-2's shape (the error names the file, tensor and shapes), except that the position
// table may have more rows than d.seq (the first d.seq are used). `notes`, if given, receives one
// line per thing a user should know: the cropped table, a head found equal to wte, the tensors
// skipped.
inline std::vector<double> import_hf(const std::string& path, const dims& d,
                                     std::vector<std::string>* notes = nullptr) {
  const auto map = hf_map();
  st::hf_file file("gpt2", path, map.prefix());
  // The position table in GPT-2's words, before the rules crop it.
  if (const auto* e = file.find("transformer.wpe.weight"); e && e->shape.size() == 2 && e->shape[1] == d.d_model) {
    const std::int64_t have = e->shape[0];
    STRATA_CHECK(have >= d.seq, "gpt2: '", path, "': tensor '", e->name, "' has ", have,
                 " positions, fewer than --seq ", d.seq, " (a position table can be cropped, not extended)");
    if (have > d.seq && notes)
      notes->push_back("wpe has " + std::to_string(have) + " positions, using the first " + std::to_string(d.seq) +
                       " (--seq " + std::to_string(d.seq) + ")");
  }
  return st::read_hf_weights(file, map, hf_shapes(d), notes);
}

}  // namespace strata::models::gpt2
