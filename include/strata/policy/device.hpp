// strata/policy/device.hpp - the device tags: where a policy's kernels and memory live.
//
// A device is an empty tag type, refined from device_tag, so templates dispatch on it at
// compile time and nothing is stored. st::host runs every kernel on the CPU (and is what CI
// tests); st::cuda runs the same model on NVIDIA GPUs. A user tag derived from one of them
// (struct my_gpu : st::cuda {}) is treated as that device.
#pragma once
#include <string_view>
#include <type_traits>

namespace strata {

struct device_tag {};
struct host : device_tag {};
struct cuda : device_tag {};

// True for host, cuda and tags derived from them; false for device_tag itself and anything else.
template <class T>
inline constexpr bool is_device_v = std::is_base_of_v<device_tag, T> && !std::is_same_v<T, device_tag>;

namespace detail {
template <class Device>
constexpr std::string_view device_name_of() {
  static_assert(is_device_v<Device>, "strata::device_name: not a device; expected strata::host or strata::cuda");
  if constexpr (std::is_base_of_v<cuda, Device>) {
    return "cuda";
  } else {
    return "host";
  }
}
}  // namespace detail

// The device's name for logs and messages: "host" or "cuda".
template <class Device>
inline constexpr std::string_view device_name = detail::device_name_of<Device>();

}  // namespace strata
