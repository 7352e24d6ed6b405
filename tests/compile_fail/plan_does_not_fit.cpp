// expect: model_state_exceeds_device_memory
// A 6.7B-parameter model with mixed-precision AdamW on one 80 GB GPU: ~107 GB of model state.
#include "strata/plan/plan.hpp"
namespace st = strata;
struct gpt_6_7b {
  static constexpr st::model_shape value{.vocab = 50304, .seq = 2048, .layers = 32, .heads = 32, .hidden = 4096};
};
using Policy = st::policy<st::cuda, st::serial, st::mixed<st::bf16, float>>;
static_assert(st::plan<gpt_6_7b, Policy>(st::batch{.micro = 1, .global = 8}).fits(st::hw::h100_80gb));
