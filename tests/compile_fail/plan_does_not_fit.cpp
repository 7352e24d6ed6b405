// expect: model_state_exceeds_device_memory
// A 6.7B-parameter GPT (GPT-3 6.7B's shape, 50304-token vocabulary) with mixed-precision AdamW on
// one 80 GB GPU: ~107 GB of model state.
#include <strata/plan/plan.hpp>

#include "strata/models/gpt2.hpp"
namespace st = strata;

template <class P>
struct gpt_6_7b : strata::models::gpt2::model<P> {
  static constexpr strata::models::gpt2::dims shape{
      .vocab = 50304, .seq = 2048, .layers = 32, .heads = 32, .d_model = 4096};
};
using Policy = st::policy<st::cuda, st::serial, st::mixed<st::bf16, float>>;
static_assert(st::plan<gpt_6_7b<Policy>>(st::batch{.micro = 1, .global = 8}).fits(st::hw::h100_80gb));
