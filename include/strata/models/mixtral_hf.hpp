// strata/models/mixtral_hf.hpp - the Mixtral's weights as Hugging Face's
// MixtralForCausalLM checkpoints name them.
//
// The attention and norms as the Llama's (llama_hf.hpp); each block's mixture:
//   mlp.router.weight             [E, C]   block_sparse_moe.gate.weight
//   mlp.experts.e.gate_up.weight  [2F, C]  block_sparse_moe.experts.e.w1 (gate) | .w3 (up)
//   mlp.experts.e.down.weight     [C, F]   block_sparse_moe.experts.e.w2
// Mixtral has no shared expert: a model with one (dims::shared_ffn) is refused, naming it.
#pragma once
#include <string>
#include <vector>

#include <strata/parallel/sequential_model.hpp>
#include <strata/policy/policy.hpp>
#include <strata/train/hf_weights.hpp>

#include "strata/models/llama_hf.hpp"

#include "strata/models/mixtral.hpp"

namespace strata::models::mixtral {

// The rules from strata's parameter names to MixtralForCausalLM's.
inline st::hf_weight_map hf_map(const dims& d) {
  STRATA_CHECK(d.shared_ffn == 0, "mixtral: a shared expert (shared_ffn ", d.shared_ffn,
               ") has no place in a MixtralForCausalLM file");
  auto m = strata::models::llama::embedding_rules("mixtral", d.tied);
  strata::models::llama::add_attention_rules(m, d.heads * d.head_dim(), d.kv() * d.head_dim());
  const std::string moe = "model.layers.{i}.block_sparse_moe.";
  return m.rename("h.{i}.mlp.router.weight", moe + "gate.weight")
      .stack("h.{i}.mlp.experts.{e}.gate_up.weight", {moe + "experts.{e}.w1.weight", moe + "experts.{e}.w3.weight"})
      .rename("h.{i}.mlp.experts.{e}.down.weight", moe + "experts.{e}.w2.weight");
}

// The unsplit model's parameters in serial order, with their shapes.
inline st::hf_parameter_shapes hf_shapes(const dims& d) {
  return st::sequential_model<model<st::policy<st::host, st::serial, st::fp32>>>::serial_parameter_shapes(d);
}

// Every parameter of the unsplit model, in its flat (serial) order, with the tensors it is made of.
inline std::vector<st::hf_parameter> hf_layout(const dims& d) { return hf_map(d).place(hf_shapes(d)); }

// Writes the serial weights as a MixtralForCausalLM safetensors file, in storage type T.
template <class T>
void export_hf(const std::string& path, const dims& d, const std::vector<double>& serial) {
  st::write_hf_weights<T>(path, hf_map(d), hf_shapes(d), serial);
}

// Reads a MixtralForCausalLM safetensors file into serial weights for dims `d` (names with or
// without the "model." prefix; tensors it does not use are skipped and named in `notes`).
inline std::vector<double> import_hf(const std::string& path, const dims& d,
                                     std::vector<std::string>* notes = nullptr) {
  STRATA_CHECK(!d.tied, "mixtral: importing a tied model is not supported (Mixtral's head is its own)");
  return st::read_hf_weights(path, hf_map(d), hf_shapes(d), notes);
}

}  // namespace strata::models::mixtral
