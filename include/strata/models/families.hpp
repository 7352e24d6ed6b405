// strata/models/families.hpp - the models of strata/models as programs take them: a shape from
// flags, the declaration to build, and the shape in words and JSON.
//
// gpt2_train (examples/gpt2/train_run.hpp) trains a family's model and strata-plan
// (tools/strata-plan.cpp) plans it; both are templates on the family. Each program fills a
// model_shape from its own flags (gpt2_train's --d-model is strata-plan's --hidden) and checks
// them in its own words; the family takes the fields its model has. The export and import of its
// weights under Hugging Face's names are families_hf.hpp's, which only gpt2_train includes:
// strata-plan never reads the safetensors code.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "strata/models/gpt2.hpp"
#include "strata/models/llama.hpp"
#include "strata/models/mixtral.hpp"
#include "strata/models/neox.hpp"

namespace strata::models {

// The shape flags of every family.
struct model_shape {
  std::int64_t vocab = 0, seq = 0, layers = 0, heads = 0, d_model = 0;
  std::int64_t ffn = 0;                          // 0: the model's own rule (GPT-2 4 x d_model, Llama 8/3 x d_model)
  std::int64_t kv_heads = 0;                     // Llama: 0 as many as heads
  double rope_theta = 10000.0, norm_eps = 1e-5;  // Llama
  bool tied = false;                             // Llama: the head shares the embedding's table (GPT-2's always does)
  std::int64_t experts = 8, top_k = 2;           // Mixtral: experts per block, and per token
  std::int64_t shared_ffn = 0;                   // Mixtral: a shared expert's width (0: none)
  double balance_coef = 0.01, z_coef = 0.0;      // Mixtral: the router's auxiliary losses' coefficients
  double capacity_factor = 0.0;                  // Mixtral: 0 dropless
};

// One family per model of strata/models, named as programs take them (--model).
inline constexpr const char* model_names[] = {"gpt2", "llama", "mixtral", "neox"};

// GPT-2 (gpt2.hpp): learned positions, multi-head attention, a GELU MLP of width
// ffn (default 4 x d_model), a head tied to the embedding.
struct gpt2_family {
  static constexpr const char* name = "gpt2";
  static constexpr const char* hf_class = "GPT2LMHeadModel";  // the transformers class of its weights
  using dims = strata::models::gpt2::dims;
  template <class P>
  using model = strata::models::gpt2::model<P>;

  static dims shape(const model_shape& s) {
    return {.vocab = s.vocab, .seq = s.seq, .layers = s.layers, .heads = s.heads, .d_model = s.d_model, .ffn = s.ffn};
  }
  static std::string shape_text(const dims& m) {
    return "GPT: " + std::to_string(m.layers) + " layers, hidden " + std::to_string(m.d_model) + ", " +
           std::to_string(m.heads) + " heads, FFN " + std::to_string(m.ffn_width()) + ", seq " + std::to_string(m.seq) +
           ", vocab " + std::to_string(m.vocab);
  }
  static nlohmann::ordered_json shape_json(const dims& m) {
    return {{"layers", m.layers}, {"hidden", m.d_model}, {"heads", m.heads}, {"ffn", m.ffn_width()},
            {"seq", m.seq},       {"vocab", m.vocab},    {"tied", true}};
  }
};

// Llama (llama.hpp): rotary positions, grouped-query attention with kv_heads
// key/value heads (default: as many as heads), SwiGLU of width ffn (default 8/3 x d_model
// rounded up to 32), RMSNorm, a head of its own unless tied.
struct llama_family {
  static constexpr const char* name = "llama";
  static constexpr const char* hf_class = "LlamaForCausalLM";
  using dims = strata::models::llama::dims;
  template <class P>
  using model = strata::models::llama::model<P>;

