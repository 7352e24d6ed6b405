// tests/custom/custom_model.hpp - a model that is not GPT-2, written here against strata's public
// API the way a user writes one: two layers strata does not have (RMSNorm and a SwiGLU
// feed-forward), a block of its own built from them and strata's attention, and a declaration
// listing the layers. Nothing in it knows about layouts, pipelines, plans or checkpoints: strata
// derives all of that from the declaration (tests/custom/test_custom_model.cpp runs it).
//
//   x -> embedding -> N x [ r = x + attn(rms(x));  y = r + swiglu(rms(r)) ] -> rms -> head (untied)
#pragma once
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <strata/strata.hpp>

namespace custom {
namespace st = strata;

// RMSNorm over the last dimension with a gain: y = x · g / sqrt(mean(x²) + eps). Under sequence
// parallelism it sees this rank's tokens: its gain is registered as a token share, and strata sums
// the gain's gradient over the group.
template <class P>
struct rmsnorm {
  using policy = P;
  using T = typename P::storage;
  struct config {
    std::int64_t channels = 0;
    double eps = 1e-6;
  };
  // Keeps its output and one 1/rms per row.
  static constexpr st::layer_cost cost(const config& c, const st::cost_scope& s) {
    st::layer_cost r;
    r.params = c.channels;
    r.forward_flops = 4 * s.local_rows() * c.channels;
    r.backward_flops = 2 * r.forward_flops;
    r.output_bytes = s.local_rows() * c.channels * std::int64_t(sizeof(T));
    r.activation_bytes = r.output_bytes + s.local_rows() * std::int64_t(sizeof(double));
    if (s.tp.sequence_parallel)
      r.tensor_backward_bytes = st::ring_all_reduce_bytes(double(c.channels * sizeof(T)), s.tp.degree);
    return r;
  }

  rmsnorm(st::module_scope<P> scope, const config& c) : scope_(scope), cfg_(c) {
    gain_ = scope.add_parameter("weight", {c.channels}, st::init_rule::ones(), false, st::tensor_gradient::token_share);
  }

  st::tensor_view<const T> forward(st::tensor_view<const T> x) {
    const std::int64_t C = cfg_.channels, rows = x.numel() / C;
    x_ = x;
    st::ensure_size(out_, scope_.ledger(), st::memory_category::activations, rows * C);
    st::ensure_size(rinv_, scope_.ledger(), st::memory_category::activations, rows);
    const T* g = scope_.params().weights(gain_);
    for (std::int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (std::int64_t i = 0; i < C; ++i)
        ss += st::convert<double>(x.data[r * C + i]) * st::convert<double>(x.data[r * C + i]);
      const double inv = 1.0 / std::sqrt(ss / double(C) + cfg_.eps);
      rinv_[std::size_t(r)] = inv;
      for (std::int64_t i = 0; i < C; ++i)
        out_[std::size_t(r * C + i)] =
            st::convert<T>(st::convert<double>(x.data[r * C + i]) * inv * st::convert<double>(g[i]));
    }
    return {out_.data(), x.shape};
  }
  st::buffer<T> backward(const st::buffer<T>& dy) {
    const std::int64_t C = cfg_.channels, rows = std::int64_t(dy.size()) / C;
    auto& p = scope_.params();
    const T* g = p.weights(gain_);
    st::buffer<T> dx(scope_.ledger(), st::memory_category::activations, dy.size());
    std::vector<double> dg_acc(std::size_t(C), 0.0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const double inv = rinv_[std::size_t(r)];
      double dot = 0;  // Σ dy·g·x
      for (std::int64_t i = 0; i < C; ++i) {
        const double xi = st::convert<double>(x_.data[r * C + i]),
                     dyi = st::convert<double>(dy[std::size_t(r * C + i)]);
        dot += dyi * st::convert<double>(g[i]) * xi;
        dg_acc[std::size_t(i)] += dyi * xi * inv;
      }
      for (std::int64_t i = 0; i < C; ++i) {
        const double xi = st::convert<double>(x_.data[r * C + i]),
                     dyi = st::convert<double>(dy[std::size_t(r * C + i)]);
        dx[std::size_t(r * C + i)] =
            st::convert<T>(inv * (dyi * st::convert<double>(g[i]) - xi * inv * inv * dot / double(C)));
      }
    }
    auto grads = scope_.gradients(gain_);  // summed over the group where the gain's gradient is a share
    T* grad = grads[0];
    for (std::int64_t i = 0; i < C; ++i)
      grad[i] =
          st::convert<T>(st::convert<double>(grad[i]) + st::convert<double>(st::convert<T>(dg_acc[std::size_t(i)])));
    grads.written();
    return dx;
  }
  void release_activations() {
    out_ = st::buffer<T>();
    rinv_ = st::buffer<double>();
  }
  template <class F>
  void visit_parameters(F&& f) const {
    f(gain_);
  }

