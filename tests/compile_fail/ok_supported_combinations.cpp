// The positive control of the unsupported_* tests: the same code under policies no row of the
// table of supported combinations refuses at compile time compiles cleanly. A degree left to the
// launch is the start-up check's (policy/support.hpp).
#include "strata/layers/moe.hpp"
#include "strata/models/gpt2.hpp"
#include "strata/parallel/sequential_model.hpp"
namespace st = strata;
using host_open_cp = st::policy<st::host, st::parallel<st::data<st::dynamic>, st::context<st::dynamic>>, st::fp32>;
using host_tp2 = st::policy<st::host, st::parallel<st::data<st::dynamic>, st::tensor<2>>, st::mixed<st::bf16, float>>;
template <class P>
st::moe<P> build(st::module_scope<P> scope, const typename st::moe<P>::config& c) {
  return st::moe<P>(scope, c);
}
template st::moe<host_open_cp> build(st::module_scope<host_open_cp>, const st::moe<host_open_cp>::config&);
template st::moe<host_tp2> build(st::module_scope<host_tp2>, const st::moe<host_tp2>::config&);
// The planner reads a cuda policy's costs: planning is no refusal.
using cuda_bf16 = st::policy<st::cuda, st::parallel<st::data<st::dynamic>>, st::mixed<st::bf16, float>>;
static_assert(sizeof(st::moe<cuda_bf16>) > 0);
using model = st::sequential_model<strata::models::gpt2::model<host_open_cp>>;
auto sample(model& m, st::tensor_view<const std::int32_t> tokens) { return m.logits(tokens); }
int main() {}
