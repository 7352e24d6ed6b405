// expect: strata::tensor: unknown option
#include "strata/policy/parallel.hpp"
namespace st = strata;
using layout = st::parallel<st::tensor<2, st::gpipe>>;
static_assert(layout::tp == 2);
