// strata/layers/tensor_checks.hpp - a tensor-parallel degree against a model's shape, at compile
// time when both are static, at start-up otherwise.
//
// Every layer lists the extents a tensor-parallel degree must divide (tensor_extents(config):
// heads, FFN width, ...; a vocabulary is padded instead). For a model with a static shape
//   template <class P> struct my_model { ...; static constexpr config shape{.heads = 4, ...}; };
// under a policy whose tensor degree is static, check_static_layout<Model>() - which
// strata::training asserts - fails to compile in the instantiation
//   strata::tensor_degree_divides<3, strata::tensor_extent{"heads", 4, false}>
// naming the degree, the extent, its value and whether it is shareable (a degree that is a
// multiple of key/value heads passes); no user-written assert is needed. With a dynamic
// degree or a run-time shape, check_tensor_extents<Model>(config, degree) throws the same
// numbers in words, identically on every rank, before any layer is built.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/core/extents.hpp"
#include "strata/layers/layer.hpp"
#include "strata/layers/sequential.hpp"
#include "strata/layers/tensor_split.hpp"

namespace strata {

// A model whose shape is part of its type: `static constexpr config shape{...};`.
template <class M>
concept has_static_shape = requires {
  typename M::config;
  M::shape;
}
&&std::is_same_v<std::remove_cvref_t<decltype(M::shape)>, typename M::config>;

template <int Degree, tensor_extent Extent>
struct tensor_degree_divides {
  static_assert(Extent.fits(Degree),
                "strata::tensor: the tensor-parallel degree must divide this extent of the model, or for a "
                "shareable one be a multiple of it (see the template arguments: the degree, then the extent's "
                "name and value)");
  static constexpr bool value = true;
};

namespace detail {
template <int Degree, tensor_extent_list List, std::size_t... K>
consteval bool each_extent_divided(std::index_sequence<K...>) {
  return ((K >= std::size_t(List.count) ||
           tensor_degree_divides<Degree,
                                 (K < std::size_t(List.count) ? List.items[K] : tensor_extent{"", Degree})>::value) &&
          ...);
}
template <int Degree, class Model, std::size_t... I>
consteval bool each_part_divided(std::index_sequence<I...>) {
  constexpr auto layers = Model::layers(Model::shape);
  using list = layers_of<Model>;
  return (each_extent_divided<Degree, tensor_extents_of<typename list::template part_type<I>::layer_type>(
                                          layers.template part<I>().config)>(
              std::make_index_sequence<tensor_extent_list::capacity>{}) &&
          ...);
}
}  // namespace detail

// True, or a compile error naming the numbers (see the top of the file). Nothing to check unless
// both the tensor degree and the shape are static.
template <class Model>
consteval bool check_static_layout() {
  using layout = typename Model::policy::layout;
  if constexpr (has_static_shape<Model> && !is_dynamic(layout::tp)) {
    return detail::each_part_divided<layout::tp, Model>(std::make_index_sequence<layers_of<Model>::size>{});
  } else {
    return true;
  }
}

// The same check at run time, for any shape and degree: throws "tensor parallelism tp=3 does not
// divide heads = 4 (blocks 'h')" when `degree` does not divide an extent of a part.
template <class Model>
constexpr void check_tensor_extents(const typename Model::config& c, int degree, std::string_view prefix = {}) {
  const auto layers = Model::layers(c);
  using list = layers_of<Model>;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (
        [&] {
          using L = typename list::template part_type<I>::layer_type;
          const auto& part = layers.template part<I>();
          const tensor_extent_list extents = tensor_extents_of<L>(part.config);
          if (const tensor_extent* e = extents.first_not_divided_by(degree))
            fail(prefix, "tensor parallelism tp=", degree, " does not divide ", e->name(), " = ", e->extent,
                 e->otherwise(), " (", I == list::blocks_at ? "blocks '" : "layer '", part.name, "')");
        }(),
        ...);
  }
  (std::make_index_sequence<list::size>{});
}

}  // namespace strata
