// strata/layers/transformer_block.hpp - a pre-norm Transformer block:
//
//   r = x + attn(norm_1(x));   y = r + ffn(norm_2(r))        x, r, y: [B, T, C]
//
// or, with config.parallel_residual (GPT-NeoX, GPT-J, Pythia), both branches from the input:
//
//   y = x + attn(norm_1(x)) + ffn(norm_2(x))
//
// GPT-2's is transformer_block<P> (LayerNorm, multi-head attention with biases, GELU MLP);
// Llama's is llama_block<P> = transformer_block<P, rmsnorm, swiglu> with a config saying
// kv_heads, rope_theta and bias = false; GPT-NeoX's is transformer_block<P> with rope_theta,
// rotary_fraction 0.25, fused_qkv = per_head, ffn_activation = gelu_exact and parallel_residual.
// The attention variants (rotary_fraction, fused_qkv) are attention.hpp's; ffn_activation, when
// given, sets the feed-forward block's activation (mlp's act, swiglu's gate). Under tensor
// parallelism attention and the feed-forward block are one tensor-parallel region each; norms and
// residuals see whole activations (or, under sequence parallelism, [B, T/t, C]: this rank's
// tokens). recompute_core(true) hands selective
// recomputation to the attention. Checkpoint names: ln_1, attn, ln_2, mlp, whatever the norm.
// transformer_block<P, Norm, FeedForward, Attention> takes the three kinds of layer as types: an
// attention of one's own (any hidden layer [B, T, C] -> [B, T, C]) gets its whole config from the
// block config's `attn`. Generation: forward_cached is forward with the attention's cached step (the norms and the
// feed-forward block work token by token: layers/cached_forward.hpp).
#pragma once
#include <cstdint>
#include <optional>
#include <type_traits>

#include "strata/core/profile.hpp"
#include "strata/kernels/activation.hpp"
#include "strata/kernels/residual.hpp"
#include "strata/layers/attention.hpp"
#include "strata/layers/cached_forward.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/layernorm.hpp"
#include "strata/layers/mlp.hpp"
#include "strata/layers/rmsnorm.hpp"
#include "strata/layers/swiglu.hpp"

namespace strata {

namespace detail {
// The settings a feed-forward block takes beyond its width (an MoE's router and experts: its
// options_type), or none.
struct no_ffn_options {};
// The settings a block passes to an attention of another type than strata's: its whole config.
struct no_attention_options {};
template <class A, class Default>
struct attention_options_of {
  using type = typename A::config;
};
template <class Default>
struct attention_options_of<Default, Default> {
  using type = no_attention_options;
};
template <class F>
struct ffn_options_of {
  using type = no_ffn_options;
};
template <class F>
requires requires { typename F::options_type; }
struct ffn_options_of<F> {
  using type = typename F::options_type;
};
}  // namespace detail

template <class P, template <class> class Norm = layernorm, template <class> class FeedForward = mlp,
          template <class> class Attention = attention>
class transformer_block {
 public:
  using policy = P;
  using T = typename P::storage;

  struct config {
    std::int64_t channels = 0, heads = 0, hidden = 0;  // hidden: the MLP width, 4C in GPT-2
    double eps = 1e-5;
    double init_std = 0.02;
    double proj_init_std = 0.02;                 // residual projections; GPT-2 uses 0.02/sqrt(2·layers)
    std::int64_t kv_heads = 0;                   // key/value heads (grouped-query attention); 0: as many as heads
    double rope_theta = 0;                       // rotary position embedding's base; 0: none
    bool bias = true;                            // biases on the attention's projections
    double rotary_fraction = 1;                  // the share of each head the rotary embedding turns
    qkv_layout fused_qkv = qkv_layout::grouped;  // the fused QKV weight's row order
    std::optional<activation> ffn_activation{};  // the feed-forward block's; unset: its own default
    bool parallel_residual = false;              // y = x + attn(norm_1(x)) + ffn(norm_2(x))
    // The feed-forward block's own settings, where it has them (moe_options for st::moe).
    typename detail::ffn_options_of<FeedForward<P>>::type ffn{};
    // An attention of another type than st::attention: its whole config (the fields above that
    // describe attention are then not used).
    typename detail::attention_options_of<Attention<P>, attention<P>>::type attn{};
  };
  using norm_type = Norm<P>;
  using ffn_type = FeedForward<P>;
  using attention_type = Attention<P>;

