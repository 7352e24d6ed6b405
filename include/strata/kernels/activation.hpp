// strata/kernels/activation.hpp - the feed-forward activations, element-wise and gated, written
// once for every device with the element-wise building block (kernels/elementwise.hpp):
//
//   activation_forward(dev, out, x, n, a)           out = a(x)                       [n]
//   activation_backward(dev, dx, x, dout, n, a)     dx = dout · a'(x)   (written, not read)
//   glu_forward(dev, out, gate_up, N, H, a)         out = a(z) · u                   [N, H]
//   glu_backward(dev, dgate_up, dout, gate_up, N, H, a)
//        dz = dout · u · a'(z), du = dout · a(z)    (dgate_up [N, 2H] written, not read)
//
// gate_up [N, 2H] holds per row the H gate features z, then the H up features u: a(z)·u with a =
// silu is SwiGLU (Llama), gelu GeGLU (Gemma), relu ReGLU.
//
//   gelu_tanh      x·s, s = sigmoid(2u), u = sqrt(2/pi)(x + 0.044715x³) (GPT-2; HF "gelu_new")
//   gelu_exact     x·Φ(x), Φ(x) = erfc(-x/√2)/2 (GPT-NeoX, Pythia, BERT; HF "gelu")
//   silu           x·sigmoid(x) (Llama's gate; HF "silu")
//   relu           max(x, 0), derivative 0 at 0
//   relu_squared   max(x, 0)² (Primer, nanoGPT speedruns)
//
// Each element is computed alone: the same bits at any thread count. On the host in acc_t of the
// storage type; on the GPU in float.
#pragma once
#include <cstdint>

#include "strata/core/config.hpp"
#include "strata/core/error.hpp"
#include "strata/core/hd_math.hpp"
#include "strata/kernels/elementwise.hpp"
#include "strata/kernels/gelu_form.hpp"
#include "strata/policy/device.hpp"

namespace strata {

enum class activation { gelu_tanh, gelu_exact, silu, relu, relu_squared };

constexpr const char* activation_name(activation a) {
  switch (a) {
    case activation::gelu_tanh: return "gelu_tanh";
    case activation::gelu_exact: return "gelu_exact";
    case activation::silu: return "silu";
    case activation::relu: return "relu";
    case activation::relu_squared: return "relu_squared";
  }
  return "?";
}
// The GELU form of a GELU activation (what a projection's fused GELU takes).
constexpr bool is_gelu(activation a) { return a == activation::gelu_tanh || a == activation::gelu_exact; }
constexpr gelu_form gelu_form_of(activation a) {
  return a == activation::gelu_exact ? gelu_form::exact : gelu_form::tanh;
}

}  // namespace strata

