// Positive control for the tensor_degree_* failures: the same model under degrees that divide
// its static shape, and under a dynamic degree (checked at start-up instead).
#include <strata/layers/tensor_checks.hpp>
#include <strata/parallel/sequential_model.hpp>

#include "strata/models/gpt2.hpp"
namespace st = strata;

template <class P>
struct four_heads : strata::models::gpt2::model<P> {
  static constexpr strata::models::gpt2::dims shape{
      .vocab = 97, .seq = 16, .layers = 2, .heads = 4, .d_model = 48};  // 97: padded
};
template <class Layout>
using on = four_heads<st::policy<st::host, Layout, st::fp32>>;
static_assert(st::check_static_layout<on<st::parallel<st::tensor<4, st::sequence_parallel>>>>());
static_assert(st::check_static_layout<on<st::parallel<st::tensor<2>>>>());
static_assert(st::check_static_layout<on<st::parallel<st::tensor<st::dynamic>>>>());
static_assert(st::check_static_layout<on<st::serial>>());
void build(st::memory_ledger& ledger) {
  st::sequential_model<on<st::parallel<st::tensor<2>>>> model(ledger, on<st::parallel<st::tensor<2>>>::shape,
                                                              st::seed{1});
}
int main() { return 0; }
