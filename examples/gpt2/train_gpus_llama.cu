// gpt2_train --device cuda --model llama (train_gpus.hpp): the Llama run on this rank's GPU.
#include <strata/comm/gpu_groups.cuh>
#include <strata/kernels/all.hpp>

#include "train_gpus.hpp"

namespace gpt2_train {

int train_llama_on_gpus(const run_options& o, st::world& world, const device_hooks& dev) {
  return dispatch<llama_family, st::cuda>(o, world, dev);
}

}  // namespace gpt2_train
