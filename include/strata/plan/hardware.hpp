// strata/plan/hardware.hpp - device presets for the planner.
//
// Memory in decimal bytes as the vendors state it (an "80 GB" GPU holds 80e9 here); dense
// tensor-core peaks without sparsity; bandwidths per GPU and per direction: NVLink inside a node,
// the network adapter (one per GPU) between nodes. A user-defined device is one more
// constexpr device_spec.
#pragma once
#include <array>
#include <string_view>

namespace strata::hw {

struct device_spec {
  std::string_view name;
  double memory_bytes = 0;
  double peak_flops_16bit = 0;  // bf16/fp16 dense, FLOP/s
  double peak_flops_fp32 = 0;   // fp32 (non tensor-core), FLOP/s
  int gpus_per_node = 8;
  double intra_node_bandwidth = 0;   // bytes/s per GPU per direction (NVLink)
  double inter_node_bandwidth = 0;   // bytes/s per GPU per direction (InfiniBand)
  double intra_node_latency = 5e-6;  // seconds per collective step
  double inter_node_latency = 10e-6;

  constexpr double peak_flops(int storage_bytes) const {
    return storage_bytes <= 2 ? peak_flops_16bit : peak_flops_fp32;
  }
};

// A100 SXM: 312 TFLOP/s bf16, 19.5 fp32; NVLink 3 600 GB/s (300 each way); HDR 200 Gb/s per GPU.
inline constexpr device_spec a100_40gb{"a100_40gb", 40e9, 312e12, 19.5e12, 8, 300e9, 25e9};
inline constexpr device_spec a100_80gb{"a100_80gb", 80e9, 312e12, 19.5e12, 8, 300e9, 25e9};
// H100 SXM: 989 TFLOP/s bf16, 67 fp32; NVLink 4 900 GB/s (450 each way); NDR 400 Gb/s per GPU.
inline constexpr device_spec h100_80gb{"h100_80gb", 80e9, 989e12, 67e12, 8, 450e9, 50e9};
// H200 SXM: H100's compute with 141 GB of HBM3e.
inline constexpr device_spec h200_141gb{"h200_141gb", 141e9, 989e12, 67e12, 8, 450e9, 50e9};

inline constexpr std::array<device_spec, 4> presets{a100_40gb, a100_80gb, h100_80gb, h200_141gb};

// The preset called `name`, or nullptr.
constexpr const device_spec* find(std::string_view name) {
  for (const auto& d : presets)
    if (d.name == name) return &d;
  return nullptr;
}

}  // namespace strata::hw
