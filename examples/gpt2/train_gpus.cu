// gpt2_train --device cuda (train_gpus.hpp): this rank's GPU, then the GPT-2 run on it.
#include <cuda_runtime.h>

#include <cstdio>

#include <strata/comm/gpu_groups.cuh>
#include <strata/kernels/all.hpp>

#include "train_gpus.hpp"

namespace gpt2_train {

int train_on_gpus(const run_options& o, st::world& world) {
  int device = 0;
  try {
    device = st::gpu::use_local_device(world);
  } catch (const st::error& e) { st::fail("gpt2_train: --device cuda: ", e.what()); }
  cudaDeviceProp prop{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  if (world.rank() == 0) std::printf("device: %s (GPU %d of rank 0; %d ranks)\n", prop.name, device, world.size());
  device_hooks dev;
  dev.memory = &st::gpu::device_memory();
  dev.after_steps = [] { st::gpu::check_device_errors(); };
  dev.step_suffix = " | cuda";
  if (o.model == "llama") return train_llama_on_gpus(o, world, dev);
  return dispatch<gpt2_family, st::cuda>(o, world, dev);
}

}  // namespace gpt2_train
