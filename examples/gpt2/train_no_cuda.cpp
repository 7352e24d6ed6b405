// gpt2_train without its GPU half (gpt2_train_host, or a build without the CUDA toolkit or NCCL):
// --device cuda says how to get it.
#include <strata/core/error.hpp>

#include "train_gpus.hpp"

namespace gpt2_train {

int train_on_gpus(const run_options&, st::world&) {
#ifdef STRATA_TRAINER_HOST_ONLY
  strata::fail(
      "gpt2_train: --device cuda: gpt2_train_host is the trainer without its GPU half; build the target "
      "gpt2_train (it has it when nvcc and NCCL are found) and run that");
#else
  strata::fail(
      "gpt2_train: --device cuda: this build has no GPU support (nvcc or NCCL was not found when "
      "it was configured); install the CUDA toolkit with NCCL and configure again");
#endif
}

}  // namespace gpt2_train
