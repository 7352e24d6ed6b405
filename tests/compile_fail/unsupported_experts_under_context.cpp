// expect: strata: a mixture of experts under context parallelism is not supported yet .*'experts_under_context'
//
// The layout declares cp = 2: the table's row refuses st::moe at compile time (given at launch,
// the same words come at start-up, with the degree).
#include "strata/layers/moe.hpp"
namespace st = strata;
using P = st::policy<st::host, st::parallel<st::data<st::dynamic>, st::context<2>>, st::fp32>;
st::moe<P> build(st::module_scope<P> scope, const st::moe<P>::config& c) { return st::moe<P>(scope, c); }
