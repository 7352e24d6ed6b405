// gpt2_train --model llama on the CPU (train_host.hpp).
#include "train_host.hpp"

namespace gpt2_train {

int train_llama_on_host(const run_options& o, st::world& world, const device_hooks& dev) {
  return dispatch<llama_family, st::host>(o, world, dev);
}

}  // namespace gpt2_train
