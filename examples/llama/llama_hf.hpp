// examples/llama/llama_hf.hpp - the example Llama's weights as Hugging Face's LlamaForCausalLM
// names them.
//
// strata's parameters in serial order (sequential_model::serial_parameters), each with the
// tensors it is made of in a transformers safetensors file. Both store linear weights [out, in]
// (nn.Linear), and transformers keeps q_proj and k_proj in the rotate-half order strata's rotary
// embedding uses, so nothing is transposed or permuted; strata's fused weights are their Hugging
// Face parts stacked by rows: attn.qkv = q_proj | k_proj | v_proj, mlp.gate_up = gate_proj |
// up_proj. A tied head (dims::tied) is not written, as transformers omits it.
//
// import_hf reads names with or without the "model." prefix (LlamaModel files have none; both
// forms of one tensor are refused, naming it) and skips, naming them in a note, the tensors it
// does not use, of any dtype (rotary inv_freq buffers, ...): examples/common/hf_names.hpp. A tied
// model reads no head of its own; an lm_head.weight in the file must then equal the embedding.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <strata/train/safetensors.hpp>

#include "../common/hf_names.hpp"

#include "llama.hpp"

namespace llama {

// One strata parameter [rows, cols] (cols = 1 for a vector): Hugging Face tensors stacked by rows.
struct hf_param {
  std::string name;
  std::int64_t rows = 0, cols = 1;
  std::vector<std::pair<std::string, std::int64_t>> parts;  // (Hugging Face name, rows)
  std::int64_t numel() const { return rows * cols; }
};

// Block l's attention and norms (C wide, q query and kv key/value features), appended to `out`:
// the parameters every family built on the Llama's block shares.
inline void add_attention_params(std::vector<hf_param>& out, std::int64_t l, std::int64_t C, std::int64_t q,
                                 std::int64_t kv) {
  const std::string s = "h." + std::to_string(l) + ".", hf = "model.layers." + std::to_string(l) + ".";
  out.push_back({s + "ln_1.weight", C, 1, {{hf + "input_layernorm.weight", C}}});
  out.push_back({s + "attn.qkv.weight",
                 q + 2 * kv,
                 C,
                 {{hf + "self_attn.q_proj.weight", q},
                  {hf + "self_attn.k_proj.weight", kv},
                  {hf + "self_attn.v_proj.weight", kv}}});
  out.push_back({s + "attn.proj.weight", C, q, {{hf + "self_attn.o_proj.weight", C}}});
  out.push_back({s + "ln_2.weight", C, 1, {{hf + "post_attention_layernorm.weight", C}}});
}

// Every parameter of the unsplit model, in its flat (serial) order.
inline std::vector<hf_param> hf_layout(const dims& d) {
  const std::int64_t C = d.d_model, V = d.vocab, F = d.ffn_width(), q = d.heads * d.head_dim(),
                     kv = d.kv() * d.head_dim();
  std::vector<hf_param> out{{"wte", V, C, {{"model.embed_tokens.weight", V}}}};
  for (std::int64_t l = 0; l < d.layers; ++l) {
    const std::string s = "h." + std::to_string(l) + ".", hf = "model.layers." + std::to_string(l) + ".";
    add_attention_params(out, l, C, q, kv);
    out.push_back(
        {s + "mlp.gate_up.weight", 2 * F, C, {{hf + "mlp.gate_proj.weight", F}, {hf + "mlp.up_proj.weight", F}}});
    out.push_back({s + "mlp.down.weight", C, F, {{hf + "mlp.down_proj.weight", C}}});
  }
  out.push_back({"norm.weight", C, 1, {{"model.norm.weight", C}}});
  if (!d.tied) out.push_back({"lm_head.weight", V, C, {{"lm_head.weight", V}}});
  return out;
}

// Writes serial weights as the tensors of `layout`, in storage type T ("llama" or another family
// built on the same layout names itself in the messages).
template <class T>
void write_layout(const std::string& path, const char* model, const std::vector<hf_param>& layout,
                  const std::vector<double>& serial) {
  std::vector<st::named_tensor> tensors;
  std::size_t at = 0;
  for (const auto& p : layout) {
    for (const auto& [hf_name, rows] : p.parts) {
      const auto n = std::size_t(rows * p.cols);
      STRATA_CHECK(at + n <= serial.size(), model, ": exporting ", serial.size(), " weights, the model has more");
      std::vector<double> values(serial.begin() + std::ptrdiff_t(at), serial.begin() + std::ptrdiff_t(at + n));
      std::vector<std::int64_t> shape{rows};
      if (p.cols > 1) shape.push_back(p.cols);
      tensors.push_back(st::make_tensor<T>(hf_name, shape, values));
      at += n;
    }
  }
  STRATA_CHECK(at == serial.size(), model, ": exporting ", serial.size(), " weights, the model has ", at);
  write_safetensors(path, tensors, {{"format", "pt"}, {"written_by", "strata"}});
}

// Reads the tensors of `layout` from `file`, stacked into serial weights; each must be there with
// its shape (the error names the file, tensor and shapes).
inline std::vector<double> read_layout(hf_names::hf_file& file, const std::vector<hf_param>& layout) {
  std::vector<double> serial;
  for (const auto& p : layout) {
    for (const auto& [hf_name, rows] : p.parts) {
      std::vector<std::int64_t> want{rows};
      if (p.cols > 1) want.push_back(p.cols);
      const auto t = file.read(hf_name, want);
      for (std::int64_t i = 0; i < t.numel(); ++i) serial.push_back(t.at(i));
    }
  }
  return serial;
}

// Writes the serial weights as a LlamaForCausalLM safetensors file, in storage type T.
template <class T>
void export_hf(const std::string& path, const dims& d, const std::vector<double>& serial) {
  write_layout<T>(path, "llama", hf_layout(d), serial);
}

// Reads a LlamaForCausalLM safetensors file into serial weights for dims `d`; every tensor must be
// there with Llama's shape (the error names the file, tensor and shapes). Other tensors are
// skipped (`notes`, if given, names them in one line); a tied model reads no lm_head.weight, and
// one in the file must equal model.embed_tokens.weight.
inline std::vector<double> import_hf(const std::string& path, const dims& d,
                                     std::vector<std::string>* notes = nullptr) {
  hf_names::hf_file file("llama", path, "model.");
  std::vector<double> serial = read_layout(file, hf_layout(d));
  if (d.tied && file.find("lm_head.weight") != nullptr) {
    const auto head = file.read("lm_head.weight", {d.vocab, d.d_model});
    for (std::int64_t i = 0; i < head.numel(); ++i)
      STRATA_CHECK(head.at(i) == serial[std::size_t(i)], "llama: '", path,
                   "': tensor 'lm_head.weight' differs from "
                   "model.embed_tokens.weight at element ",
                   i, " (", head.at(i), " vs ", serial[std::size_t(i)],
                   "); the model is tied (dims::tied) and cannot load an untied head");
    if (notes) notes->push_back("lm_head.weight equals model.embed_tokens.weight (the model is tied): read once");
  }
  if (notes && !file.skipped_note().empty()) notes->push_back(file.skipped_note());
  return serial;
}

}  // namespace llama