  static constexpr typename norm_type::config ln_config(const config& c) {
    return {.channels = c.channels, .eps = c.eps};
  }
  static constexpr typename attention_type::config attn_config(const config& c) {
    if constexpr (!std::is_same_v<attention_type, attention<P>>) return c.attn;
    else
      return {.channels = c.channels,
              .heads = c.heads,
              .kv_heads = c.kv_heads,
              .rope_theta = c.rope_theta,
              .bias = c.bias,
              .rotary_fraction = c.rotary_fraction,
              .fused_qkv = c.fused_qkv,
              .init_std = c.init_std,
              .proj_init_std = c.proj_init_std};
  }
  static constexpr typename ffn_type::config mlp_config(const config& c) {
    if constexpr (requires { typename ffn_type::options_type; })
      return {.channels = c.channels,
              .hidden = c.hidden,
              .init_std = c.init_std,
              .proj_init_std = c.proj_init_std,
              .options = c.ffn};
    else {
      typename ffn_type::config f{
          .channels = c.channels, .hidden = c.hidden, .init_std = c.init_std, .proj_init_std = c.proj_init_std};
      if constexpr (requires { f.act = activation{}; }) {
        if (c.ffn_activation) f.act = *c.ffn_activation;
      } else if constexpr (requires { f.gate = activation{}; }) {
        if (c.ffn_activation) f.gate = *c.ffn_activation;
      }
      return f;
    }
  }

  static constexpr tensor_extent_list tensor_extents(const config& c) {
    tensor_extent_list r;
    if constexpr (requires { attention_type::tensor_extents(attn_config(c)); })
      r = attention_type::tensor_extents(attn_config(c));
    return r.add(ffn_type::tensor_extents(mlp_config(c)));
  }
  // The four layers, plus two residual adds whose sums r and y are kept (y is the output); with a
  // parallel residual one three-way sum, y alone kept.
  static constexpr layer_cost cost(const config& c, const cost_scope& s) {
    layer_cost residual;
    residual.forward_flops = s.local_rows() * c.channels;
    residual.backward_flops = 2 * residual.forward_flops;
    residual.output_bytes = residual.activation_bytes =
        s.local_rows() * c.channels * static_cast<std::int64_t>(sizeof(T));
    // Two operands in, the sum out; backward adds the branch's input gradient to the residual's.
    residual.memory_forward_bytes = residual.memory_backward_bytes = double(3 * residual.output_bytes);
    const layer_cost ln = norm_type::cost(ln_config(c), s), attn = attention_type::cost(attn_config(c), s),
                     ffn = ffn_type::cost(mlp_config(c), s);
    layer_cost r;
    if (c.parallel_residual) {
      layer_cost sum = residual;
      sum.forward_flops = sum.backward_flops = 2 * residual.forward_flops;
      r = ln.then(attn).then(ln).then(ffn).then(sum);
    } else {
      r = ln.then(attn).then(residual).then(ln).then(ffn).then(residual);
    }
    // The sums' buffers come first, then the four layers in turn. Backward hands the output
    // gradient straight to the feed-forward block; a gradient of the width of x is held while
    // attention runs, and two while the first norm does (the parallel form likewise).
    const std::int64_t x = residual.output_bytes, sums = (c.parallel_residual ? 1 : 2) * x;
    r.forward_peak_bytes =
        sums +
        layer_cost::max_of(layer_cost::max_of(ln.forward_high(), ln.activation_bytes + attn.forward_high()),
                           layer_cost::max_of(ln.activation_bytes + attn.activation_bytes + ln.forward_high(),
                                              2 * ln.activation_bytes + attn.activation_bytes + ffn.forward_high()));
    r.backward_peak_bytes =
        layer_cost::max_of(layer_cost::max_of(ffn.backward_peak_bytes, x + ln.backward_peak_bytes),
                           layer_cost::max_of(x + attn.backward_peak_bytes, 2 * x + ln.backward_peak_bytes));
    return r;
  }

  transformer_block(module_scope<P> scope, const config& c)
      : scope_(scope),
        cfg_(validated(scope, c)),
        ln_1_(scope / "ln_1", ln_config(c)),
        attn_(scope / "attn", attn_config(c)),
        ln_2_(scope / "ln_2", ln_config(c)),
        mlp_(scope / "mlp", mlp_config(c)) {}

  void recompute_core(bool on) {
    if constexpr (requires { attn_.recompute_core(on); }) attn_.recompute_core(on);
    else fail(scope_.qualify_layer(), ": selective recomputation needs an attention with recompute_core(bool)");
  }

