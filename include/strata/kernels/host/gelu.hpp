// strata/kernels/host/gelu.hpp - GELU, tanh approximation (GPT-2's), elementwise.
//
//   out = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)          inp, out [n]
//   dinp  = dout * (0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3*0.044715 x^2))
//
// Evaluated through s = sigmoid(2u) = (1 + tanh u) / 2, which is the same function:
//   out = x s,  d out / dx = s + 2 x s (1 - s) du/dx.
// One exp instead of tanh, and no cancellation anywhere: 1 + tanh(u) is never formed by
// subtraction, and exp overflow gives s = 0 cleanly. The exp is exp_fast (vector_math.hpp), so
// the float loops vectorise; double keeps std::exp.
#pragma once
#include <cmath>
#include <cstdint>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/host/vector_math.hpp"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace gelu_detail {
template <class A> inline constexpr A sqrt_2_over_pi = A(0.7978845608028654);
template <class A> inline constexpr A cubic = A(0.044715);

// s = sigmoid(2u) = (1 + tanh u) / 2, for the GELU argument u of x.
template <class A>
[[gnu::always_inline]] inline A half_one_plus_tanh(A x) {
  const A u = sqrt_2_over_pi<A> * (x + cubic<A> * x * x * x);
  return A(1) / (A(1) + exp_fast(A(-2) * u));
}
template <class A>
[[gnu::always_inline]] inline A du_dx(A x) {
  return sqrt_2_over_pi<A> * (A(1) + A(3) * cubic<A> * x * x);
}
}  // namespace gelu_detail

template <class T>
void gelu_forward(host, T* out, const T* inp, std::int64_t n) {
  using A = acc_t<T>;
  using namespace gelu_detail;
  STRATA_CHECK(n >= 0, "gelu_forward: negative length ", n);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) {
    const A x = convert<A>(inp[i]);
    out[i] = convert<T>(x * half_one_plus_tanh(x));
  }
}

// Writes dinp (not read: a fresh buffer need not be zeroed).
template <class T>
void gelu_backward(host, T* dinp, const T* inp, const T* dout, std::int64_t n) {
  using A = acc_t<T>;
  using namespace gelu_detail;
  STRATA_CHECK(n >= 0, "gelu_backward: negative length ", n);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) {
    const A x = convert<A>(inp[i]);
    const A s = half_one_plus_tanh(x);
    const A local = s + A(2) * x * s * (A(1) - s) * du_dx(x);
    dinp[i] = convert<T>(local * convert<A>(dout[i]));
  }
}

}  // namespace strata::kernels
