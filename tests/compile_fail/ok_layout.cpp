// The positive control: the layouts the compile-fail tests break, written correctly, compile
// cleanly (with -Wall -Wextra -Werror), so a failure above is the intended one, not a broken header.
#include "strata/policy/device.hpp"
#include "strata/policy/layout.hpp"
#include "strata/policy/parallel.hpp"
namespace st = strata;

using layout = st::parallel<st::pipeline<4, st::interleaved_1f1b, 8, 2>,  // any order
                            st::tensor<2, st::sequence_parallel>, st::data<st::dynamic, st::zero<3>>>;
static_assert(layout::dp == st::dynamic && layout::tp == 2 && layout::pp == 4);
static_assert(layout::zero_stage == 3 && layout::sequence_parallel && layout::virtual_chunks == 2);
static_assert(st::parallel<st::data<2>, st::tensor<2>, st::pipeline<2, st::gpipe, 4>>::is_static);
static_assert(st::parallel<st::tensor<st::dynamic>, st::pipeline<st::dynamic, st::interleaved_1f1b, 6, 3>>::pp ==
              st::dynamic);
static_assert(st::device_name<st::cuda> == "cuda");

int main() { return st::resolve_layout<layout>(16).dp == 2 ? 0 : 1; }