  tensor_view<const T> forward(tensor_view<const T> x) {
    return forward_with(x, [&](tensor_view<const T> h) { return attn_.forward(h); });
  }
  // The new tokens of a generation step (layers/cached_forward.hpp).
  tensor_view<const T> forward_cached(tensor_view<const T> x, const decode_step& step) {
    static_assert(check_generating_hidden_layer<norm_type>() && check_generating_hidden_layer<ffn_type>());
    return forward_with(x, [&](tensor_view<const T> h) { return attn_.forward_cached(h, step); });
  }
  void release_cache() { attn_.release_cache(); }

  buffer<T> backward(const buffer<T>& dout) {
    const auto n = static_cast<std::int64_t>(dout.size());
    if (cfg_.parallel_residual) {
      // y = x + attn(ln_1(x)) + mlp(ln_2(x)): dx = ln_2ᵀ(mlpᵀ(dy)) + ln_1ᵀ(attnᵀ(dy)) + dy.
      buffer<T> dx = ln_2_.backward(mlp_.backward(dout));
      buffer<T> dx_attn = ln_1_.backward(attn_.backward(dout));
      add_residual("residual.backward", dx.data(), dx.data(), dx_attn.data(), n);
      add_residual("residual.backward", dx.data(), dx.data(), dout.data(), n);
      return dx;
    }
    // y = r + mlp(ln_2(r)): dr = ln_2ᵀ(mlpᵀ(dy)) + dy, the second term from the skip path.
    buffer<T> dr = ln_2_.backward(mlp_.backward(dout));
    add_residual("residual.backward", dr.data(), dr.data(), dout.data(), n);
    // r = x + attn(ln_1(x)): dx = ln_1ᵀ(attnᵀ(dr)) + dr.
    buffer<T> dx = ln_1_.backward(attn_.backward(dr));
    add_residual("residual.backward", dx.data(), dx.data(), dr.data(), n);
    return dx;
  }

  void release_activations() {
    ln_1_.release_activations();
    if constexpr (requires { attn_.release_activations(); }) attn_.release_activations();
    ln_2_.release_activations();
    mlp_.release_activations();
    resid_ = buffer<T>();
    out_ = buffer<T>();
  }

  template <class F>
  void visit_parameters(F&& f) const {
    ln_1_.visit_parameters(f);
    attn_.visit_parameters(f);
    ln_2_.visit_parameters(f);
    mlp_.visit_parameters(f);
  }
  const config& cfg() const { return cfg_; }

 private:
  using device = typename P::device;
  static void add_residual(const char* op, T* out, const T* a, const T* b, std::int64_t n) {
    STRATA_PROFILE(op);
    kernels::residual_forward(device{}, out, a, b, n);
  }
  // r = x + attend(norm_1(x)); y = r + ffn(norm_2(r)).
  template <class Attend>
  tensor_view<const T> forward_with(tensor_view<const T> x, Attend&& attend) {
    const std::int64_t n = x.numel();
    auto& ledger = scope_.ledger();
    if (cfg_.parallel_residual) {
      ensure_size(out_, ledger, memory_category::activations, n);
      auto a = attend(ln_1_.forward(x));
      add_residual("residual.forward", out_.data(), x.data, a.data, n);
      auto m = mlp_.forward(ln_2_.forward(x));
      add_residual("residual.forward", out_.data(), out_.data(), m.data, n);
      return {out_.data(), x.shape};
    }
    ensure_size(resid_, ledger, memory_category::activations, n);
    ensure_size(out_, ledger, memory_category::activations, n);
    auto a = attend(ln_1_.forward(x));
    add_residual("residual.forward", resid_.data(), x.data, a.data, n);
    tensor_view<const T> r{resid_.data(), x.shape};
    auto m = mlp_.forward(ln_2_.forward(r));
    add_residual("residual.forward", out_.data(), r.data, m.data, n);
    return {out_.data(), x.shape};
  }
  // The shape errors first (they name the numbers), before any layer is built.
  static const config& validated(const module_scope<P>& scope, const config& c) {
    scope.check_tensor_extents(tensor_extents(c));
    return c;
  }
  module_scope<P> scope_;
  config cfg_;
  norm_type ln_1_;
  attention_type attn_;
  norm_type ln_2_;
  ffn_type mlp_;
  buffer<T> resid_, out_;
};

// Llama's block: RMSNorm, attention with rotary positions (and grouped-query heads when kv_heads
// is below heads), a SwiGLU feed-forward block; the config sets rope_theta, kv_heads, bias = false.
template <class P>
using llama_block = transformer_block<P, rmsnorm, swiglu>;

}  // namespace strata
