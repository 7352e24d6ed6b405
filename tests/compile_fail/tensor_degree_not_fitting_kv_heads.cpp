// expect: tensor_degree_divides<3, strata::tensor_extent\{"kv_heads", 2, true\}>
// A static tensor<3> on a Llama whose static shape has 6 query heads sharing 2 key/value heads:
// 3 divides the query heads but neither divides the key/value heads nor is a multiple of them,
// so building the model fails to compile, naming the degree and the extent.
#include <strata/parallel/sequential_model.hpp>

#include "strata/models/llama.hpp"
namespace st = strata;

template <class P>
struct six_heads : strata::models::llama::model<P> {
  static constexpr strata::models::llama::dims shape{
      .vocab = 96, .seq = 16, .layers = 2, .heads = 6, .d_model = 48, .kv_heads = 2, .ffn = 96};
};
using Policy = st::policy<st::host, st::parallel<st::tensor<3>>, st::fp32>;
void build(st::memory_ledger& ledger) {
  st::sequential_model<six_heads<Policy>> model(ledger, six_heads<Policy>::shape, st::seed{1});
}
