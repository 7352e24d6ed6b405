// Positive control for pipeline_layers_not_dividing: layers that split, and a dynamic degree.
#include "strata/parallel/pipeline_schedule.hpp"
namespace st = strata;
static_assert(st::pipeline_layout_fits<st::parallel<st::pipeline<4, st::interleaved_1f1b, 8, 2>>, 16>);
static_assert(st::pipeline_layout_fits<st::parallel<st::pipeline<st::dynamic>>, 7>);
static_assert(st::pipeline_layout_fits<st::serial, 5>);
int main() { return 0; }
