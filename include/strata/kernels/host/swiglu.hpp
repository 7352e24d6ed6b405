// strata/kernels/host/swiglu.hpp - the SwiGLU gate, elementwise over [N, H].
//
//   gate_up [N, 2H]  per row: the H gate features z, then the H up features u
//   out     [N, H]   out = silu(z) · u,  silu(z) = z · sigmoid(z)
//   dz = dout · u · sigmoid(z) · (1 + z (1 - sigmoid(z))),  du = dout · silu(z)
//
// sigmoid as 1 / (1 + exp(-z)): exp overflow for very negative z gives sigmoid = 0 and
// silu = -0 cleanly, with no inf/inf. Written with the element-wise building block
// (kernels/elementwise.hpp): the gate and up halves are strided operands of gate_up, and the
// functors below are the whole op, run on the GPU too (kernels/cuda/swiglu.cuh). The exp is
// hd_exp: exp_fast on the host (vector_math.hpp, the loops vectorise), expf on the GPU.
#pragma once
#include <cstdint>

#include "strata/core/config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/host/elementwise.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

namespace strata::kernels {

namespace swiglu_detail {
struct forward_op {
  template <class A>
  STRATA_HD STRATA_ALWAYS_INLINE void operator()(A& y, A z, A u) const {
    const A sig = A(1) / (A(1) + hd_exp(-z));
    y = z * sig * u;
  }
};
struct backward_op {
  template <class A>
  STRATA_HD STRATA_ALWAYS_INLINE void operator()(A& dz, A& du, A g, A z, A u) const {
    const A sig = A(1) / (A(1) + hd_exp(-z));
    dz = g * u * sig * (A(1) + z * (A(1) - sig));
    du = g * z * sig;
  }
};

template <class D, class T>
void forward(D d, T* out, const T* gate_up, std::int64_t N, std::int64_t H) {
  STRATA_CHECK(N >= 0 && H > 0, "swiglu_forward: need N >= 0 and H > 0, got N = ", N, ", H = ", H);
  elementwise(d, N, H, outputs(out), inputs(strided(gate_up, 2 * H), strided(gate_up + H, 2 * H)), forward_op{});
}
template <class D, class T>
void backward(D d, T* dgate_up, const T* dout, const T* gate_up, std::int64_t N, std::int64_t H) {
  STRATA_CHECK(N >= 0 && H > 0, "swiglu_backward: need N >= 0 and H > 0, got N = ", N, ", H = ", H);
  elementwise(d, N, H, outputs(strided(dgate_up, 2 * H), strided(dgate_up + H, 2 * H)),
              inputs(dout, strided(gate_up, 2 * H), strided(gate_up + H, 2 * H)), backward_op{});
}
}  // namespace swiglu_detail

template <class T>
void swiglu_forward(host, T* out, const T* gate_up, std::int64_t N, std::int64_t H) {
  swiglu_detail::forward(host{}, out, gate_up, N, H);
}

// Writes dgate_up [N, 2H] (not read): an input's gradient, as every backward kernel writes it.
template <class T>
void swiglu_backward(host, T* dgate_up, const T* dout, const T* gate_up, std::int64_t N, std::int64_t H) {
  swiglu_detail::backward(host{}, dgate_up, dout, gate_up, N, H);
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(swiglu_forward)
STRATA_HOST_KERNEL(swiglu_backward)

}  // namespace strata::kernels
