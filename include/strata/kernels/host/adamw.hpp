// strata/kernels/host/adamw.hpp - one AdamW step over a flat array of parameters.
//
//   master, m, v [n] (M = float or double);  weights, grad [n] (T, the storage type)
//
// Follows torch.optim.AdamW (single-tensor path) operation by operation, in M:
//   g = grad * grad_scale
//   p *= 1 - lr * weight_decay                         (decoupled decay, before the Adam step)
//   m  = lerp(m, g, 1 - beta1)                          (= beta1 m + (1 - beta1) g)
//   v  = v * beta2 + (1 - beta2) g^2
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// then weights = convert<T>(p). grad_scale folds gradient clipping and loss-scale removal in.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/policy/device.hpp"

namespace strata::kernels {

struct adamw_hyper {
  double lr;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// weights may alias master when T == M (the weights are their own master copy).
template <class T, class M>
void adamw_update(host, M* master, T* weights, const T* grad, M* m, M* v, std::int64_t n,
                  const adamw_hyper& h, int step, double grad_scale) {
  static_assert(std::is_same_v<M, float> || std::is_same_v<M, double>,
                "strata::kernels::adamw_update: master weights and moments must be float or double");
  STRATA_CHECK(n >= 0, "adamw_update: negative length ", n);
  STRATA_CHECK(step >= 1, "adamw_update: step is 1-based, got ", step);
  STRATA_CHECK(h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1,
               "adamw_update: betas must lie in [0, 1), got beta1 = ", h.beta1, ", beta2 = ", h.beta2);

  // Step-dependent scalars in double, as PyTorch computes them in Python floats.
  const double bias_correction1 = 1.0 - std::pow(h.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, step);
  const M decay = M(1.0 - h.lr * h.weight_decay);
  const M step_size = M(h.lr / bias_correction1);
  const M bc2_sqrt = M(std::sqrt(bias_correction2));
  const M one_minus_b1 = M(1.0 - h.beta1), b2 = M(h.beta2), one_minus_b2 = M(1.0 - h.beta2);
  const M eps = M(h.eps), scale = M(grad_scale);

  // torch.lerp(m, g, w) picks its formula by the weight w = 1 - beta1, for accuracy near
  // either end, and forms 1 - w itself (not beta1) in the working precision.
  const bool lerp_from_start = one_minus_b1 < M(0.5);
  const M one_minus_w = M(1) - one_minus_b1;

#pragma omp parallel for schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) {
    const M g = convert<M>(grad[i]) * scale;
    M p = master[i] * decay;
    const M mi = lerp_from_start ? m[i] + one_minus_b1 * (g - m[i]) : g - (g - m[i]) * one_minus_w;
    const M vi = v[i] * b2 + one_minus_b2 * g * g;
    const M denom = std::sqrt(vi) / bc2_sqrt + eps;
    p = p - step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    weights[i] = convert<T>(p);
  }
}

}  // namespace strata::kernels
