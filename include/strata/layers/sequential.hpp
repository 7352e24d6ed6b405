// strata/layers/sequential.hpp - a model declared as its layers in order.
//
// A user's model is a struct naming its policy and config (its shape) and listing its layers:
//
//   template <class P>
//   struct my_model {
//     using policy = P;
//     struct config { std::int64_t vocab = 256, seq = 64, layers = 4, heads = 4, d_model = 64; };
//     static constexpr auto layers(const config& c) {
//       return st::sequential(
//           st::layer<st::embedding<P>>("", {.vocab = c.vocab, .max_seq = c.seq, .channels = c.d_model}),
//           st::blocks<my_block<P>>("h", c.layers, {.channels = c.d_model, .heads = c.heads}),
//           st::layer<st::layernorm<P>>("ln_f", {.channels = c.d_model}),
//           st::layer<st::lm_head<P>>("lm_head", {.vocab = c.vocab, .channels = c.d_model, .tied_to = "wte"}));
//     }
//   };
//
// The first part takes token ids (an input_layer), the last gives the loss (an output_layer),
// exactly one part is the repeated blocks (blocks<L>: `count` copies named "h.0" .. "h.N-1"),
// and every other part is a hidden layer. Parts before the blocks run with the first pipeline
// stage, parts after them with the last; a parameter tied across the two ends (the head's
// tied_to) is replicated on the last stage and its gradients summed. Everything else follows
// from this one declaration (parallel/sequential_model.hpp): the model on every layout, its
// pipeline stages, its plan (plan/plan.hpp) and its checkpoint names (the parameter names).
//
// layers(config) is constexpr, so with a static shape the planner and the tensor-parallel checks
// run at compile time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "strata/layers/layer.hpp"

namespace strata {

// One layer, built under the scope `name` ("" for the model's root).
template <class L>
struct layer_part {
  using layer_type = L;
  std::string_view name;
  typename L::config config;
};
// `count` copies of a hidden layer, named "<name>.0" .. "<name>.<count-1>".
template <class L>
struct blocks_part {
  using layer_type = L;
  std::string_view name;
  std::int64_t count = 0;
  typename L::config config;
};

template <class L>
constexpr layer_part<L> layer(std::string_view name, const typename L::config& c) {
  return {name, c};
}
template <class L>
constexpr blocks_part<L> blocks(std::string_view name, std::int64_t count, const typename L::config& c) {
  return {name, count, c};
}

template <class T>
struct is_blocks_part : std::false_type {};
template <class L>
struct is_blocks_part<blocks_part<L>> : std::true_type {};
template <class T>
struct is_layer_part : std::false_type {};
template <class L>
struct is_layer_part<layer_part<L>> : std::true_type {};

namespace detail {
template <class... Parts>
constexpr std::size_t blocks_index() {
  constexpr bool flags[] = {is_blocks_part<Parts>::value...};
  for (std::size_t i = 0; i < sizeof...(Parts); ++i)
    if (flags[i]) return i;
  return sizeof...(Parts);
}

// The role of part I of N around the blocks at B, each checked with its own message.
template <std::size_t I, std::size_t N, std::size_t B, class Part>
consteval bool check_part() {
  using L = typename Part::layer_type;
  if constexpr (I == 0) {
    static_assert(is_layer_part<Part>::value,
                  "strata::sequential: the first part takes the token ids; it cannot "
                  "be the repeated blocks");
    check_input_layer<L>();
  } else if constexpr (I + 1 == N) {
    static_assert(is_layer_part<Part>::value,
                  "strata::sequential: the last part gives the loss; it cannot be the "
                  "repeated blocks");
    check_output_layer<L>();
  } else {
    check_hidden_layer<L>();
  }
  return true;
}
template <class... Parts, std::size_t... I>
consteval bool check_parts(std::index_sequence<I...>) {
  constexpr std::size_t n = sizeof...(Parts), b = blocks_index<Parts...>();
  return (check_part<I, n, b, Parts>() && ...);
}
}  // namespace detail

template <class... Parts>
struct sequential_layers {
  static constexpr std::size_t size = sizeof...(Parts);
  static constexpr std::size_t blocks_at = detail::blocks_index<Parts...>();  // the repeated part
  static_assert(
      ((is_layer_part<Parts>::value || is_blocks_part<Parts>::value) && ...),
      "strata::sequential: every part is strata::layer<L>(name, config) or strata::blocks<L>(name, count, config)");
  static_assert(size >= 3, "strata::sequential: a model needs at least an input part, the blocks and an output part");
  static_assert((0 + ... + int(is_blocks_part<Parts>::value)) == 1,
                "strata::sequential: exactly one part is the repeated blocks (strata::blocks<L>(name, count, config))");
  static_assert(detail::check_parts<Parts...>(std::index_sequence_for<Parts...>{}));

  std::tuple<Parts...> parts;

  template <std::size_t I>
  using part_type = std::tuple_element_t<I, std::tuple<Parts...>>;
  template <std::size_t I>
  constexpr const auto& part() const {
    return std::get<I>(parts);
  }
  constexpr const auto& blocks() const { return std::get<blocks_at>(parts); }
};

template <class... Parts>
constexpr sequential_layers<Parts...> sequential(Parts... parts) {
  return {{parts...}};
}

template <class T>
struct is_sequential_layers : std::false_type {};
template <class... Parts>
struct is_sequential_layers<sequential_layers<Parts...>> : std::true_type {};

// ---- a model declaration: policy, config and layers(config) ----
template <class M>
concept has_model_config = requires {
  typename M::config;
}
&&std::is_aggregate_v<typename M::config>;
template <class M>
concept has_layer_list = requires(const typename M::config& c) {
  M::layers(c);
}
&&is_sequential_layers<std::remove_cvref_t<decltype(M::layers(std::declval<const typename M::config&>()))>>::value;
template <class M>
concept model_declaration = requires {
  typename M::policy;
}
&&has_model_config<M>&& has_layer_list<M>;

template <class M>
consteval bool check_model_declaration() {
  static_assert(
      requires { typename M::policy; }, "strata model: missing `using policy = P;`");
  static_assert(has_model_config<M>, "strata model: missing `struct config { ... };` (its shape, a plain aggregate)");
  if constexpr (has_model_config<M>)
    static_assert(has_layer_list<M>,
                  "strata model: missing `static constexpr auto layers(const config&)` returning "
                  "strata::sequential(...) (its layers in order)");
  return true;
}

// The declaration's layer list type.
template <class M>
using layers_of = std::remove_cvref_t<decltype(M::layers(std::declval<const typename M::config&>()))>;

}  // namespace strata
