// expect: strata: a mixture of experts on the CUDA device is not supported yet .*'experts_on_cuda', policy/support
//
// A row of the table of supported combinations (policy/support.hpp) where the policy fixes it:
// st::moe under a cuda policy stops at compile time, in the row's words.
#include "strata/layers/moe.hpp"
namespace st = strata;
using P = st::policy<st::cuda, st::parallel<st::data<st::dynamic>>, st::mixed<st::bf16, float>>;
st::moe<P> build(st::module_scope<P> scope, const st::moe<P>::config& c) { return st::moe<P>(scope, c); }
