// expect: strata::pipeline: virtual chunks > 1 need the strata::interleaved_1f1b schedule
// Virtual chunks only mean something to the interleaved schedule.
#include "strata/policy/parallel.hpp"
namespace st = strata;
using layout = st::parallel<st::pipeline<2, st::gpipe, 4, 2>>;
static_assert(layout::virtual_chunks == 2);
