// strata/kernels/host/residual.hpp - the residual connection: out = a + b, elementwise.
//
//   a, b, out, da, db, dout [n]; out may alias a or b (each element is read before written)
#pragma once
#include <cstdint>
#include <type_traits>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

namespace strata::kernels {

template <class T>
void residual_forward(host, T* out, const T* a, const T* b, std::int64_t n) {
  using A = acc_t<T>;
  STRATA_CHECK(n >= 0, "residual_forward: negative length ", n);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) out[i] = convert<T>(convert<A>(a[i]) + convert<A>(b[i]));
}

// Writes dout into both da and db (either may be null to skip it): the inputs' gradients, written
// as every backward kernel writes its input's (docs/architecture.md, "A training step"). A layer
// whose input also feeds another branch adds the two with residual_forward.
template <class T>
void residual_backward(host, std::type_identity_t<T>* da /*nullable*/, std::type_identity_t<T>* db /*nullable*/,
                       const T* dout, std::int64_t n) {
  STRATA_CHECK(n >= 0, "residual_backward: negative length ", n);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) {
    if (da) da[i] = dout[i];
    if (db) db[i] = dout[i];
  }
}

// Compiled once where a program asks (kernels/host/instantiation.hpp).
STRATA_HOST_KERNEL(residual_forward)
STRATA_HOST_KERNEL(residual_backward)

}  // namespace strata::kernels
