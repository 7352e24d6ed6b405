// examples/gpt2/train_cuda.hpp - the library's GPT-2 trained on one GPU without MPI, for the GPU
// check's standalone build (bench/gpu/gpt2_train_cuda.cu: scripts/gpu-check builds it from the
// CUDA toolkit alone). gpt2_train --device cuda is the whole run on GPUs (train_gpus.hpp).
//
// The same declaration as on the host, strata::models::gpt2::model<P> (or, with `llama` set,
// strata::models::llama::model<P>) with P = st::policy<st::cuda, st::serial, ...>, built by
// st::sequential_model: its layers call the CUDA kernels and its ledger allocates device memory
// (gpu::device_memory()), so parameters, gradients, optimizer state and activations live on the
// GPU. Compiled by nvcc (train_cuda.cu).
#pragma once
#include <cstdint>
#include <string>

#include <optional>

#include "strata/models/gpt2.hpp"
#include "strata/models/llama.hpp"

namespace gpt2 {

struct cuda_run {
  strata::models::gpt2::dims shape;
  std::optional<strata::models::llama::dims> llama;  // set: train the example Llama of this shape instead of GPT-2
  std::int64_t batch = 16, micro_batch = 0;
  int steps = 250, warmup = 10;
  double lr = 3e-3, grad_clip = 1.0;
  std::uint64_t seed = 1337;
  std::string precision = "bf16", data, data_order = "shuffled", metrics, progress = "auto", hw;
};

// Trains on the current GPU; returns the exit code. Errors are strata::error.
int train_on_cuda(const cuda_run& run);

}  // namespace gpt2
