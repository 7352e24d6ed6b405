// Positive control for the tensor_degree_* failures: degrees that divide, and a dynamic one.
#include "strata/layers/tensor_parallel.hpp"
namespace st = strata;
static_assert(st::tensor_layout_fits<st::parallel<st::tensor<4, st::sequence_parallel>>, 12, 3072>);
static_assert(st::tensor_layout_fits<st::parallel<st::tensor<st::dynamic>>, 12, 3074>);
static_assert(st::tensor_layout_fits<st::serial, 7, 9>);
int main() { return 0; }
