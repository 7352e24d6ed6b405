// expect: strata::parallel: the tensor axis is given twice
#include "strata/policy/parallel.hpp"
namespace st = strata;
using layout = st::parallel<st::tensor<2>, st::pipeline<2>, st::tensor<2, st::sequence_parallel>>;
static_assert(layout::tp == 2);
