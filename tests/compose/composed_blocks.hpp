// tests/compose/composed_blocks.hpp - blocks declared from library layers with st::chain,
// st::residual and st::sum_of alone: no forward, backward, parameter visit or cost of their own.
//
//   sandwich     Gemma 2's and OLMo 2's block, a norm before and after each branch (new to the
//                library: no strata block has post-norms):
//                  h = x + post_attn_norm(attn(pre_attn_norm(x)));  y = h + post_ffn_norm(ffn(pre_ffn_norm(h)))
//   gpt2_like    GPT-2's block as transformer_block<P> computes it, named as it names its parts
//   parallel     the parallel residual (GPT-NeoX): y = x + attn(ln_1(x)) + mlp(ln_2(x))
// and a model of sandwich blocks for the layout suites (RMSNorm, rotary attention, SwiGLU).
#pragma once
#include <cstdint>

#include <strata/strata.hpp>

namespace composed {
namespace st = strata;

struct block_dims {
  std::int64_t channels = 0, heads = 0, kv_heads = 0, hidden = 0;
  double rope_theta = 100, init_std = 0.02;
};

template <class P>
struct sandwich {
  using policy = P;
  using config = block_dims;
  static constexpr auto parts(const config& c) {
    const typename st::rmsnorm<P>::config norm{.channels = c.channels};
    return st::chain(st::residual(st::layer<st::rmsnorm<P>>("pre_attn_norm", norm),
                                  st::layer<st::attention<P>>("attn", {.channels = c.channels,
                                                                       .heads = c.heads,
                                                                       .kv_heads = c.kv_heads,
                                                                       .rope_theta = c.rope_theta,
                                                                       .bias = false,
                                                                       .init_std = c.init_std,
                                                                       .proj_init_std = c.init_std}),
                                  st::layer<st::rmsnorm<P>>("post_attn_norm", norm)),
                     st::residual(st::layer<st::rmsnorm<P>>("pre_ffn_norm", norm),
                                  st::layer<st::swiglu<P>>("ffn", {.channels = c.channels,
                                                                   .hidden = c.hidden,
                                                                   .init_std = c.init_std,
                                                                   .proj_init_std = c.init_std}),
                                  st::layer<st::rmsnorm<P>>("post_ffn_norm", norm)));
  }
};
template <class P>
using sandwich_block = st::composition<sandwich<P>>;

// GPT-2's block from the same pieces transformer_block<P> holds, under the same names.
template <class P>
struct gpt2_like {
  using policy = P;
  using config = typename st::transformer_block<P>::config;
  static constexpr auto parts(const config& c) {
    using B = st::transformer_block<P>;
    return st::chain(st::residual(st::layer<st::layernorm<P>>("ln_1", B::ln_config(c)),
                                  st::layer<st::attention<P>>("attn", B::attn_config(c))),
                     st::residual(st::layer<st::layernorm<P>>("ln_2", B::ln_config(c)),
                                  st::layer<st::mlp<P>>("mlp", B::mlp_config(c))));
  }
};

template <class P>
struct parallel {
  using policy = P;
  using config = typename st::transformer_block<P>::config;
  static constexpr auto parts(const config& c) {
    using B = st::transformer_block<P>;
    return st::residual(st::sum_of(st::chain(st::layer<st::layernorm<P>>("ln_1", B::ln_config(c)),
                                             st::layer<st::attention<P>>("attn", B::attn_config(c))),
                                   st::chain(st::layer<st::layernorm<P>>("ln_2", B::ln_config(c)),
                                             st::layer<st::mlp<P>>("mlp", B::mlp_config(c)))));
  }
};

// A model of sandwich blocks.
struct dims {
  std::int64_t vocab = 61, seq = 8, layers = 2, heads = 4, kv_heads = 2, width = 32, hidden = 48;
};

template <class P>
struct model {
  using policy = P;
  using config = dims;
  static constexpr auto layers(const dims& c) {
    return st::sequential(
        st::layer<st::embedding<P>>("embed", {.vocab = c.vocab, .max_seq = 0, .channels = c.width}),
        st::blocks<sandwich_block<P>>(
            "blocks", c.layers, {.channels = c.width, .heads = c.heads, .kv_heads = c.kv_heads, .hidden = c.hidden}),
        st::layer<st::rmsnorm<P>>("norm", {.channels = c.width}),
        st::layer<st::lm_head<P>>("head", {.vocab = c.vocab, .channels = c.width}));
  }
};

}  // namespace composed
