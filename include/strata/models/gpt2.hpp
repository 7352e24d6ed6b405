// strata/models/gpt2.hpp - GPT-2, written the way a strata user writes a model: its shape and
// its layers in order. strata derives the rest from this declaration (every layout, the
// pipeline stages, the plan, the checkpoint names: parallel/sequential_model.hpp).
//
// Architecture as in GPT-2: learned position embeddings; pre-LayerNorm blocks (eps 1e-5);
// tanh-GELU MLP of width 4C; biases on every linear and LayerNorm; attention scaled by
// 1/sqrt(head_dim); a final LayerNorm; an LM head tied to the token embedding. Weights start
// N(0, 0.02), the residual output projections N(0, 0.02/sqrt(2·layers)).
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include <strata/core/init.hpp>
#include <strata/layers/embedding.hpp>
#include <strata/layers/layernorm.hpp>
#include <strata/layers/lm_head.hpp>
#include <strata/layers/sequential.hpp>
#include <strata/layers/transformer_block.hpp>

namespace strata::models::gpt2 {
namespace st = strata;

struct dims {
  std::int64_t vocab = 256, seq = 64, layers = 3, heads = 4, d_model = 96;
  std::int64_t ffn = 0;  // the MLP width; 0: 4 x d_model
  constexpr std::int64_t ffn_width() const { return ffn > 0 ? ffn : 4 * d_model; }
};

template <class P>
struct model {
  using policy = P;
  using config = dims;

  static constexpr auto layers(const dims& d) {
    return st::sequential(
        st::layer<st::embedding<P>>("", {.vocab = d.vocab, .max_seq = d.seq, .channels = d.d_model}),
        st::blocks<st::transformer_block<P>>("h", d.layers,
                                             {.channels = d.d_model,
                                              .heads = d.heads,
                                              .hidden = d.ffn_width(),
                                              .proj_init_std = 0.02 / st::constexpr_sqrt(2.0 * double(d.layers))}),
        st::layer<st::layernorm<P>>("ln_f", {.channels = d.d_model}),
        st::layer<st::lm_head<P>>("lm_head", {.vocab = d.vocab, .channels = d.d_model, .tied_to = "wte"}));
  }
  // What a checkpoint records of the model (one of another shape is refused, naming the field).
  static std::map<std::string, std::int64_t> describe(const dims& d) {
    return {{"layers", d.layers}, {"heads", d.heads}, {"d_model", d.d_model},
            {"seq", d.seq},       {"vocab", d.vocab}, {"ffn", d.ffn_width()}};
  }
};

}  // namespace strata::models::gpt2
