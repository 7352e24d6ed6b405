// Positive control for plan_does_not_fit: the same model over 8 GPUs with ZeRO-3 and full
// recomputation fits an 80 GB GPU at compile time.
#include <strata/plan/plan.hpp>

#include "strata/models/gpt2.hpp"
namespace st = strata;

template <class P>
struct gpt_6_7b : strata::models::gpt2::model<P> {
  static constexpr strata::models::gpt2::dims shape{
      .vocab = 50304, .seq = 2048, .layers = 32, .heads = 32, .d_model = 4096};
};
using Policy = st::policy<st::cuda, st::parallel<st::data<8, st::zero<3>>>, st::mixed<st::bf16, float>>;
static_assert(
    st::plan<gpt_6_7b<Policy>>(st::batch{.micro = 1, .global = 8}, st::recompute_mode::full).fits(st::hw::h100_80gb));
int main() { return 0; }
