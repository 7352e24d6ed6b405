// strata/policy/policy.hpp - the one type a model is instantiated with: device, parallel
// layout and precision, fixed at compile time.
//
//   using Policy = st::policy<st::host, st::parallel<st::data<st::dynamic>>, st::fp32>;
#pragma once
#include <type_traits>

#include "strata/policy/device.hpp"
#include "strata/policy/parallel.hpp"
#include "strata/policy/precision.hpp"

namespace strata {

template <class Device, class Layout = serial, class Precision = fp32>
struct policy {
  static_assert(is_device_v<Device>, "strata::policy<Device, ...>: Device must be strata::host or strata::cuda");
  static_assert(is_precision_v<Precision>,
                "strata::policy<..., Precision>: expected strata::mixed<...>, strata::fp32 or strata::fp64");

  using device = Device;
  using layout = Layout;
  using precision = Precision;
  using storage = typename Precision::storage;
  using master = typename Precision::master;
  using accumulate = typename Precision::accumulate;
};

}  // namespace strata
