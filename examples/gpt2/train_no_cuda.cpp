// gpt2_train without the CUDA toolkit: --device cuda says how to get it.
#include <strata/core/error.hpp>

#include "train_cuda.hpp"

namespace gpt2 {

int train_on_cuda(const cuda_run&) {
  strata::fail("gpt2_train: --device cuda: this build has no CUDA support (nvcc was not found when it was "
               "configured); install the CUDA toolkit and configure again");
}

}  // namespace gpt2
