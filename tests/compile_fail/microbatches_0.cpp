// expect: strata::pipeline: microbatches must be >= 1 or strata::dynamic
#include "strata/policy/parallel.hpp"
namespace st = strata;
using layout = st::parallel<st::pipeline<2, st::one_f_one_b, 0>>;
static_assert(layout::microbatches == 0);
