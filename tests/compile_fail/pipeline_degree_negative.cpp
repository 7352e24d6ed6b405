// expect: strata::pipeline: a degree must be >= 1 or strata::dynamic
// -2 is neither a degree nor strata::dynamic (-1).
#include "strata/policy/parallel.hpp"
namespace st = strata;
using layout = st::parallel<st::pipeline<-2>>;
static_assert(layout::pp == -2);
