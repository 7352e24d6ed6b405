// expect: strata::pipeline: interleaved 1F1B needs microbatches divisible by the pipeline degree
// 6 microbatches cannot be handed out in groups of 4 stages.
#include "strata/policy/parallel.hpp"
namespace st = strata;
using layout = st::parallel<st::pipeline<4, st::interleaved_1f1b, 6, 2>>;
static_assert(layout::microbatches == 6);
