// strata/kernels/host/swiglu.hpp - the SwiGLU gate, elementwise over [N, H].
//
//   gate_up [N, 2H]  per row: the H gate features z, then the H up features u
//   out     [N, H]   out = silu(z) · u,  silu(z) = z · sigmoid(z)
//   dz = dout · u · sigmoid(z) · (1 + z (1 - sigmoid(z))),  du = dout · silu(z)
//
// sigmoid as 1 / (1 + exp(-z)): exp overflow for very negative z gives sigmoid = 0 and
// silu = -0 cleanly, with no inf/inf. The exp is exp_fast (vector_math.hpp): the loops vectorise.
#pragma once
#include <cmath>
#include <cstdint>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/host/vector_math.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

namespace strata::kernels {

template <class T>
void swiglu_forward(host, T* out, const T* gate_up, std::int64_t N, std::int64_t H) {
  using A = acc_t<T>;
  STRATA_CHECK(N >= 0 && H > 0, "swiglu_forward: need N >= 0 and H > 0, got N = ", N, ", H = ", H);
#pragma omp parallel for schedule(static) if (N * H > 65536)
  for (std::int64_t n = 0; n < N; ++n) {
    const T* z = gate_up + n * 2 * H;
    const T* u = z + H;
    T* y = out + n * H;
    for (std::int64_t i = 0; i < H; ++i) {
      const A zi = convert<A>(z[i]);
      const A sig = A(1) / (A(1) + exp_fast(-zi));
      y[i] = convert<T>(zi * sig * convert<A>(u[i]));
    }
  }
}

// Writes dgate_up [N, 2H] (not read): an input's gradient, as every backward kernel writes it.
template <class T>
void swiglu_backward(host, T* dgate_up, const T* dout, const T* gate_up, std::int64_t N, std::int64_t H) {
  using A = acc_t<T>;
  STRATA_CHECK(N >= 0 && H > 0, "swiglu_backward: need N >= 0 and H > 0, got N = ", N, ", H = ", H);
#pragma omp parallel for schedule(static) if (N * H > 65536)
  for (std::int64_t n = 0; n < N; ++n) {
    const T* z = gate_up + n * 2 * H;
    const T* u = z + H;
    const T* dy = dout + n * H;
    T* dz = dgate_up + n * 2 * H;
    T* du = dz + H;
    for (std::int64_t i = 0; i < H; ++i) {
      const A zi = convert<A>(z[i]), g = convert<A>(dy[i]);
      const A sig = A(1) / (A(1) + exp_fast(-zi));
      dz[i] = convert<T>(g * convert<A>(u[i]) * sig * (A(1) + zi * (A(1) - sig)));
      du[i] = convert<T>(g * zi * sig);
    }
  }
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(swiglu_forward)
STRATA_HOST_KERNEL(swiglu_backward)

}  // namespace strata::kernels
