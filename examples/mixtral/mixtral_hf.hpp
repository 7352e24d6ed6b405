// examples/mixtral/mixtral_hf.hpp - the example Mixtral's weights as Hugging Face's
// MixtralForCausalLM checkpoints name them.
//
// The attention and norms as the Llama's (examples/llama/llama_hf.hpp); each block's mixture:
//   mlp.router.weight             [E, C]   block_sparse_moe.gate.weight
//   mlp.experts.e.gate_up.weight  [2F, C]  block_sparse_moe.experts.e.w1 (gate) | .w3 (up)
//   mlp.experts.e.down.weight     [C, F]   block_sparse_moe.experts.e.w2
// Mixtral has no shared expert: a model with one (dims::shared_ffn) is refused, naming it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "../common/hf_names.hpp"
#include "../llama/llama_hf.hpp"

#include "mixtral.hpp"

namespace mixtral {

using llama::hf_param;

// Every parameter of the unsplit model, in its flat (serial) order.
inline std::vector<hf_param> hf_layout(const dims& d) {
  STRATA_CHECK(d.shared_ffn == 0, "mixtral: a shared expert (shared_ffn ", d.shared_ffn,
               ") has no place in a MixtralForCausalLM file");
  const std::int64_t C = d.d_model, V = d.vocab, F = d.ffn_width(), E = d.experts, q = d.heads * d.head_dim(),
                     kv = d.kv() * d.head_dim();
  std::vector<hf_param> out{{"wte", V, C, {{"model.embed_tokens.weight", V}}}};
  for (std::int64_t l = 0; l < d.layers; ++l) {
    const std::string s = "h." + std::to_string(l) + ".",
                      moe = "model.layers." + std::to_string(l) + ".block_sparse_moe.";
    llama::add_attention_params(out, l, C, q, kv);
    out.push_back({s + "mlp.router.weight", E, C, {{moe + "gate.weight", E}}});
    for (std::int64_t e = 0; e < E; ++e) {
      const std::string ex = s + "mlp.experts." + std::to_string(e) + ".",
                        hx = moe + "experts." + std::to_string(e) + ".";
      out.push_back({ex + "gate_up.weight", 2 * F, C, {{hx + "w1.weight", F}, {hx + "w3.weight", F}}});
      out.push_back({ex + "down.weight", C, F, {{hx + "w2.weight", C}}});
    }
  }
  out.push_back({"norm.weight", C, 1, {{"model.norm.weight", C}}});
  if (!d.tied) out.push_back({"lm_head.weight", V, C, {{"lm_head.weight", V}}});
  return out;
}

// Writes the serial weights as a MixtralForCausalLM safetensors file, in storage type T.
template <class T>
void export_hf(const std::string& path, const dims& d, const std::vector<double>& serial) {
  llama::write_layout<T>(path, "mixtral", hf_layout(d), serial);
}

// Reads a MixtralForCausalLM safetensors file into serial weights for dims `d` (names with or
// without the "model." prefix; tensors it does not use are skipped and named in `notes`).
inline std::vector<double> import_hf(const std::string& path, const dims& d,
                                     std::vector<std::string>* notes = nullptr) {
  STRATA_CHECK(!d.tied, "mixtral: importing a tied model is not supported (Mixtral's head is its own)");
  hf_names::hf_file file("mixtral", path, "model.");
  std::vector<double> serial = llama::read_layout(file, hf_layout(d));
  if (notes && !file.skipped_note().empty()) notes->push_back(file.skipped_note());
  return serial;
}

}  // namespace mixtral
