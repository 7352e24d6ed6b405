// expect: strata::parallel: unknown tag
// int is not an axis; the message lists the ones that are.
#include "strata/policy/parallel.hpp"
namespace st = strata;
using layout = st::parallel<st::data<2>, int>;
static_assert(layout::dp == 2);
