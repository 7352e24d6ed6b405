// strata/models/mixtral.hpp - a Mixtral-family model: the Llama (llama.hpp) with a mixture of
// experts in every block's place of the SwiGLU (layers/moe.hpp), written as a strata user writes
// a model. strata derives the rest from this declaration, as for the Llama.
//
// Each block: RMSNorm, grouped-query attention with rotary positions, RMSNorm, a router over
// `experts` SwiGLU experts of width ffn, each token through its top_k (weights renormalised, as
// Mixtral), optionally a shared SwiGLU of width shared_ffn every token goes through. No biases, a
// final RMSNorm, an untied LM head unless `tied`. The router's load-balancing and z-losses are
// added to the objective with balance_coef and z_coef and reported apart from the loss.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include <strata/layers/embedding.hpp>
#include <strata/layers/lm_head.hpp>
#include <strata/layers/moe.hpp>
#include <strata/layers/rmsnorm.hpp>
#include <strata/layers/sequential.hpp>
#include <strata/layers/transformer_block.hpp>

namespace strata::models::mixtral {
namespace st = strata;

struct dims {
  std::int64_t vocab = 256, seq = 64, layers = 2, heads = 4, d_model = 64;
  std::int64_t kv_heads = 0;  // 0: as many as heads
  std::int64_t ffn = 0;       // each expert's SwiGLU width; 0: 8/3 x d_model rounded up to a multiple of 32
  std::int64_t experts = 4, top_k = 2;
  std::int64_t shared_ffn = 0;  // the shared expert's width; 0: none
  double balance_coef = 0.01, z_coef = 0.0, capacity_factor = 0.0;
  double rope_theta = 10000.0, norm_eps = 1e-5;
  bool tied = false;

  constexpr std::int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
  constexpr std::int64_t ffn_width() const { return ffn > 0 ? ffn : (8 * d_model / 3 + 31) / 32 * 32; }
  constexpr std::int64_t head_dim() const { return d_model / heads; }
  constexpr st::moe_options moe() const {
    return {.experts = experts,
            .top_k = top_k,
            .shared_hidden = shared_ffn,
            .renormalize = true,
            .balance_coef = balance_coef,
            .z_coef = z_coef,
            .capacity_factor = capacity_factor};
  }
};

template <class P>
using block = st::transformer_block<P, st::rmsnorm, st::moe>;

template <class P>
struct model {
  using policy = P;
  using config = dims;

  static constexpr auto layers(const dims& d) {
    return st::sequential(st::layer<st::embedding<P>>("", {.vocab = d.vocab, .max_seq = 0, .channels = d.d_model}),
                          st::blocks<block<P>>("h", d.layers,
                                               {.channels = d.d_model,
                                                .heads = d.heads,
                                                .hidden = d.ffn_width(),
                                                .eps = d.norm_eps,
                                                .kv_heads = d.kv(),
                                                .rope_theta = d.rope_theta,
                                                .bias = false,
                                                .ffn = d.moe()}),
                          st::layer<st::rmsnorm<P>>("norm", {.channels = d.d_model, .eps = d.norm_eps}),
                          st::layer<st::lm_head<P>>(
                              "lm_head", {.vocab = d.vocab, .channels = d.d_model, .tied_to = d.tied ? "wte" : ""}));
  }
  static nlohmann::json describe(const dims& d) {
    return {{"family", "mixtral"},        {"layers", d.layers},   {"heads", d.heads},     {"kv_heads", d.kv()},
            {"d_model", d.d_model},       {"ffn", d.ffn_width()}, {"experts", d.experts}, {"top_k", d.top_k},
            {"shared_ffn", d.shared_ffn}, {"seq", d.seq},         {"vocab", d.vocab},     {"rope_theta", d.rope_theta},
            {"norm_eps", d.norm_eps},     {"tied", d.tied}};
  }
};

}  // namespace strata::models::mixtral
