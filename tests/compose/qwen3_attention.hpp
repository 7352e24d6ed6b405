// tests/compose/qwen3_attention.hpp - Qwen3's attention written as a user writes one: strata's
// column-parallel QKV projection, an RMSNorm over each query and each key head (one gain of the
// head size for all query heads, one for all key heads), the rotary embedding, strata's attention
// kernels and the row-parallel projection.
//
// Under tensor parallelism a rank holds H/t query heads (and their key/value heads), so its
// gains' gradients come from its heads alone: the gains are registered as head shares, and strata
// sums their gradients over the group. The layer calls no reduction. It runs without context
// parallelism (the rotary positions here are a whole sequence's), and says so at start-up.
#pragma once
#include <cmath>
#include <cstdint>

#include <strata/strata.hpp>

namespace qwen3 {
namespace st = strata;

// G: what one rank's gain gradient is. Qwen3's gains are head shares; a test builds the layer with
// the wrong answer too (own), to show that the layout suites' gradient norms catch it.
template <class P, st::tensor_gradient G = st::tensor_gradient::head_share>
class attention {
 public:
  using policy = P;
  using T = typename P::storage;
  using A = typename P::accumulate;
  using strata_attention = st::attention<P>;

  struct config {
    std::int64_t channels = 0, heads = 0, kv_heads = 0;
    double rope_theta = 10000, eps = 1e-6, init_std = 0.02;
    constexpr typename strata_attention::config projections() const {
      return {.channels = channels,
              .heads = heads,
              .kv_heads = kv_heads,
              .rope_theta = rope_theta,
              .bias = false,
              .init_std = init_std,
              .proj_init_std = init_std};
    }
  };

  static constexpr st::tensor_extent_list tensor_extents(const config& c) {
    return strata_attention::tensor_extents(c.projections());
  }
  // strata's attention's costs, the normalised q and k kept beside it (as wide as their raw
  // values) with a 1/rms per head, and the gains' gradient sum.
  static constexpr st::layer_cost cost(const config& c, const st::cost_scope& s) {
    st::layer_cost r = strata_attention::cost(c.projections(), s);
    const std::int64_t t = s.tp.degree, d = c.channels / c.heads, kv = c.kv_heads >= t ? c.kv_heads / t : 1;
    const std::int64_t normed = s.rows() * (c.heads / t + kv);
    r.params += 2 * d;
    r.activation_bytes += normed * d * std::int64_t(sizeof(T)) + normed * std::int64_t(sizeof(double));
    r.forward_flops += 4 * normed * d;
    r.backward_flops += 8 * normed * d;
    r.tensor_backward_bytes += st::tensor_gradient_bytes(G, s.tp, 2 * d, std::int64_t(sizeof(T)));
    return r;
  }

  attention(st::module_scope<P> scope, const config& c)
      : scope_(scope),
        cfg_(validated(scope, c)),
        qkv_(scope / "qkv", strata_attention::qkv_config(c.projections())),
        proj_(scope / "proj", strata_attention::proj_config(c.projections())) {
    const std::int64_t d = c.channels / c.heads;
    q_gain_ = scope.add_parameter("q_norm.weight", {d}, st::init_rule::ones(), false, G);
    k_gain_ = scope.add_parameter("k_norm.weight", {d}, st::init_rule::ones(), false, G);
  }

  st::tensor_view<const T> forward(st::tensor_view<const T> x) {
    auto qkv = qkv_.forward(x);  // every token, this rank's heads
    shape_ = local_shape(qkv.shape[0], qkv.shape[1]);
    T* rows = qkv_.output_data();
    const std::int64_t n = shape_.batch * shape_.seq, heads = shape_.heads + shape_.kv_heads, d = shape_.head_dim;
    st::ensure_size(raw_, scope_.ledger(), st::memory_category::activations, n * heads * d);
    st::ensure_size(rinv_, scope_.ledger(), st::memory_category::activations, n * heads);
    auto& p = scope_.params();
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t h = 0; h < heads; ++h) {
        T* v = rows + r * shape_.row_width() + h * d;
        const T* g = p.weights(h < shape_.heads ? q_gain_ : k_gain_);
        double ss = 0;
        for (std::int64_t i = 0; i < d; ++i) ss += double(v[i]) * double(v[i]);
        const double inv = 1.0 / std::sqrt(ss / double(d) + cfg_.eps);
        rinv_[std::size_t(r * heads + h)] = inv;
        for (std::int64_t i = 0; i < d; ++i) {
          raw_[std::size_t((r * heads + h) * d + i)] = v[i];
          v[i] = T(double(v[i]) * inv * double(g[i]));
        }
      }
    st::kernels::rope_forward(device{}, rows, shape_, cfg_.rope_theta, 0, d);
    qkv_out_ = rows;
    st::ensure_size(lse_, scope_.ledger(), st::memory_category::activations, shape_.batch * shape_.heads * shape_.seq);
    st::ensure_size(heads_out_, scope_.ledger(), st::memory_category::activations, n * shape_.q_width());
    st::kernels::attention_forward(device{}, heads_out_.data(), lse_.data(), rows, shape_);
    return proj_.forward({heads_out_.data(), {shape_.batch, shape_.seq, shape_.q_width()}});
  }