  static dims shape(const model_shape& s) {
    return {.vocab = s.vocab,
            .seq = s.seq,
            .layers = s.layers,
            .heads = s.heads,
            .d_model = s.d_model,
            .kv_heads = s.kv_heads,
            .ffn = s.ffn,
            .rope_theta = s.rope_theta,
            .norm_eps = s.norm_eps,
            .tied = s.tied};
  }
  static std::string shape_text(const dims& m) {
    return "Llama: " + std::to_string(m.layers) + " layers, hidden " + std::to_string(m.d_model) + ", " +
           std::to_string(m.heads) + " heads, " + std::to_string(m.kv()) + " kv heads, SwiGLU FFN " +
           std::to_string(m.ffn_width()) + ", seq " + std::to_string(m.seq) + ", vocab " + std::to_string(m.vocab) +
           ", " + (m.tied ? "tied" : "untied") + " head";
  }
  static nlohmann::ordered_json shape_json(const dims& m) {
    return {{"layers", m.layers},   {"hidden", m.d_model}, {"heads", m.heads}, {"kv_heads", m.kv()},
            {"ffn", m.ffn_width()}, {"seq", m.seq},        {"vocab", m.vocab}, {"tied", m.tied}};
  }
};

// Mixtral (mixtral.hpp): the Llama with a mixture of `experts` SwiGLU experts of
// width ffn in every block, top_k per token, an optional shared expert.
struct mixtral_family {
  static constexpr const char* name = "mixtral";
  static constexpr const char* hf_class = "MixtralForCausalLM";
  using dims = strata::models::mixtral::dims;
  template <class P>
  using model = strata::models::mixtral::model<P>;

  static dims shape(const model_shape& s) {
    return {.vocab = s.vocab,
            .seq = s.seq,
            .layers = s.layers,
            .heads = s.heads,
            .d_model = s.d_model,
            .kv_heads = s.kv_heads,
            .ffn = s.ffn,
            .experts = s.experts,
            .top_k = s.top_k,
            .shared_ffn = s.shared_ffn,
            .balance_coef = s.balance_coef,
            .z_coef = s.z_coef,
            .capacity_factor = s.capacity_factor,
            .rope_theta = s.rope_theta,
            .norm_eps = s.norm_eps,
            .tied = s.tied};
  }
  static std::string shape_text(const dims& m) {
    return "Mixtral: " + std::to_string(m.layers) + " layers, hidden " + std::to_string(m.d_model) + ", " +
           std::to_string(m.heads) + " heads, " + std::to_string(m.kv()) + " kv heads, " + std::to_string(m.experts) +
           " experts (top " + std::to_string(m.top_k) + ") of SwiGLU FFN " + std::to_string(m.ffn_width()) +
           (m.shared_ffn > 0 ? ", shared expert " + std::to_string(m.shared_ffn) : std::string()) + ", seq " +
           std::to_string(m.seq) + ", vocab " + std::to_string(m.vocab) + ", " + (m.tied ? "tied" : "untied") + " head";
  }
  static nlohmann::ordered_json shape_json(const dims& m) {
    return {{"layers", m.layers},   {"hidden", m.d_model},  {"heads", m.heads}, {"kv_heads", m.kv()},
            {"ffn", m.ffn_width()}, {"experts", m.experts}, {"top_k", m.top_k}, {"shared_ffn", m.shared_ffn},
            {"seq", m.seq},         {"vocab", m.vocab},     {"tied", m.tied}};
  }
};

// GPT-NeoX (neox.hpp): rotary positions on a quarter of each head, a parallel residual, LayerNorm
// and attention with biases, an exact-GELU MLP of width ffn (default 4 x d_model), an untied head.
struct neox_family {
  static constexpr const char* name = "neox";
  static constexpr const char* hf_class = "GPTNeoXForCausalLM";
  using dims = neox::dims;
  template <class P>
  using model = neox::model<P>;

  static dims shape(const model_shape& s) {
    return {.vocab = s.vocab,
            .seq = s.seq,
            .layers = s.layers,
            .heads = s.heads,
            .d_model = s.d_model,
            .ffn = s.ffn > 0 ? s.ffn : 4 * s.d_model,
            .rope_theta = s.rope_theta,
            .norm_eps = s.norm_eps};
  }
  static std::string shape_text(const dims& m) {
    return "GPT-NeoX: " + std::to_string(m.layers) + " layers, hidden " + std::to_string(m.d_model) + ", " +
           std::to_string(m.heads) + " heads, FFN " + std::to_string(m.ffn) + ", seq " + std::to_string(m.seq) +
           ", vocab " + std::to_string(m.vocab) + ", untied head";
  }
  static nlohmann::ordered_json shape_json(const dims& m) {
    return {{"layers", m.layers}, {"hidden", m.d_model}, {"heads", m.heads}, {"ffn", m.ffn},
            {"seq", m.seq},       {"vocab", m.vocab},    {"tied", false}};
  }
};

}  // namespace strata::models
