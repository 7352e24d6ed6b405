// strata/plan/hardware.hpp - device presets for the planner: memory, peaks, bandwidths, and the
// efficiencies the time model (plan/time_model.hpp) runs each kind of work at.
//
// Memory in decimal bytes as the vendors state it (an "80 GB" GPU holds 80e9 here); dense
// tensor-core peaks without sparsity; link bandwidths per GPU and per direction: NVLink inside a
// node, the network adapter (one per GPU) between nodes. The efficiencies are the shares of those
// peaks that tuned kernels reach: one set for every preset, held to published A100 runs
// (docs/planner.md, "The time model"; tests/unit/test_plan_time.cpp). A user-defined device is
// one more constexpr device_spec; strata-plan also reads one from JSON (--hw-file), which is how
// a calibration measured on a device (--calibrate) replaces the defaults.
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
  double intra_node_latency = 2e-6;  // seconds per step of a collective's algorithm
  double inter_node_latency = 6e-6;
  // The compute side of the time model.
  int sm_count = 108;                        // streaming multiprocessors: one GEMM tile each per wave
  double memory_bandwidth = 0;               // HBM bytes/s
  int gemm_tile_m = 128, gemm_tile_n = 256;  // the output tile one SM computes per wave
  double gemm_efficiency = 0.8;              // the share of the peak a large GEMM's full waves reach
  double gemm_k_half = 128;                  // the inner dimension at which a GEMM reaches half of that
  // The least time one GEMM takes (its launch and the host's issue; a calibration measures it,
  // the presets leave it at 0): what a small GEMM costs however few FLOPs it has.
  double gemm_floor_seconds = 0;
  double attention_efficiency = 0.5;  // the attention kernel's share of the peak for its FLOPs
  // Bytes an attention kernel moves per entry of the score matrix, forward and backward: 0 for a
  // fused kernel that keeps the scores on chip (strata's, FlashAttention); an implementation that
  // writes scores, probabilities and dropout masks out moves them at memory_efficiency.
  double score_bytes_forward = 0, score_bytes_backward = 0;
  double memory_efficiency = 0.8;  // element- and row-wise kernels' share of memory_bandwidth
  double link_efficiency = 0.8;    // collectives' share of the link bandwidth (bus bandwidth)
  // What the training software overlaps: the share of tensor-parallel collectives hidden behind
  // GEMMs (strata: none), and of the gradient reduction that backward can hide (strata: all).
  double tensor_overlap = 0;
  double data_parallel_overlap = 1;

  constexpr double peak_flops(int storage_bytes) const {
    return storage_bytes <= 2 ? peak_flops_16bit : peak_flops_fp32;
  }
};

// A100 SXM: 312 TFLOP/s bf16, 19.5 fp32, 108 SMs; HBM2 1.555 TB/s (40 GB) or HBM2e 2.039 TB/s
// (80 GB); NVLink 3 600 GB/s (300 each way); HDR 200 Gb/s per GPU.
inline constexpr device_spec a100_40gb{.name = "a100_40gb",
                                       .memory_bytes = 40e9,
                                       .peak_flops_16bit = 312e12,
                                       .peak_flops_fp32 = 19.5e12,
                                       .intra_node_bandwidth = 300e9,
                                       .inter_node_bandwidth = 25e9,
                                       .sm_count = 108,
                                       .memory_bandwidth = 1555e9};
inline constexpr device_spec a100_80gb = [] {
  device_spec d = a100_40gb;
  d.name = "a100_80gb";
  d.memory_bytes = 80e9;
  d.memory_bandwidth = 2039e9;
  return d;
}();
// H100 SXM: 989 TFLOP/s bf16, 67 fp32, 132 SMs; HBM3 3.35 TB/s; NVLink 4 900 GB/s (450 each
// way); NDR 400 Gb/s per GPU.
inline constexpr device_spec h100_80gb{.name = "h100_80gb",
                                       .memory_bytes = 80e9,
                                       .peak_flops_16bit = 989e12,
                                       .peak_flops_fp32 = 67e12,
                                       .intra_node_bandwidth = 450e9,
                                       .inter_node_bandwidth = 50e9,
                                       .sm_count = 132,
                                       .memory_bandwidth = 3350e9};
// H200 SXM: H100's compute with 141 GB of HBM3e at 4.8 TB/s.
inline constexpr device_spec h200_141gb = [] {
  device_spec d = h100_80gb;
  d.name = "h200_141gb";
  d.memory_bytes = 141e9;
  d.memory_bandwidth = 4800e9;
  return d;
}();

inline constexpr std::array<device_spec, 4> presets{a100_40gb, a100_80gb, h100_80gb, h200_141gb};

// The preset called `name`, or nullptr.
constexpr const device_spec* find(std::string_view name) {
  for (const auto& d : presets)
    if (d.name == name) return &d;
  return nullptr;
}

}  // namespace strata::hw
