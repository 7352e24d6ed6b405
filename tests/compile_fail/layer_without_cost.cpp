// expect: strata layer: missing `static constexpr strata::layer_cost cost
// A user-written block without its costs, used as a model's blocks: the declaration names the
// missing member (the planner adds every layer's cost).
#include <cstdint>

#include "strata/layers/embedding.hpp"
#include "strata/layers/lm_head.hpp"
#include "strata/layers/sequential.hpp"
namespace st = strata;
using P = st::policy<st::host, st::serial, st::fp32>;

struct my_block {
  using policy = P;
  using T = float;
  struct config {
    std::int64_t channels = 0;
  };
  my_block(st::module_scope<P>, const config&) {}
  st::tensor_view<const T> forward(st::tensor_view<const T> x) { return x; }
  st::buffer<T> backward(const st::buffer<T>&);
  template <class F>
  void visit_parameters(F&&) const {}
};
constexpr auto layers = st::sequential(st::layer<st::embedding<P>>("", {.vocab = 8, .max_seq = 4, .channels = 4}),
                                       st::blocks<my_block>("h", 2, {.channels = 4}),
                                       st::layer<st::lm_head<P>>("lm_head", {.vocab = 8, .channels = 4}));
