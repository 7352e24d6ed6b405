// examples/common/model_families_hf.hpp - the example families' weights under Hugging Face's
// names (model_families.hpp names each family's transformers class, hf_class): one overload per
// family's dims, from examples/gpt2/gpt2_hf.hpp, examples/llama/llama_hf.hpp and
// examples/mixtral/mixtral_hf.hpp.
//
//   example_models::export_hf<float>("model.safetensors", dims, serial);
//   const std::vector<double> weights = example_models::import_hf("model.safetensors", dims, &notes);
#pragma once

#include "../gpt2/gpt2_hf.hpp"
#include "../llama/llama_hf.hpp"
#include "../mixtral/mixtral_hf.hpp"
#include "model_families.hpp"

namespace example_models {

using gpt2::export_hf;
using gpt2::import_hf;
using llama::export_hf;
using llama::import_hf;
using mixtral::export_hf;
using mixtral::import_hf;

}  // namespace example_models
