// expect: tensor_degree_divides<4, strata::tensor_extent\{"FFN width", 150, false\}>
// A static tensor<4> divides the 4 heads but not an FFN width of 150: building the model fails
// to compile, naming the degree, the extent and its value.
#include <strata/parallel/sequential_model.hpp>

#include "strata/models/gpt2.hpp"
namespace st = strata;

template <class P>
struct narrow_ffn : strata::models::gpt2::model<P> {
  static constexpr strata::models::gpt2::dims shape{
      .vocab = 96, .seq = 16, .layers = 2, .heads = 4, .d_model = 48, .ffn = 150};
};
using Policy = st::policy<st::host, st::parallel<st::tensor<4, st::sequence_parallel>>, st::fp32>;
void build(st::memory_ledger& ledger) {
  st::sequential_model<narrow_ffn<Policy>> model(ledger, narrow_ffn<Policy>::shape, st::seed{1});
}
