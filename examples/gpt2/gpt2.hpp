// examples/gpt2/gpt2.hpp - GPT-2, written the way a strata user writes a model: plain
// composition of strata's layer templates, with its own forward and backward.
//
// Architecture as in GPT-2: learned position embeddings; pre-LayerNorm blocks (eps 1e-5);
// tanh-GELU MLP of width 4C; biases on every linear and LayerNorm; attention scaled by
// 1/sqrt(head_dim); a final LayerNorm; an LM head tied to the token embedding. Weights start
// N(0, 0.02), the residual output projections N(0, 0.02/sqrt(2·layers)).
#pragma once
#include <cmath>
#include <cstdint>

#include <strata/layers/embedding.hpp>
#include <strata/layers/layernorm.hpp>
#include <strata/layers/lm_head.hpp>
#include <strata/layers/module.hpp>
#include <strata/layers/recompute.hpp>
#include <strata/layers/stack.hpp>
#include <strata/layers/tensor_parallel.hpp>
#include <strata/layers/transformer_block.hpp>
#include <strata/policy/policy.hpp>

namespace gpt2 {
namespace st = strata;

struct dims {
  std::int64_t vocab = 256, seq = 64, layers = 3, heads = 4, d_model = 96;

  void validate() const {
    STRATA_CHECK(vocab >= 2, "gpt2: --vocab ", vocab, " must be >= 2");
    STRATA_CHECK(seq >= 1, "gpt2: --seq ", seq, " must be >= 1");
    STRATA_CHECK(layers >= 1, "gpt2: --layers ", layers, " must be >= 1");
    STRATA_CHECK(heads >= 1, "gpt2: --heads ", heads, " must be >= 1");
    STRATA_CHECK(d_model >= 1 && d_model % heads == 0, "gpt2: --heads ", heads, " does not divide --d-model ",
                 d_model, " (head_dim must be a whole number)");
  }
};

template <class P>
struct model {
  using policy = P;
  using T = typename P::storage;
  using block_type = st::recompute<st::recompute_mode_by_config, st::transformer_block<P>>;

  static constexpr typename st::embedding<P>::config embed_config(const dims& d, st::tensor_split tp = {}) {
    return {d.vocab, d.seq, d.d_model, 0.02, tp};
  }
  static constexpr typename block_type::config block_config(const dims& d, st::tensor_split tp = {},
                                                            st::recompute_mode r = st::recompute_mode::none) {
    typename block_type::config c;
    static_cast<typename st::transformer_block<P>::config&>(c) = {d.d_model, d.heads, 4 * d.d_model, 1e-5, 0.02, 0.02, tp};
    c.recompute = r;
    return c;
  }
  // GPT-2 scales the residual projections' init by 1/sqrt(2·layers) (not constexpr: sqrt).
  static typename block_type::config block_init(const dims& d, st::tensor_split tp, st::recompute_mode r) {
    auto c = block_config(d, tp, r);
    c.proj_init_std = 0.02 / std::sqrt(2.0 * double(d.layers));
    return c;
  }
  static constexpr typename st::layernorm<P>::config ln_config(const dims& d, st::tensor_split tp = {}) {
    return {d.d_model, 1e-5, tp};
  }
  static constexpr typename st::lm_head<P>::config head_config(const dims& d, st::tensor_split tp = {}) {
    return {d.vocab, d.d_model, 0.02, tp};
  }

  // Ψ per rank, from the layers' own constexpr costs.
  static constexpr std::int64_t param_count(const dims& d, st::tensor_split tp = {}) {
    return st::embedding<P>::param_count(embed_config(d, tp)) +
           st::stack<block_type>::param_count(block_config(d, tp), d.layers) +
           st::layernorm<P>::param_count(ln_config(d, tp)) + st::lm_head<P>::param_count(head_config(d, tp), true);
  }

  model(st::memory_ledger& ledger, const dims& d, st::seed seed, st::tensor_parallel tp = {},
        st::recompute_mode recompute = st::recompute_mode::none)
      : model(validated(d, tp), ledger, seed, std::move(tp), recompute) {}

  // Mean next-token loss over the batch; leaves the loss gradient (times grad_scale) in place.
  double forward(st::tensor_view<const std::int32_t> inputs, st::tensor_view<const std::int32_t> targets,
                 double grad_scale = 1.0) {
    return head.forward(hidden(inputs), targets, grad_scale);
  }
  void backward() { embed.backward(blocks.backward(ln_f.backward(head.backward()))); }

  // Loss without gradients, and logits for sampling.
  double evaluate(st::tensor_view<const std::int32_t> inputs, st::tensor_view<const std::int32_t> targets) {
    return head.evaluate(hidden(inputs), targets);
  }
  st::tensor_view<const T> logits(st::tensor_view<const std::int32_t> inputs) { return head.logits(hidden(inputs)); }

  st::parameter_store<T>& parameters() { return ctx.params(); }
  const dims& shape() const { return d; }

  // The shape checks the constructor makes, for models built from these layers in other ways.
  static void check(const dims& d, const st::tensor_parallel& tp) { validated(d, tp); }

  dims d;
  st::model_context<P> ctx;
  st::embedding<P> embed;
  st::stack<block_type> blocks;
  st::layernorm<P> ln_f;
  st::lm_head<P> head;

 private:
  static const dims& validated(const dims& d, const st::tensor_parallel& tp) {
    d.validate();
    const int t = tp.degree();
    STRATA_CHECK(d.heads % t == 0, "gpt2: tensor parallelism tp=", t, " does not divide heads = ", d.heads);
    STRATA_CHECK((4 * d.d_model) % t == 0, "gpt2: tensor parallelism tp=", t, " does not divide the FFN width ",
                 4 * d.d_model);
    STRATA_CHECK(!tp.sequence_parallel() || d.seq % t == 0, "gpt2: sequence parallelism over tp=", t,
                 " needs --seq divisible by it, got ", d.seq);
    return d;
  }
  // tp by reference: the public constructor's validated(d, tp) must see it before it moves here.
  model(const dims& dd, st::memory_ledger& ledger, st::seed seed, st::tensor_parallel&& tp, st::recompute_mode r)
      : d(dd),
        ctx(ledger, seed, std::move(tp)),
        embed(st::module_scope<P>(ctx), embed_config(dd, ctx.tensor().split())),
        blocks(st::module_scope<P>(ctx, "h"), block_init(dd, ctx.tensor().split(), r), dd.layers),
        ln_f(st::module_scope<P>(ctx, "ln_f"), ln_config(dd, ctx.tensor().split())),
        head(st::module_scope<P>(ctx, "lm_head"), head_config(dd, ctx.tensor().split()),
             st::tied_to{embed.token_table()}) {
    ctx.params().materialize();
  }
  st::tensor_view<const T> hidden(st::tensor_view<const std::int32_t> inputs) {
    return ln_f.forward(blocks.forward(embed.forward(inputs)));
  }
};

}  // namespace gpt2
