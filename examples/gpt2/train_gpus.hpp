// examples/gpt2/train_gpus.hpp - gpt2_train --device cuda: the run of train_run.hpp on GPUs.
//
// Under mpirun each rank takes the GPU numbered its local rank modulo the node's GPUs, and the
// run's groups talk through NCCL or MPI staged through host memory (comm/gpu_groups.cuh,
// STRATA_COMM); every layout, precision, checkpoint, export and metrics flag means what it means
// on the host. Compiled by nvcc (train_gpus.cu, train_gpus_llama.cu) when the CUDA toolkit is
// found; otherwise train_no_cuda.cpp says so.
#pragma once
#include "train_run.hpp"

namespace gpt2_train {

// Trains o.model on this rank's GPU; returns the exit code. Errors are strata::error.
int train_on_gpus(const run_options& o, st::world& world);

// The Llama half, in its own translation unit (nvcc compiles the two in parallel).
int train_llama_on_gpus(const run_options& o, st::world& world, const device_hooks& dev);

}  // namespace gpt2_train
