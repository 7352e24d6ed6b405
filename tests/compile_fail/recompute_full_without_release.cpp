// expect: strata::recompute<full, L>: L has no release_activations\(\)
// Full recomputation drops what forward kept, through the layer's release_activations(): a layer
// without it cannot be wrapped, and the message names the member.
#include <cstdint>

#include "strata/layers/recompute.hpp"
namespace st = strata;
using P = st::policy<st::host, st::serial, st::fp32>;

struct my_block {
  using policy = P;
  using T = float;
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
st::recompute<st::full, my_block>* wrapped = nullptr;
constexpr auto size = sizeof(st::recompute<st::full, my_block>);
