// expect: tensor_degree_divides<3, strata::tensor_extent\{"heads", 4, false\}>
// A static tensor<3> on a model whose static shape has 4 attention heads: building the model
// fails to compile, naming the degree and the extent, with no assert written by the user.
#include <strata/parallel/sequential_model.hpp>

#include "strata/models/gpt2.hpp"
namespace st = strata;

// The example GPT-2 with its shape in its type.
template <class P>
struct four_heads : strata::models::gpt2::model<P> {
  static constexpr strata::models::gpt2::dims shape{.vocab = 96, .seq = 16, .layers = 2, .heads = 4, .d_model = 48};
};
using Policy = st::policy<st::host, st::parallel<st::tensor<3>>, st::fp32>;
void build(st::memory_ledger& ledger) {
  st::sequential_model<four_heads<Policy>> model(ledger, four_heads<Policy>::shape, st::seed{1});
}
