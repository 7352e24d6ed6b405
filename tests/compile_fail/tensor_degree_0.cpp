// expect: strata::tensor: a degree must be >= 1 or strata::dynamic
#include "strata/policy/parallel.hpp"
namespace st = strata;
using layout = st::parallel<st::tensor<0>>;
static_assert(layout::tp == 0);
