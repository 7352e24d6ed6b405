// strata/policy/precision.hpp - precision policies: what weights and activations are stored
// in, what the optimizer's master copy is kept in, and how the loss is scaled.
//
//   st::mixed<st::bf16, float>   bf16 storage and compute (fp32 accumulation), fp32 master weights
//   st::mixed<st::fp16, float>   the same in fp16, with dynamic loss scaling by default
//   st::fp32 / st::fp64          one type throughout; the weights are their own master copy
#pragma once
#include <type_traits>

#include "strata/core/dtype.hpp"

namespace strata {

struct loss_scaling_tag {};
// No scaling: the loss gradient is used as it is (fp32, bf16: their range needs none).
struct no_loss_scaling : loss_scaling_tag {};
// Dynamic scaling for fp16: start at 2^16, halve and skip the step on overflow, double after
// `GrowthInterval` clean steps.
template <int GrowthInterval = 2000>
struct dynamic_loss_scaling : loss_scaling_tag {
  static_assert(GrowthInterval >= 1, "strata::dynamic_loss_scaling: growth interval must be >= 1");
  static constexpr int growth_interval = GrowthInterval;
};

template <class T>
struct is_dynamic_loss_scaling : std::false_type {};
template <int G>
struct is_dynamic_loss_scaling<dynamic_loss_scaling<G>> : std::true_type {};

template <class Storage>
using default_loss_scaling = std::conditional_t<std::is_same_v<Storage, fp16>, dynamic_loss_scaling<>, no_loss_scaling>;

struct precision_tag {};

template <class Storage, class Master = Storage, class LossScaling = default_loss_scaling<Storage>>
struct mixed : precision_tag {
  static_assert(is_scalar_v<Storage>,
                "strata::mixed<Storage, ...>: Storage must be float, double, strata::bf16 or strata::fp16");
  static_assert(std::is_same_v<Master, float> || std::is_same_v<Master, double>,
                "strata::mixed<..., Master>: master weights must be float or double");
  static_assert(std::is_base_of_v<loss_scaling_tag, LossScaling>,
                "strata::mixed<..., LossScaling>: expected no_loss_scaling or dynamic_loss_scaling<N>");
  static_assert(sizeof(Master) >= sizeof(Storage),
                "strata::mixed: the master copy must be at least as wide as the storage type");

  using storage = Storage;            // weights, gradients and activations
  using master = Master;              // optimizer's copy of the weights and its moments
  using accumulate = acc_t<Storage>;  // what sums and dot products accumulate in
  using loss_scaling = LossScaling;
  // When storage and master agree, the weights are the master copy: no extra bytes.
  static constexpr bool keeps_master_copy = !std::is_same_v<Storage, Master>;
  static constexpr bool dynamic_loss_scale = is_dynamic_loss_scaling<LossScaling>::value;
};

using fp32 = mixed<float, float, no_loss_scaling>;
using fp64 = mixed<double, double, no_loss_scaling>;

template <class T>
inline constexpr bool is_precision_v = std::is_base_of_v<precision_tag, T>;

}  // namespace strata
