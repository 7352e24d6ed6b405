// expect: strata generation: a hidden layer must either work on each token alone and say so
// A user-written block that neither says it works token by token nor keeps a cache: a model of
// it trains, but generating with it fails to compile, naming the two ways to take part (running
// only the new tokens through it could silently compute something else). Built with
// -DSAYS_POSITION_WISE too, as the positive control: the same block saying so generates.
#include <cstdint>

#include "strata/layers/embedding.hpp"
#include "strata/layers/layernorm.hpp"
#include "strata/layers/lm_head.hpp"
#include "strata/layers/sequential.hpp"
#include "strata/train/generate.hpp"
namespace st = strata;
using P = st::policy<st::host, st::serial, st::fp32>;

struct my_block {
  using policy = P;
  using T = float;
#ifdef SAYS_POSITION_WISE
  static constexpr bool position_wise = true;
#endif
  struct config {
    std::int64_t channels = 0;
  };
  static constexpr st::layer_cost cost(const config&, const st::cost_scope&) { return {}; }
  my_block(st::module_scope<P>, const config&) {}
  st::tensor_view<const T> forward(st::tensor_view<const T> x) { return x; }
  st::buffer<T> backward(const st::buffer<T>&);
  template <class F>
  void visit_parameters(F&&) const {}
};

struct my_model {
  using policy = P;
  struct config {
    std::int64_t vocab = 8, seq = 4, channels = 4;
  };
  static constexpr auto layers(const config& c) {
    return st::sequential(st::layer<st::embedding<P>>("", {.vocab = c.vocab, .max_seq = c.seq, .channels = c.channels}),
                          st::blocks<my_block>("h", 2, {.channels = c.channels}),
                          st::layer<st::layernorm<P>>("ln_f", {.channels = c.channels}),
                          st::layer<st::lm_head<P>>("lm_head", {.vocab = c.vocab, .channels = c.channels}));
  }
};

std::size_t generate(st::sequential_model<my_model>& model) {
  st::generator gen(model);
  const std::int32_t prompt[] = {1, 2};
  return gen.generate(prompt, {.new_tokens = 2}).size();
}
