// gpt2_train --model mixtral on the CPU (train_host.hpp).
#include "train_host.hpp"

namespace gpt2_train {

int train_mixtral_on_host(const run_options& o, st::world& world, const device_hooks& dev) {
  return dispatch<mixtral_family, st::host>(o, world, dev);
}

}  // namespace gpt2_train
