// strata/models/neox.hpp - a GPT-NeoX / Pythia-shaped model declared from strata's layers alone
// (no layer of its own): the attention and block variants of layers/ working together.
//
// GPT-NeoX's architecture: a token embedding with no position table; blocks with a parallel
// residual (y = x + attn(ln_1(x)) + mlp(ln_2(x))), LayerNorm with biases, attention with biases,
// its fused query_key_value weight's rows per head ([heads, 3, d]) and rotary positions on the
// first quarter of each head; an MLP with exact (erf) GELU; a final LayerNorm; an untied LM head.
// hf_map gives each strata parameter GPTNeoXForCausalLM's name: the layouts agree, so the weights
// load without transposes or permutations.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include <strata/layers/embedding.hpp>
#include <strata/layers/layernorm.hpp>
#include <strata/layers/lm_head.hpp>
#include <strata/layers/sequential.hpp>
#include <strata/layers/transformer_block.hpp>
#include <strata/train/hf_weights.hpp>

namespace strata::models::neox {
namespace st = strata;

struct dims {
  std::int64_t vocab = 64, seq = 8, layers = 2, heads = 2, d_model = 32, ffn = 128;
  double rope_theta = 10000.0, rotary_fraction = 0.25, norm_eps = 1e-5;
  // GPT-NeoX's variants, settable so that a test can show each one matters.
  st::qkv_layout fused_qkv = st::qkv_layout::per_head;
  st::activation act = st::activation::gelu_exact;
  bool parallel_residual = true;
};

template <class P>
struct model {
  using policy = P;
  using config = dims;

  static constexpr auto layers(const dims& d) {
    return st::sequential(st::layer<st::embedding<P>>("", {.vocab = d.vocab, .max_seq = 0, .channels = d.d_model}),
                          st::blocks<st::transformer_block<P>>("h", d.layers,
                                                               {.channels = d.d_model,
                                                                .heads = d.heads,
                                                                .hidden = d.ffn,
                                                                .eps = d.norm_eps,
                                                                .rope_theta = d.rope_theta,
                                                                .rotary_fraction = d.rotary_fraction,
                                                                .fused_qkv = d.fused_qkv,
                                                                .ffn_activation = d.act,
                                                                .parallel_residual = d.parallel_residual}),
                          st::layer<st::layernorm<P>>("ln_f", {.channels = d.d_model, .eps = d.norm_eps}),
                          st::layer<st::lm_head<P>>("lm_head", {.vocab = d.vocab, .channels = d.d_model}));
  }
  static nlohmann::json describe(const dims& d) {
    return {{"family", "gpt-neox"},
            {"layers", d.layers},
            {"heads", d.heads},
            {"d_model", d.d_model},
            {"ffn", d.ffn},
            {"seq", d.seq},
            {"vocab", d.vocab},
            {"rope_theta", d.rope_theta},
            {"rotary_fraction", d.rotary_fraction},
            {"norm_eps", d.norm_eps},
            {"per_head_qkv", d.fused_qkv == st::qkv_layout::per_head},
            {"activation", st::activation_name(d.act)},
            {"parallel_residual", d.parallel_residual}};
  }
};

// GPTNeoXForCausalLM's names of the parameters, as rules (train/hf_weights.hpp): renames only, the
// layouts agree. `before` goes in front of every file name (the fixture's "grad." tensors).
inline st::hf_weight_map hf_map(const std::string& before = "") {
  const std::string n = before + "gpt_neox.";
  st::hf_weight_map m("gpt-neox", before.empty() ? "gpt_neox." : "");
  m.rename("wte", n + "embed_in.weight").rename("lm_head.weight", before + "lm_head.weight");
  for (const std::string x : {"weight", "bias"}) {
    m.rename("ln_f." + x, n + "final_layer_norm." + x)
        .rename("h.{i}.ln_1." + x, n + "layers.{i}.input_layernorm." + x)
        .rename("h.{i}.ln_2." + x, n + "layers.{i}.post_attention_layernorm." + x)
        .rename("h.{i}.attn.qkv." + x, n + "layers.{i}.attention.query_key_value." + x)
        .rename("h.{i}.attn.proj." + x, n + "layers.{i}.attention.dense." + x)
        .rename("h.{i}.mlp.fc." + x, n + "layers.{i}.mlp.dense_h_to_4h." + x)
        .rename("h.{i}.mlp.proj." + x, n + "layers.{i}.mlp.dense_4h_to_h." + x);
  }
  return m;
}

}  // namespace strata::models::neox
