// expect: strata::parallel: the data axis is given twice
// Two data axes in one layout: which degree is meant is ambiguous, so it must not compile.
#include "strata/policy/parallel.hpp"
namespace st = strata;
using layout = st::parallel<st::data<2>, st::tensor<2>, st::data<4>>;
static_assert(layout::dp == 2);
