// expect: strata::parallel: the pipeline axis is given twice
#include "strata/policy/parallel.hpp"
namespace st = strata;
using layout = st::parallel<st::pipeline<2>, st::pipeline<4, st::gpipe, 8>>;
static_assert(layout::pp == 2);
