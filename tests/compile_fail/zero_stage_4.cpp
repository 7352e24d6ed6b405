// expect: ZeRO stage must be 0, 1, 2, 3 or strata::dynamic
#include "strata/policy/parallel.hpp"
namespace st = strata;
using layout = st::parallel<st::data<st::dynamic, st::zero<4>>>;
static_assert(layout::zero_stage == 4);
