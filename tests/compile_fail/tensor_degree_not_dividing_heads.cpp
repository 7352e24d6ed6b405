// expect: tensor_degree_divides_heads<5, 12>
// tensor<5> cannot shard 12 attention heads evenly.
#include "strata/layers/tensor_parallel.hpp"
namespace st = strata;
using layout = st::parallel<st::tensor<5>>;
static_assert(st::tensor_layout_fits<layout, 12, 3840>);
