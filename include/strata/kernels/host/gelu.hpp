// strata/kernels/host/gelu.hpp - GELU, element-wise, in the tanh approximation (GPT-2's, the
// default) or exact (gelu_form.hpp); and bias_gelu_backward, GELU's backward with the bias
// gradient of the projection before it.
//
// tanh:
//   out = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)          inp, out [n]
//   dinp  = dout * (0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3*0.044715 x^2))
//
// Evaluated through s = sigmoid(2u) = (1 + tanh u) / 2, which is the same function:
//   out = x s,  d out / dx = s + 2 x s (1 - s) du/dx.
// One exp instead of tanh, and no cancellation anywhere: 1 + tanh(u) is never formed by
// subtraction, and exp overflow gives s = 0 cleanly. The exp is exp_fast (vector_math.hpp), so
// the float loops vectorise; double keeps std::exp.
//
// exact:
//   out = x Φ(x),  Φ(x) = erfc(-x / sqrt 2) / 2,   d out / dx = Φ(x) + x φ(x),  φ(x) = exp(-x²/2) / sqrt(2π)
// Φ through erfc, not 1 + erf: no cancellation for large negative x.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/gelu_form.hpp"
#include "strata/kernels/host/column_sum.hpp"
#include "strata/kernels/host/vector_math.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

namespace strata::kernels {

namespace gelu_detail {
template <class A>
inline constexpr A sqrt_2_over_pi = A(0.7978845608028654);
template <class A>
inline constexpr A cubic = A(0.044715);

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
// d GELU(x) / dx
template <class A>
[[gnu::always_inline]] inline A derivative(A x) {
  const A s = half_one_plus_tanh(x);
  return s + A(2) * x * s * (A(1) - s) * du_dx(x);
}

// The exact form: Φ(x) and d(x Φ(x))/dx, in the accumulation type.
template <class A>
inline A exact_cdf(A x) {
  return A(0.5) * std::erfc(-x * A(0.7071067811865476));
}
template <class A>
inline A exact_derivative(A x) {
  return exact_cdf(x) + x * A(0.3989422804014327) * std::exp(A(-0.5) * x * x);
}

// One row of bias_gelu_backward: dx = dy · GELU'(x), and its values (as stored) added to db.
// restrict: the caller's arrays never overlap, and with four streams the compiler would
// otherwise not vectorise.
template <class T, class A>
inline void backward_row_with_bias(T* __restrict dx, A* __restrict db, const T* __restrict x, const T* __restrict dy,
                                   std::int64_t n, gelu_form form) {
  if (form == gelu_form::exact) {
    for (std::int64_t i = 0; i < n; ++i) {
      dx[i] = convert<T>(exact_derivative(convert<A>(x[i])) * convert<A>(dy[i]));
      db[i] += convert<A>(dx[i]);
    }
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    dx[i] = convert<T>(derivative(convert<A>(x[i])) * convert<A>(dy[i]));
    db[i] += convert<A>(dx[i]);
  }
}
}  // namespace gelu_detail

template <class T>
void gelu_forward(host, T* out, const T* inp, std::int64_t n, gelu_form form = gelu_form::tanh) {
  using A = acc_t<T>;
  using namespace gelu_detail;
  STRATA_CHECK(n >= 0, "gelu_forward: negative length ", n);
  if (form == gelu_form::exact) {
#pragma omp parallel for schedule(static) if (n > 16384)
    for (std::int64_t i = 0; i < n; ++i) {
      const A x = convert<A>(inp[i]);
      out[i] = convert<T>(x * exact_cdf(x));
    }
    return;
  }
#pragma omp parallel for schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) {
    const A x = convert<A>(inp[i]);
    out[i] = convert<T>(x * half_one_plus_tanh(x));
  }
}

// Writes dinp (not read: a fresh buffer need not be zeroed).
template <class T>
void gelu_backward(host, T* dinp, const T* inp, const T* dout, std::int64_t n, gelu_form form = gelu_form::tanh) {
  using A = acc_t<T>;
  using namespace gelu_detail;
  STRATA_CHECK(n >= 0, "gelu_backward: negative length ", n);
  if (form == gelu_form::exact) {
#pragma omp parallel for schedule(static) if (n > 16384)
    for (std::int64_t i = 0; i < n; ++i)
      dinp[i] = convert<T>(exact_derivative(convert<A>(inp[i])) * convert<A>(dout[i]));
    return;
  }
#pragma omp parallel for schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) dinp[i] = convert<T>(derivative(convert<A>(inp[i])) * convert<A>(dout[i]));
}

// GELU's backward fused with the bias gradient of the projection before it (pre = x·Wᵀ + bias,
// act = GELU(pre)): dpre [N, OC] = dact · GELU'(pre) (written, not read), and dbias [OC] (nullable)
// += the column sums of dpre as stored, summed in the same pass by fixed chunks of rows
// (column_sum.hpp), so the sums do not depend on the thread count.
template <class T>
void bias_gelu_backward(host, T* dpre, std::type_identity_t<T>* dbias /*nullable*/, const T* pre, const T* dact,
                        std::int64_t N, std::int64_t OC, gelu_form form = gelu_form::tanh) {
  using A = acc_t<T>;
  STRATA_CHECK(N >= 0 && OC > 0, "bias_gelu_backward: need N >= 0 and OC > 0, got N = ", N, ", OC = ", OC);
  if (!dbias) return gelu_backward(host{}, dpre, pre, dact, N * OC, form);
  const column_sum::row_chunks chunks(N);
  std::vector<A> partial(std::size_t(chunks.count * OC));
#pragma omp parallel for schedule(static) if (N * OC > 65536)
  for (std::int64_t k = 0; k < chunks.count; ++k)
    for (std::int64_t n = chunks.begin(k); n < chunks.end(k); ++n)
      gelu_detail::backward_row_with_bias(dpre + n * OC, partial.data() + k * OC, pre + n * OC, dact + n * OC, OC,
                                          form);
  column_sum::add_chunk_sums(dbias, partial.data(), chunks.count, OC, OC);
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(gelu_forward)
STRATA_HOST_KERNEL(gelu_backward)
STRATA_HOST_KERNEL(bias_gelu_backward)

}  // namespace strata::kernels