  st::buffer<T> backward(const st::buffer<T>& dout) {
    st::buffer<T> dheads = proj_.backward(dout);
    const std::int64_t n = shape_.batch * shape_.seq, heads = shape_.heads + shape_.kv_heads, d = shape_.head_dim;
    st::buffer<T> dqkv(scope_.ledger(), st::memory_category::activations, std::size_t(n * shape_.row_width()));
    st::kernels::attention_backward(device{}, dqkv.data(), dheads.data(), qkv_out_, lse_.data(), heads_out_.data(),
                                    shape_);
    st::kernels::rope_backward(device{}, dqkv.data(), shape_, cfg_.rope_theta, 0, d);
    // Through the norms: y = v·inv·g, so dg += dy·v·inv and dv = inv·(dy·g - v·inv²·Σ(dy·g·v)/d).
    auto& p = scope_.params();
    auto grads = scope_.gradients(q_gain_, k_gain_);  // head shares: strata sums them over the group
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t h = 0; h < heads; ++h) {
        T* dv = dqkv.data() + r * shape_.row_width() + h * d;
        const bool query = h < shape_.heads;
        const T* g = p.weights(query ? q_gain_ : k_gain_);
        T* dg = grads[query ? 0 : 1];
        const T* v = raw_.data() + (r * heads + h) * d;
        const double inv = rinv_[std::size_t(r * heads + h)];
        double dot = 0;
        for (std::int64_t i = 0; i < d; ++i) dot += double(dv[i]) * double(g[i]) * double(v[i]);
        for (std::int64_t i = 0; i < d; ++i) {
          dg[i] = T(double(dg[i]) + double(dv[i]) * double(v[i]) * inv);
          dv[i] = T(inv * (double(dv[i]) * double(g[i]) - double(v[i]) * inv * inv * dot / double(d)));
        }
      }
    grads.written();
    return qkv_.backward(dqkv);
  }

  void release_activations() {
    qkv_.release_activations();
    proj_.release_activations();
    raw_ = st::buffer<T>();
    rinv_ = st::buffer<double>();
    lse_ = st::buffer<A>();
    heads_out_ = st::buffer<T>();
  }
  template <class F>
  void visit_parameters(F&& f) const {
    qkv_.visit_parameters(f);
    f(q_gain_);
    f(k_gain_);
    proj_.visit_parameters(f);
  }

 private:
  using device = typename P::device;
  static const config& validated(const st::module_scope<P>& scope, const config& c) {
    STRATA_CHECK(scope.cp().degree() == 1, scope.qualify_layer(),
                 ": this attention turns whole sequences; it does not run under context parallelism");
    scope.check_tensor_extents(tensor_extents(c));
    return c;
  }
  st::kernels::attention_shape local_shape(std::int64_t batch, std::int64_t seq) const {
    const std::int64_t t = scope_.tensor().degree();
    return {batch, seq, cfg_.heads / t, cfg_.kv_heads >= t ? cfg_.kv_heads / t : 1, cfg_.channels / cfg_.heads, 0};
  }
  st::module_scope<P> scope_;
  config cfg_;
  st::linear<P> qkv_, proj_;
  st::param_handle q_gain_, k_gain_;
  st::kernels::attention_shape shape_;
  T* qkv_out_ = nullptr;
  st::buffer<T> raw_;        // q and k before their norms, [rows, heads, d]
  st::buffer<double> rinv_;  // 1/rms of each
  st::buffer<A> lse_;
  st::buffer<T> heads_out_;
};

// A small Qwen3: RMSNorm, this attention, SwiGLU, an untied head.
struct dims {
  std::int64_t vocab = 61, seq = 8, layers = 2, heads = 4, kv_heads = 2, width = 32, hidden = 48;
};

template <class P>
using attention_as_own = attention<P, st::tensor_gradient::own>;

template <class P, template <class> class Attention = attention>
struct model {
  using policy = P;
  using config = dims;
  static constexpr auto layers(const dims& c) {
    using block = st::transformer_block<P, st::rmsnorm, st::swiglu, Attention>;
    return st::sequential(
        st::layer<st::embedding<P>>("embed", {.vocab = c.vocab, .max_seq = 0, .channels = c.width}),
        st::blocks<block>("blocks", c.layers,
                          {.channels = c.width,
                           .hidden = c.hidden,
                           .eps = 1e-6,
                           .attn = {.channels = c.width, .heads = c.heads, .kv_heads = c.kv_heads, .init_std = 0.1}}),
        st::layer<st::rmsnorm<P>>("norm", {.channels = c.width, .eps = 1e-6}),
        st::layer<st::lm_head<P>>("head", {.vocab = c.vocab, .channels = c.width}));
  }
};

}  // namespace qwen3
