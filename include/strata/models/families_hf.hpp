// strata/models/families_hf.hpp - the families' weights under Hugging Face's names (families.hpp
// names each family's transformers class, hf_class): one overload per family's dims, from
// gpt2_hf.hpp, llama_hf.hpp and mixtral_hf.hpp.
//
//   strata::models::export_hf<float>("model.safetensors", dims, serial);
//   const std::vector<double> weights = strata::models::import_hf("model.safetensors", dims, &notes);
#pragma once

#include "strata/models/gpt2_hf.hpp"
#include "strata/models/llama_hf.hpp"
#include "strata/models/mixtral_hf.hpp"
#include "strata/models/families.hpp"

namespace strata::models {

using strata::models::gpt2::export_hf;
using strata::models::gpt2::import_hf;
using strata::models::llama::export_hf;
using strata::models::llama::import_hf;
using strata::models::mixtral::export_hf;
using strata::models::mixtral::import_hf;

}  // namespace strata::models
