// The positive control of tensor_degree_not_fitting_kv_heads.cpp: a static tensor<4> over 2
// key/value heads is a multiple of them (each head on 2 ranks), and compiles.
#include <strata/parallel/sequential_model.hpp>

#include "strata/models/llama.hpp"
namespace st = strata;

template <class P>
struct eight_heads : strata::models::llama::model<P> {
  static constexpr strata::models::llama::dims shape{
      .vocab = 96, .seq = 16, .layers = 2, .heads = 8, .d_model = 64, .kv_heads = 2, .ffn = 96};
};
using Policy = st::policy<st::host, st::parallel<st::tensor<4>>, st::fp32>;
void build(st::memory_ledger& ledger) {
  st::sequential_model<eight_heads<Policy>> model(ledger, eight_heads<Policy>::shape, st::seed{1});
}
