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
// then weights = convert<T>(p). grad_scale folds gradient clipping and loss-scale removal in;
// the step_state overload takes t, the bias corrections and grad_scale from the trainer's state.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/step_state.hpp"
#include "strata/policy/device.hpp"
#include "strata/kernels/host/instantiation.hpp"

namespace strata::kernels {

struct adamw_hyper {
  double lr;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

namespace adamw_detail {
// A step's scalars in M, derived in double as PyTorch computes them in Python floats.
template <class M>
struct scalars {
  M decay, step_size, bc2_sqrt, one_minus_b1, b2, one_minus_b2, eps, scale, one_minus_w;
};

// One loop per choice (the lerp formula; whether the weights are a separate array), each free of
// branches so it vectorises (built with -fno-math-errno, as strata's programs are: otherwise
// std::sqrt keeps a branch for errno). The scalars are const locals, so each thread keeps them in
// registers rather than reloading them after every store.
template <bool FromStart, bool SeparateWeights, class T, class M>
void sweep(M* master, T* weights, const T* grad, M* m, M* v, std::int64_t n, const scalars<M>& s) {
  const M decay = s.decay, step_size = s.step_size, bc2_sqrt = s.bc2_sqrt, one_minus_b1 = s.one_minus_b1;
  const M b2 = s.b2, one_minus_b2 = s.one_minus_b2, eps = s.eps, scale = s.scale, one_minus_w = s.one_minus_w;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) {
    const M g = convert<M>(grad[i]) * scale;
    M p = master[i] * decay;
    M mi;
    if constexpr (FromStart) mi = m[i] + one_minus_b1 * (g - m[i]);
    else mi = g - (g - m[i]) * one_minus_w;
    const M vi = v[i] * b2 + one_minus_b2 * g * g;
    const M denom = std::sqrt(vi) / bc2_sqrt + eps;
    p = p - step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    if constexpr (SeparateWeights) weights[i] = convert<T>(p);
  }
}

// The update itself, given the bias corrections 1 - beta1^t and 1 - beta2^t of the step t.
template <class T, class M>
void update(M* master, T* weights, const T* grad, M* m, M* v, std::int64_t n, const adamw_hyper& h,
            double bias_correction1, double bias_correction2, double grad_scale) {
  static_assert(std::is_same_v<M, float> || std::is_same_v<M, double>,
                "strata::kernels::adamw_update: master weights and moments must be float or double");
  STRATA_CHECK(n >= 0, "adamw_update: negative length ", n);
  STRATA_CHECK(h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1,
               "adamw_update: betas must lie in [0, 1), got beta1 = ", h.beta1, ", beta2 = ", h.beta2);
  scalars<M> s;
  s.decay = M(1.0 - h.lr * h.weight_decay);
  s.step_size = M(h.lr / bias_correction1);
  s.bc2_sqrt = M(std::sqrt(bias_correction2));
  s.one_minus_b1 = M(1.0 - h.beta1);
  s.b2 = M(h.beta2);
  s.one_minus_b2 = M(1.0 - h.beta2);
  s.eps = M(h.eps);
  s.scale = M(grad_scale);
  // torch.lerp(m, g, w) picks its formula by the weight w = 1 - beta1, for accuracy near
  // either end, and forms 1 - w itself (not beta1) in the working precision.
  const bool from_start = s.one_minus_b1 < M(0.5);
  s.one_minus_w = M(1) - s.one_minus_b1;

  bool separate = true;  // weights that are the master copy itself are stored once
  if constexpr (std::is_same_v<T, M>) separate = weights != master;
  if (from_start)
    separate ? sweep<true, true>(master, weights, grad, m, v, n, s)
             : sweep<true, false>(master, weights, grad, m, v, n, s);
  else
    separate ? sweep<false, true>(master, weights, grad, m, v, n, s)
             : sweep<false, false>(master, weights, grad, m, v, n, s);
}
}  // namespace adamw_detail

// Step t = `step` (1-based), every gradient multiplied by grad_scale. weights may alias master
// when T == M (the weights are their own master copy).
template <class T, class M>
void adamw_update(host, M* master, T* weights, const T* grad, M* m, M* v, std::int64_t n, const adamw_hyper& h,
                  int step, double grad_scale) {
  STRATA_CHECK(step >= 1, "adamw_update: step is 1-based, got ", step);
  adamw_detail::update(master, weights, grad, m, v, n, h, 1.0 - std::pow(h.beta1, step), 1.0 - std::pow(h.beta2, step),
                       grad_scale);
}

// The step the trainer's step_state decided (core/step_state.hpp): nothing when state->apply
// is 0; otherwise its bias corrections and its multiplier (clip / loss scale, times grad_scale).
// h.beta1/beta2 must equal the step_rules'. The GPU overload reads the state on the device.
template <class T, class M>
void adamw_update(host, M* master, T* weights, const T* grad, M* m, M* v, std::int64_t n, const adamw_hyper& h,
                  const step_state* state, double grad_scale = 1.0) {
  STRATA_CHECK(state != nullptr, "adamw_update: the state-driven overload needs a step_state");
  if (!state->apply) return;
  adamw_detail::update(master, weights, grad, m, v, n, h, state->bias_correction1, state->bias_correction2,
                       grad_scale * state->grad_mult);
}

// Compiled once where a program asks (kernels/host/instantiation.hpp): each storage type with
// the master type its precisions keep (fp32 and fp64 are their own master; bf16 and fp16 keep fp32).
#define STRATA_HOST_ADAMW(type, master)                                                                            \
  STRATA_HOST_KERNEL_AS(type, void adamw_update<type, master>(host, master*, type*, const type*, master*, master*, \
                                                              std::int64_t, const adamw_hyper&, int, double))      \
  STRATA_HOST_KERNEL_AS(                                                                                           \
      type, void adamw_update<type, master>(host, master*, type*, const type*, master*, master*, std::int64_t,     \
                                            const adamw_hyper&, const step_state*, double))
STRATA_HOST_ADAMW(float, float)
STRATA_HOST_ADAMW(double, double)
STRATA_HOST_ADAMW(bf16, float)
STRATA_HOST_ADAMW(fp16, float)
#undef STRATA_HOST_ADAMW

}  // namespace strata::kernels
