// strata/models/llama_hf.hpp - the Llama's weights as Hugging Face's LlamaForCausalLM
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
// does not use, of any dtype (rotary inv_freq buffers, ...): the library's rules
// (strata/train/hf_weights.hpp) do it all. A tied model reads no head of its own; an
// lm_head.weight in the file must then equal the embedding.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <strata/parallel/sequential_model.hpp>
#include <strata/policy/policy.hpp>
#include <strata/train/hf_weights.hpp>

#include "strata/models/llama.hpp"

namespace strata::models::llama {

// The attention and norms of every block (q query and kv key/value features), added to `m`: the
// rules every family built on the Llama's block shares.
inline st::hf_weight_map& add_attention_rules(st::hf_weight_map& m, std::int64_t q, std::int64_t kv) {
  return m.rename("h.{i}.ln_1.weight", "model.layers.{i}.input_layernorm.weight")
      .stack("h.{i}.attn.qkv.weight", {{"model.layers.{i}.self_attn.q_proj.weight", q},
                                       {"model.layers.{i}.self_attn.k_proj.weight", kv},
                                       {"model.layers.{i}.self_attn.v_proj.weight", kv}})
      .rename("h.{i}.attn.proj.weight", "model.layers.{i}.self_attn.o_proj.weight")
      .rename("h.{i}.ln_2.weight", "model.layers.{i}.post_attention_layernorm.weight");
}

// The embedding, final norm and head: `family` ("llama") names the messages; a tied head is
// checked against the embedding when a file holds one.
inline st::hf_weight_map embedding_rules(const char* family, bool tied) {
  st::hf_weight_map m(family, "model.");
  m.rename("wte", "model.embed_tokens.weight").rename("norm.weight", "model.norm.weight");
  if (tied) m.tie("lm_head.weight", "wte", "the model is tied");
  else m.rename("lm_head.weight", "lm_head.weight");
  return m;
}

// The rules from strata's parameter names to LlamaForCausalLM's.
inline st::hf_weight_map hf_map(const dims& d) {
  auto m = embedding_rules("llama", d.tied);
  add_attention_rules(m, d.heads * d.head_dim(), d.kv() * d.head_dim());
  return m
      .stack("h.{i}.mlp.gate_up.weight",
             {"model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.up_proj.weight"})
      .rename("h.{i}.mlp.down.weight", "model.layers.{i}.mlp.down_proj.weight");
}

// The unsplit model's parameters in serial order, with their shapes.
inline st::hf_parameter_shapes hf_shapes(const dims& d) {
  return st::sequential_model<model<st::policy<st::host, st::serial, st::fp32>>>::serial_parameter_shapes(d);
}

// Every parameter of the unsplit model, in its flat (serial) order, with the tensors it is made of.
inline std::vector<st::hf_parameter> hf_layout(const dims& d) { return hf_map(d).place(hf_shapes(d)); }

// Writes the serial weights as a LlamaForCausalLM safetensors file, in storage type T.
template <class T>
void export_hf(const std::string& path, const dims& d, const std::vector<double>& serial) {
  st::write_hf_weights<T>(path, hf_map(d), hf_shapes(d), serial);
}

// Reads a LlamaForCausalLM safetensors file into serial weights for dims `d`; every tensor must be
// there with Llama's shape (the error names the file, tensor and shapes). Other tensors are
// skipped (`notes`, if given, names them in one line); a tied model reads no lm_head.weight, and
// one in the file must equal model.embed_tokens.weight.
inline std::vector<double> import_hf(const std::string& path, const dims& d,
                                     std::vector<std::string>* notes = nullptr) {
  return st::read_hf_weights(path, hf_map(d), hf_shapes(d), notes);
}

}  // namespace strata::models::llama
