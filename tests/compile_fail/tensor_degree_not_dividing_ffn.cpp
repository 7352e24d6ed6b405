// expect: tensor_degree_divides_ffn_width<4, 3074>
// tensor<4> divides the heads but not an FFN width of 3074.
#include "strata/layers/tensor_parallel.hpp"
namespace st = strata;
using layout = st::parallel<st::data<st::dynamic>, st::tensor<4, st::sequence_parallel>>;
static_assert(st::tensor_layout_fits<layout, 12, 3074>);
