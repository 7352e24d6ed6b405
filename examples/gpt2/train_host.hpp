// examples/gpt2/train_host.hpp - gpt2_train on the CPU: the run of train_run.hpp in host memory
// or, with --device emulated, in the emulated device memory (device_hooks says which).
//
// One translation unit per model family (train_host_gpt2.cpp, train_host_llama.cpp,
// train_host_mixtral.cpp), each instantiating its three precisions, so they compile in parallel.
#pragma once
#include "train_run.hpp"

namespace gpt2_train {

int train_gpt2_on_host(const run_options& o, st::world& world, const device_hooks& dev);
int train_llama_on_host(const run_options& o, st::world& world, const device_hooks& dev);
int train_mixtral_on_host(const run_options& o, st::world& world, const device_hooks& dev);

}  // namespace gpt2_train