 private:
  st::module_scope<P> scope_;
  config cfg_;
  st::param_handle gain_;
  st::tensor_view<const T> x_;
  st::buffer<T> out_;
  st::buffer<double> rinv_;
};

// down(silu(gate(x)) · up(x)): a tensor-parallel region built from strata's column- and
// row-parallel linears, which carry the region's edges.
template <class P>
struct swiglu {
  using policy = P;
  using T = typename P::storage;
  struct config {
    std::int64_t channels = 0, hidden = 0;
  };
  static constexpr typename st::linear<P>::config in_config(const config& c) {
    return {.in = c.channels, .out = c.hidden, .bias = false, .split = st::tensor_split_kind::column};
  }
  static constexpr typename st::linear<P>::config out_config(const config& c) {
    return {.in = c.hidden, .out = c.channels, .bias = false, .split = st::tensor_split_kind::row};
  }
  static constexpr st::tensor_extent_list tensor_extents(const config& c) { return {{"FFN width", c.hidden}}; }
  // gate and up side by side, silu(gate)·up kept, then down.
  static constexpr st::layer_cost cost(const config& c, const st::cost_scope& s) {
    st::layer_cost h;
    h.forward_flops = 4 * s.rows() * c.hidden / s.tp.degree;
    h.backward_flops = 2 * h.forward_flops;
    h.output_bytes = h.activation_bytes = s.rows() * c.hidden / s.tp.degree * std::int64_t(sizeof(T));
    const auto in = st::linear<P>::cost(in_config(c), s);
    return (in + in).then(h).then(st::linear<P>::cost(out_config(c), s));
  }

  swiglu(st::module_scope<P> scope, const config& c)
      : scope_(scope),
        gate_(scope / "gate", in_config(c)),
        up_(scope / "up", in_config(c)),
        down_(scope / "down", out_config(c)) {}

  st::tensor_view<const T> forward(st::tensor_view<const T> x) {
    g_ = gate_.forward(x);
    u_ = up_.forward(x);
    st::ensure_size(h_, scope_.ledger(), st::memory_category::activations, g_.numel());
    for (std::int64_t i = 0; i < g_.numel(); ++i)
      h_[std::size_t(i)] = st::convert<T>(silu(st::convert<double>(g_.data[i])) * st::convert<double>(u_.data[i]));
    return down_.forward({h_.data(), g_.shape});
  }
  st::buffer<T> backward(const st::buffer<T>& dy) {
    auto dh = down_.backward(dy);
    st::buffer<T> dg(scope_.ledger(), st::memory_category::activations, dh.size());
    st::buffer<T> du(scope_.ledger(), st::memory_category::activations, dh.size());
    for (std::size_t i = 0; i < dh.size(); ++i) {
      const double z = st::convert<double>(g_.data[i]), d = st::convert<double>(dh[i]);
      dg[i] = st::convert<T>(d * st::convert<double>(u_.data[i]) * silu_grad(z));
      du[i] = st::convert<T>(d * silu(z));
    }
    auto dx = gate_.backward(dg);
    auto dx_up = up_.backward(du);
    for (std::size_t i = 0; i < dx.size(); ++i)
      dx[i] = st::convert<T>(st::convert<double>(dx[i]) + st::convert<double>(dx_up[i]));
    return dx;
  }
  void release_activations() {
    gate_.release_activations();
    up_.release_activations();
    down_.release_activations();
    h_ = st::buffer<T>();
  }
  template <class F>
  void visit_parameters(F&& f) const {
    gate_.visit_parameters(f);
    up_.visit_parameters(f);
    down_.visit_parameters(f);
  }

