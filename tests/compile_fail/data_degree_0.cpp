// expect: strata::data: a degree must be >= 1 or strata::dynamic
#include "strata/policy/parallel.hpp"
namespace st = strata;
using layout = st::parallel<st::data<0>>;
static_assert(layout::dp == 0);
