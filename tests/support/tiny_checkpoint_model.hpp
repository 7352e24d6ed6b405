// tests/support/tiny_checkpoint_model.hpp - the small model the checkpoint unit tests save and
// resume: embedding, one block, LayerNorm, a tied head.
#pragma once
#include <cstdint>

#include <strata/layers/embedding.hpp>
#include <strata/layers/layernorm.hpp>
#include <strata/layers/lm_head.hpp>
#include <strata/layers/sequential.hpp>
#include <strata/layers/transformer_block.hpp>

namespace strata_test {

struct tiny_dims {
  std::int64_t vocab = 256, seq = 8, d_model = 16;
};
template <class P>
struct tiny_model {
  using policy = P;
  using config = tiny_dims;
  static constexpr auto layers(const tiny_dims& d) {
    namespace st = strata;
    return st::sequential(
        st::layer<st::embedding<P>>("", {.vocab = d.vocab, .max_seq = d.seq, .channels = d.d_model}),
        st::blocks<st::transformer_block<P>>("h", 1, {.channels = d.d_model, .heads = 2, .hidden = 2 * d.d_model}),
        st::layer<st::layernorm<P>>("ln_f", {.channels = d.d_model}),
        st::layer<st::lm_head<P>>("lm_head", {.vocab = d.vocab, .channels = d.d_model, .tied_to = "wte"}));
  }
};

}  // namespace strata_test
