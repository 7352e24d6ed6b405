// expect: pipeline_chunks_divide_layers<8, 12>
// 4 stages x 2 virtual chunks = 8 pieces cannot share 12 layers evenly.
#include "strata/parallel/pipeline_schedule.hpp"
namespace st = strata;
using layout = st::parallel<st::pipeline<4, st::interleaved_1f1b, 8, 2>>;
static_assert(st::pipeline_layout_fits<layout, 12>);
