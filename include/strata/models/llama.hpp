// strata/models/llama.hpp - a Llama-family model, written the way a strata user writes one: its
// shape and its layers in order. strata derives the rest from this declaration (every layout,
// the pipeline stages, the plan, the checkpoint names), as for gpt2.hpp.
//
// Architecture as in Llama 2/3: a token embedding with no position table; pre-RMSNorm blocks;
// attention with rotary positions (rotate-half convention, base rope_theta) and kv_heads
// key/value heads shared by the query heads (grouped-query; kv_heads = heads is multi-head, 1
// multi-query); a SwiGLU feed-forward block of width ffn; no biases; a final RMSNorm; an LM head
// of its own (untied) unless `tied`. Weights start N(0, 0.02), norm gains at one.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include <strata/layers/embedding.hpp>
#include <strata/layers/lm_head.hpp>
#include <strata/layers/rmsnorm.hpp>
#include <strata/layers/sequential.hpp>
#include <strata/layers/transformer_block.hpp>

namespace strata::models::llama {
namespace st = strata;

struct dims {
  std::int64_t vocab = 256, seq = 64, layers = 3, heads = 4, d_model = 96;
  std::int64_t kv_heads = 0;  // 0: as many as heads
  std::int64_t ffn = 0;       // the SwiGLU width; 0: 8/3 x d_model rounded up to a multiple of 32
  double rope_theta = 10000.0, norm_eps = 1e-5;
  bool tied = false;  // the LM head shares the token embedding's table

  constexpr std::int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
  constexpr std::int64_t ffn_width() const { return ffn > 0 ? ffn : (8 * d_model / 3 + 31) / 32 * 32; }
  constexpr std::int64_t head_dim() const { return d_model / heads; }
};

template <class P>
struct model {
  using policy = P;
  using config = dims;

  static constexpr auto layers(const dims& d) {
    return st::sequential(st::layer<st::embedding<P>>("", {.vocab = d.vocab, .max_seq = 0, .channels = d.d_model}),
                          st::blocks<st::llama_block<P>>("h", d.layers,
                                                         {.channels = d.d_model,
                                                          .heads = d.heads,
                                                          .hidden = d.ffn_width(),
                                                          .eps = d.norm_eps,
                                                          .kv_heads = d.kv(),
                                                          .rope_theta = d.rope_theta,
                                                          .bias = false}),
                          st::layer<st::rmsnorm<P>>("norm", {.channels = d.d_model, .eps = d.norm_eps}),
                          st::layer<st::lm_head<P>>(
                              "lm_head", {.vocab = d.vocab, .channels = d.d_model, .tied_to = d.tied ? "wte" : ""}));
  }
  // What a checkpoint records of the model (one of another shape is refused, naming the field).
  static nlohmann::json describe(const dims& d) {
    return {{"family", "llama"},          {"layers", d.layers},     {"heads", d.heads}, {"kv_heads", d.kv()},
            {"d_model", d.d_model},       {"ffn", d.ffn_width()},   {"seq", d.seq},     {"vocab", d.vocab},
            {"rope_theta", d.rope_theta}, {"norm_eps", d.norm_eps}, {"tied", d.tied}};
  }
};

}  // namespace strata::models::llama
