// strata/kernels/host/residual.hpp - the residual connection: out = a + b, elementwise.
//
//   a, b, out, da, db, dout [n]; out may alias a or b (each element is read before written)
//
// Written with the element-wise building block (kernels/elementwise.hpp): the functors below
// are the whole op, and kernels/cuda/residual.cuh runs the same ones on the GPU.
#pragma once
#include <cstdint>
#include <type_traits>

#include "strata/core/config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/host/elementwise.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

namespace strata::kernels {

namespace residual_detail {
struct add {
  template <class A>
  STRATA_HD STRATA_ALWAYS_INLINE void operator()(A& out, A a, A b) const {
    out = a + b;
  }
};
struct copy {
  template <class A>
  STRATA_HD STRATA_ALWAYS_INLINE void operator()(A& out, A g) const {
    out = g;
  }
};
struct copy2 {
  template <class A>
  STRATA_HD STRATA_ALWAYS_INLINE void operator()(A& x, A& y, A g) const {
    x = g, y = g;
  }
};

// The whole op on either device: out = a + b; da = db = dout (either may be null).
template <class D, class T>
void forward(D d, T* out, const T* a, const T* b, std::int64_t n) {
  STRATA_CHECK(n >= 0, "residual_forward: negative length ", n);
  elementwise(d, n, outputs(out), inputs(a, b), add{});
}
template <class D, class T>
void backward(D d, T* da, T* db, const T* dout, std::int64_t n) {
  STRATA_CHECK(n >= 0, "residual_backward: negative length ", n);
  if (da && db) elementwise(d, n, outputs(da, db), inputs(dout), copy2{});
  else if (da || db) elementwise(d, n, outputs(da ? da : db), inputs(dout), copy{});
}
}  // namespace residual_detail

template <class T>
void residual_forward(host, T* out, const T* a, const T* b, std::int64_t n) {
  residual_detail::forward(host{}, out, a, b, n);
}

// Writes dout into both da and db (either may be null to skip it): the inputs' gradients, written
// as every backward kernel writes its input's (docs/architecture.md, "A training step"). A layer
// whose input also feeds another branch adds the two with residual_forward.
template <class T>
void residual_backward(host, std::type_identity_t<T>* da /*nullable*/, std::type_identity_t<T>* db /*nullable*/,
                       const T* dout, std::int64_t n) {
  residual_detail::backward(host{}, da, db, dout, n);
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(residual_forward)
STRATA_HOST_KERNEL(residual_backward)

}  // namespace strata::kernels
