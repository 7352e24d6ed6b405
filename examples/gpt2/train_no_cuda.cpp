// gpt2_train without the CUDA toolkit or NCCL: --device cuda says how to get them.
#include <strata/core/error.hpp>

#include "train_gpus.hpp"

namespace gpt2_train {

int train_on_gpus(const run_options&, st::world&) {
  strata::fail("gpt2_train: --device cuda: this build has no GPU support (nvcc or NCCL was not found when "
               "it was configured); install the CUDA toolkit with NCCL and configure again");
}

}  // namespace gpt2_train