 private:
  static double silu(double z) { return z / (1 + std::exp(-z)); }
  static double silu_grad(double z) {
    const double sig = 1 / (1 + std::exp(-z));
    return sig * (1 + z * (1 - sig));
  }
  st::module_scope<P> scope_;
  st::linear<P> gate_, up_, down_;
  st::tensor_view<const T> g_, u_;
  st::buffer<T> h_;
};

// The block: r = x + attn(rms_1(x)); y = r + ffn(rms_2(r)).
template <class P>
struct block {
  using policy = P;
  using T = typename P::storage;
  struct config {
    std::int64_t channels = 0, heads = 0, hidden = 0;
  };
  static constexpr typename rmsnorm<P>::config norm(const config& c) { return {.channels = c.channels}; }
  static constexpr typename st::attention<P>::config attn(const config& c) {
    return {.channels = c.channels, .heads = c.heads};
  }
  static constexpr typename swiglu<P>::config ffn(const config& c) {
    return {.channels = c.channels, .hidden = c.hidden};
  }

  static constexpr st::tensor_extent_list tensor_extents(const config& c) {
    return st::attention<P>::tensor_extents(attn(c)).add(swiglu<P>::tensor_extents(ffn(c)));
  }
  static constexpr st::layer_cost cost(const config& c, const st::cost_scope& s) {
    st::layer_cost residual;  // r and y, kept
    residual.forward_flops = s.local_rows() * c.channels;
    residual.output_bytes = residual.activation_bytes = s.local_rows() * c.channels * std::int64_t(sizeof(T));
    const auto n = rmsnorm<P>::cost(norm(c), s);
    return n.then(st::attention<P>::cost(attn(c), s))
        .then(residual)
        .then(n)
        .then(swiglu<P>::cost(ffn(c), s))
        .then(residual);
  }

  block(st::module_scope<P> scope, const config& c)
      : scope_(scope),
        rms_1_(scope / "rms_1", norm(c)),
        attn_(scope / "attn", attn(c)),
        rms_2_(scope / "rms_2", norm(c)),
        ffn_(scope / "ffn", ffn(c)) {}

  st::tensor_view<const T> forward(st::tensor_view<const T> x) {
    const std::int64_t n = x.numel();
    st::ensure_size(r_, scope_.ledger(), st::memory_category::activations, n);
    st::ensure_size(y_, scope_.ledger(), st::memory_category::activations, n);
    auto a = attn_.forward(rms_1_.forward(x));
    st::kernels::residual_forward(device{}, r_.data(), x.data, a.data, n);
    auto f = ffn_.forward(rms_2_.forward({r_.data(), x.shape}));
    st::kernels::residual_forward(device{}, y_.data(), r_.data(), f.data, n);
    return {y_.data(), x.shape};
  }
  st::buffer<T> backward(const st::buffer<T>& dy) {
    const auto n = std::int64_t(dy.size());
    st::buffer<T> dr = rms_2_.backward(ffn_.backward(dy));
    st::kernels::residual_forward(device{}, dr.data(), dr.data(), dy.data(), n);
    st::buffer<T> dx = rms_1_.backward(attn_.backward(dr));
    st::kernels::residual_forward(device{}, dx.data(), dx.data(), dr.data(), n);
    return dx;
  }
  void recompute_core(bool on) { attn_.recompute_core(on); }
  void release_activations() {
    rms_1_.release_activations();
    attn_.release_activations();
    rms_2_.release_activations();
    ffn_.release_activations();
    r_ = st::buffer<T>();
    y_ = st::buffer<T>();
  }
  template <class F>
  void visit_parameters(F&& f) const {
    rms_1_.visit_parameters(f);
    attn_.visit_parameters(f);
    rms_2_.visit_parameters(f);
    ffn_.visit_parameters(f);
  }

 private:
  using device = typename P::device;
  st::module_scope<P> scope_;
  rmsnorm<P> rms_1_;
  st::attention<P> attn_;
  rmsnorm<P> rms_2_;
  swiglu<P> ffn_;
  st::buffer<T> r_, y_;
};

// The shape, outside the template: the same config whatever the policy.
struct dims {
  std::int64_t vocab = 61, seq = 8, layers = 4, heads = 4, width = 32, hidden = 48;
};

// The declaration: all strata needs.
template <class P>
struct model {
  using policy = P;
  using config = dims;
  static constexpr auto layers(const dims& c) {
    return st::sequential(
        st::layer<st::embedding<P>>("embed", {.vocab = c.vocab, .max_seq = c.seq, .channels = c.width}),
        st::blocks<block<P>>("blocks", c.layers, {.channels = c.width, .heads = c.heads, .hidden = c.hidden}),
        st::layer<rmsnorm<P>>("norm", {.channels = c.width}),
        st::layer<st::lm_head<P>>("head", {.vocab = c.vocab, .channels = c.width}));
  }
};

}  // namespace custom
