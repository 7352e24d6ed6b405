// expect: strata: logits and generation under context parallelism is not supported yet .*'logits_under_context'
//
// The output layer's logits of a model whose layout declares cp = 2: refused at compile time by
// the table of supported combinations (policy/support.hpp).
#include "strata/models/gpt2.hpp"
#include "strata/parallel/sequential_model.hpp"
namespace st = strata;
using P = st::policy<st::host, st::parallel<st::data<st::dynamic>, st::context<2>>, st::fp32>;
using model = st::sequential_model<strata::models::gpt2::model<P>>;
auto sample(model& m, st::tensor_view<const std::int32_t> tokens) { return m.logits(tokens); }
