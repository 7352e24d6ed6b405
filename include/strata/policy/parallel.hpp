// strata/policy/parallel.hpp - a parallel layout as one type: strata::parallel<Axes...>.
//
// The axes (data, context, tensor, pipeline, expert; see axes.hpp) may come in any order, each at
// most once; a missing one takes its default: data<dynamic, zero<0>> (DP over whatever ranks are
// left), context<1>, tensor<1>, pipeline<1>, expert<1>. The parser reads them Kokkos-style and
// exposes flat traits, so code below never cares how the user spelled the layout:
//   using L = st::parallel<st::tensor<2, st::sequence_parallel>, st::data<st::dynamic, st::zero<1>>>;
//   L::dp == st::dynamic, L::cp == 1, L::tp == 2, L::pp == 1, L::ep == 1, L::zero_stage == 1,
//   L::sequence_parallel == 1
// A repeated axis or a tag that is not an axis fails to compile, naming what went wrong.
// Dynamic degrees get their values at start-up through resolve_layout (layout.hpp).
#pragma once
#include <type_traits>

#include "strata/core/extents.hpp"
#include "strata/policy/axes.hpp"
#include "strata/policy/mesh_axes.hpp"
#include "strata/policy/schedule.hpp"

namespace strata {

namespace detail {

// The first of Ts that Pred accepts, else Default.
template <template <class> class Pred, class Default, class... Ts>
struct first_or {
  using type = Default;
};
template <template <class> class Pred, class Default, class T, class... Ts>
struct first_or<Pred, Default, T, Ts...> {
  using type = std::conditional_t<Pred<T>::value, T, typename first_or<Pred, Default, Ts...>::type>;
};

template <class Tag>
constexpr bool check_parallel_tag() {
  static_assert(is_data_axis_v<Tag> || is_context_axis_v<Tag> || is_tensor_axis_v<Tag> || is_pipeline_axis_v<Tag> ||
                    is_expert_axis_v<Tag>,
                "strata::parallel: unknown tag; expected strata::data<...>, strata::context<...>, "
                "strata::tensor<...>, strata::pipeline<...> or strata::expert<...>");
  return true;
}

}  // namespace detail

template <class... Axes>
struct parallel {
  static_assert((true && ... && detail::check_parallel_tag<Axes>()));
  static_assert((0 + ... + int(is_data_axis_v<Axes>)) <= 1, "strata::parallel: the data axis is given twice");
  static_assert((0 + ... + int(is_context_axis_v<Axes>)) <= 1, "strata::parallel: the context axis is given twice");
  static_assert((0 + ... + int(is_tensor_axis_v<Axes>)) <= 1, "strata::parallel: the tensor axis is given twice");
  static_assert((0 + ... + int(is_pipeline_axis_v<Axes>)) <= 1, "strata::parallel: the pipeline axis is given twice");
  static_assert((0 + ... + int(is_expert_axis_v<Axes>)) <= 1, "strata::parallel: the expert axis is given twice");

  using data_axis = typename detail::first_or<is_data_axis, data<dynamic, zero<0>>, Axes...>::type;
  using context_axis = typename detail::first_or<is_context_axis, context<1>, Axes...>::type;
  using tensor_axis = typename detail::first_or<is_tensor_axis, tensor<1>, Axes...>::type;
  using pipeline_axis = typename detail::first_or<is_pipeline_axis, pipeline<1>, Axes...>::type;
  using expert_axis = typename detail::first_or<is_expert_axis, expert<1>, Axes...>::type;

  // The same layout with the axes in one fixed order: equal layouts have equal canonical types.
  using canonical = parallel<data_axis, context_axis, tensor_axis, pipeline_axis, expert_axis>;

  // Degrees; each may be strata::dynamic.
  static constexpr int dp = data_axis::degree;
  static constexpr int cp = context_axis::degree;
  static constexpr int tp = tensor_axis::degree;
  static constexpr int pp = pipeline_axis::degree;
  static constexpr int ep = expert_axis::degree;  // inside dp x cp: not a factor of the world size
  // The degree of a mesh axis (policy/mesh_axes.hpp), for code that walks the axis table.
  static constexpr int degree_of(mesh_axis a) {
    switch (a) {
      case mesh_axis::tp: return tp;
      case mesh_axis::cp: return cp;
      case mesh_axis::dp: return dp;
      case mesh_axis::pp: return pp;
    }
    return 1;
  }

  // Each may be left to the launch: strata::dynamic, or dynamic_schedule.
  static constexpr int zero_stage = data_axis::zero_stage;
  static constexpr int sequence_parallel = tensor_axis::sequence_parallel;  // 1, 0 or strata::dynamic
  using context_form = typename context_axis::form;
  using schedule = typename pipeline_axis::schedule;
  static constexpr int microbatches = pipeline_axis::microbatches;
  static constexpr int virtual_chunks = pipeline_axis::virtual_chunks;

  // True when every degree is known at compile time, so the world size is too.
  static constexpr bool is_static =
      !is_dynamic(dp) && !is_dynamic(cp) && !is_dynamic(tp) && !is_dynamic(pp) && !is_dynamic(ep);
  // True when, besides the degrees, the ZeRO stage, sequence parallelism, the context form, the
  // schedule and the virtual chunks are fixed: all a plan needs but the batch.
  static constexpr bool is_fully_static = is_static && !is_dynamic(zero_stage) && !is_dynamic(sequence_parallel) &&
                                          !std::is_same_v<context_form, dynamic_context_form> &&
                                          !std::is_same_v<schedule, dynamic_schedule> && !is_dynamic(virtual_chunks);
};

template <class T>
struct is_parallel : std::false_type {};
template <class... Axes>
struct is_parallel<parallel<Axes...>> : std::true_type {};
template <class T>
inline constexpr bool is_parallel_v = is_parallel<T>::value;

// A parallel layout: strata::parallel<...> (or an alias of one).
template <class T>
concept parallel_layout = is_parallel_v<T>;

// One rank does everything: the reference every other layout is tested against.
using serial = parallel<data<1>, context<1>, tensor<1>, pipeline<1>, expert<1>>;
static_assert(parallel_layout<serial> && serial::is_static);

}  // namespace strata