namespace strata::kernels {

namespace activation_detail {
// a(x) and a'(x) for activation K.
template <activation K>
struct fn {
  template <class A>
  STRATA_HD STRATA_ALWAYS_INLINE static A sigmoid(A x) {
    return A(1) / (A(1) + hd_exp(-x));
  }
  template <class A>
  STRATA_HD STRATA_ALWAYS_INLINE static A value(A x) {
    if constexpr (K == activation::gelu_tanh) {
      return x * sigmoid(A(2) * A(0.7978845608028654) * (x + A(0.044715) * x * x * x));
    } else if constexpr (K == activation::gelu_exact) {
      return x * A(0.5) * hd::erfc(-x * A(0.7071067811865476));
    } else if constexpr (K == activation::silu) {
      return x * sigmoid(x);
    } else if constexpr (K == activation::relu) {
      return x > A(0) ? x : A(0);
    } else {
      const A r = x > A(0) ? x : A(0);
      return r * r;
    }
  }
  template <class A>
  STRATA_HD STRATA_ALWAYS_INLINE static A slope(A x) {
    if constexpr (K == activation::gelu_tanh) {
      const A s = sigmoid(A(2) * A(0.7978845608028654) * (x + A(0.044715) * x * x * x));
      return s + A(2) * x * s * (A(1) - s) * A(0.7978845608028654) * (A(1) + A(3) * A(0.044715) * x * x);
    } else if constexpr (K == activation::gelu_exact) {
      return A(0.5) * hd::erfc(-x * A(0.7071067811865476)) + x * A(0.3989422804014327) * hd_exp(A(-0.5) * x * x);
    } else if constexpr (K == activation::silu) {
      const A s = sigmoid(x);
      return s * (A(1) + x * (A(1) - s));
    } else if constexpr (K == activation::relu) {
      return x > A(0) ? A(1) : A(0);
    } else {
      return x > A(0) ? A(2) * x : A(0);
    }
  }
};

template <activation K>
struct forward_op {
  template <class A>
  STRATA_HD STRATA_ALWAYS_INLINE void operator()(A& y, A x) const {
    y = fn<K>::value(x);
  }
};
template <activation K>
struct backward_op {
  template <class A>
  STRATA_HD STRATA_ALWAYS_INLINE void operator()(A& dx, A g, A x) const {
    dx = g * fn<K>::slope(x);
  }
};
template <activation K>
struct glu_forward_op {
  template <class A>
  STRATA_HD STRATA_ALWAYS_INLINE void operator()(A& y, A z, A u) const {
    y = fn<K>::value(z) * u;
  }
};
template <activation K>
struct glu_backward_op {
  template <class A>
  STRATA_HD STRATA_ALWAYS_INLINE void operator()(A& dz, A& du, A g, A z, A u) const {
    dz = g * u * fn<K>::slope(z);
    du = g * fn<K>::value(z);
  }
};

// Calls f with activation a as a compile-time constant (one specialised loop per activation).
template <class F>
void with_kind(activation a, F&& f) {
  switch (a) {
    case activation::gelu_tanh: return f.template operator()<activation::gelu_tanh>();
    case activation::gelu_exact: return f.template operator()<activation::gelu_exact>();
    case activation::silu: return f.template operator()<activation::silu>();
    case activation::relu: return f.template operator()<activation::relu>();
    case activation::relu_squared: return f.template operator()<activation::relu_squared>();
  }
  fail("activation: unknown kind ", int(a));
}
}  // namespace activation_detail

template <class D, class T>
void activation_forward(D d, T* out, const T* x, std::int64_t n, activation a) {
  STRATA_CHECK(n >= 0, "activation_forward: negative length ", n);
  activation_detail::with_kind(
      a, [&]<activation K>() { elementwise(d, n, outputs(out), inputs(x), activation_detail::forward_op<K>{}); });
}

template <class D, class T>
void activation_backward(D d, T* dx, const T* x, const T* dout, std::int64_t n, activation a) {
  STRATA_CHECK(n >= 0, "activation_backward: negative length ", n);
  activation_detail::with_kind(
      a, [&]<activation K>() { elementwise(d, n, outputs(dx), inputs(dout, x), activation_detail::backward_op<K>{}); });
}

template <class D, class T>
void glu_forward(D d, T* out, const T* gate_up, std::int64_t N, std::int64_t H, activation a) {
  STRATA_CHECK(N >= 0 && H > 0, "glu_forward: need N >= 0 and H > 0, got N = ", N, ", H = ", H);
  activation_detail::with_kind(a, [&]<activation K>() {
    elementwise(d, N, H, outputs(out), inputs(strided(gate_up, 2 * H), strided(gate_up + H, 2 * H)),
                activation_detail::glu_forward_op<K>{});
  });
}

template <class D, class T>
void glu_backward(D d, T* dgate_up, const T* dout, const T* gate_up, std::int64_t N, std::int64_t H, activation a) {
  STRATA_CHECK(N >= 0 && H > 0, "glu_backward: need N >= 0 and H > 0, got N = ", N, ", H = ", H);
  activation_detail::with_kind(a, [&]<activation K>() {
    elementwise(d, N, H, outputs(strided(dgate_up, 2 * H), strided(dgate_up + H, 2 * H)),
                inputs(dout, strided(gate_up, 2 * H), strided(gate_up + H, 2 * H)),
                activation_detail::glu_backward_op<K>{});
  });
}

}  // namespace strata::kernels
