// strata/policy/axes.hpp - the parallel axes as tags: data, context, tensor, pipeline and expert.
//
// Each axis is an empty template whose arguments are its settings; a layout is a list of them
// (see parallel.hpp). A degree is a number fixed at compile time or strata::dynamic, read at
// start-up (see layout.hpp). Bad settings fail to compile: each check sits in a small helper
// function template, so besides the rule the compiler prints the offending numbers, e.g.
//   In instantiation of 'constexpr bool strata::detail::check_tensor_degree() [with int Degree = 0]'
//   error: static assertion failed: strata::tensor: a degree must be >= 1 or strata::dynamic
#pragma once
#include <type_traits>

#include "strata/core/extents.hpp"
#include "strata/policy/schedule.hpp"

namespace strata {

// ---- ZeRO: how much of the optimizer state, gradients and parameters data ranks shard ----
// 0: nothing sharded (plain DP), 1: optimizer state, 2: + gradients, 3: + parameters;
// strata::dynamic: given at launch.
template <int Stage>
struct zero {
  static_assert((Stage >= 0 && Stage <= 3) || Stage == dynamic,
                "strata::zero: ZeRO stage must be 0, 1, 2, 3 or strata::dynamic");
  static constexpr int stage = Stage;
};

template <class T>
inline constexpr bool is_zero_v = false;
template <int Stage>
inline constexpr bool is_zero_v<zero<Stage>> = true;

// ---- The forms of context parallelism ----
// Ring attention: key/value blocks travel the context ring while each rank attends to them.
struct ring {};
// All-to-all (Ulysses): heads scattered and the sequence gathered around attention; needs the
// query and key/value heads (per tensor rank) divisible by the context degree.
struct all_to_all {};
// The form as the launch says (a --cp-form flag).
struct dynamic_context_form {};

template <class T>
inline constexpr bool is_context_form_v =
    std::is_same_v<T, ring> || std::is_same_v<T, all_to_all> || std::is_same_v<T, dynamic_context_form>;
// The form's name in layouts, flags and checkpoints; "dynamic" while open.
template <class T>
inline constexpr const char* context_form_name = std::is_same_v<T, all_to_all> ? "all_to_all"
                                                 : std::is_same_v<T, ring>     ? "ring"
                                                                               : "dynamic";

// ---- The option tags for the tensor axis ----
// Megatron sequence parallelism: the norm/dropout regions are split along the sequence over
// the tensor group, turning each TP all-reduce into a reduce-scatter / all-gather pair.
struct sequence_parallel {};
// Sequence parallelism on or off as the launch says (e.g. a --sp flag).
struct dynamic_sequence_parallel {};

namespace detail {

// One helper per rule; the template arguments carry the numbers into the compiler's message.
template <int Degree>
constexpr bool check_data_degree() {
  static_assert(is_valid_extent(Degree), "strata::data: a degree must be >= 1 or strata::dynamic");
  return true;
}
template <class Zero>
constexpr bool check_data_zero() {
  static_assert(is_zero_v<Zero>, "strata::data: the second argument must be strata::zero<0..3>");
  return true;
}
// The stage of a zero<> tag; 0 for anything else, which check_data_zero has already reported.
template <class Zero>
constexpr int zero_stage_of() {
  if constexpr (is_zero_v<Zero>) {
    return Zero::stage;
  } else {
    return 0;
  }
}

template <int Degree>
constexpr bool check_tensor_degree() {
  static_assert(is_valid_extent(Degree), "strata::tensor: a degree must be >= 1 or strata::dynamic");
  return true;
}
template <class Option>
constexpr bool check_tensor_option() {
  static_assert(
      std::is_same_v<Option, strata::sequence_parallel> || std::is_same_v<Option, strata::dynamic_sequence_parallel>,
      "strata::tensor: unknown option; the tensor options are strata::sequence_parallel and "
      "strata::dynamic_sequence_parallel");
  return true;
}
template <int Degree>
constexpr bool check_context_degree() {
  static_assert(is_valid_extent(Degree), "strata::context: a degree must be >= 1 or strata::dynamic");
  return true;
}
template <class Form>
constexpr bool check_context_form() {
  static_assert(is_context_form_v<Form>,
                "strata::context: the form must be strata::ring, strata::all_to_all or strata::dynamic_context_form");
  return true;
}
template <int Degree>
constexpr bool check_expert_degree() {
  static_assert(is_valid_extent(Degree), "strata::expert: a degree must be >= 1 or strata::dynamic");
  return true;
}
template <int Degree>
constexpr bool check_pipeline_degree() {
  static_assert(is_valid_extent(Degree), "strata::pipeline: a degree must be >= 1 or strata::dynamic");
  return true;
}
template <class Schedule>
constexpr bool check_pipeline_schedule() {
  static_assert(is_schedule_v<Schedule>,
                "strata::pipeline: the schedule must be strata::gpipe, strata::one_f_one_b or "
                "strata::interleaved_1f1b");
  return true;
}
template <int Microbatches>
constexpr bool check_pipeline_microbatches() {
  static_assert(is_valid_extent(Microbatches), "strata::pipeline: microbatches must be >= 1 or strata::dynamic");
  return true;
}
template <int Virtual>
constexpr bool check_pipeline_virtual() {
  static_assert(is_valid_extent(Virtual), "strata::pipeline: virtual chunks per stage must be >= 1 or strata::dynamic");
  return true;
}
template <class Schedule, int Virtual>
constexpr bool check_virtual_needs_interleaving() {
  static_assert(
      Virtual == 1 || is_dynamic(Virtual) || is_interleaved_v<Schedule> || std::is_same_v<Schedule, dynamic_schedule>,
      "strata::pipeline: virtual chunks > 1 need the strata::interleaved_1f1b schedule");
  return true;
}
// Interleaving hands microbatches to stages in groups of Degree, so the count must divide.
// Checked here when both numbers are static; resolve_layout checks it at start-up otherwise.
template <class Schedule, int Microbatches, int Degree>
constexpr bool check_interleaved_divisible() {
  if constexpr (is_interleaved_v<Schedule> && !is_dynamic(Microbatches) && !is_dynamic(Degree) && Degree >= 1) {
    static_assert(Microbatches % Degree == 0,
                  "strata::pipeline: interleaved 1F1B needs microbatches divisible by the pipeline degree");
  }
  return true;
}

}  // namespace detail

// ---- data: replicate the model over Degree ranks, each taking a slice of the batch ----
template <int Degree = dynamic, class Zero = zero<0>>
struct data {
  static_assert(detail::check_data_degree<Degree>() && detail::check_data_zero<Zero>());
  static constexpr int degree = Degree;
  static constexpr int zero_stage = detail::zero_stage_of<Zero>();
};

// ---- context: split every sequence over Degree ranks (context parallelism) ----
// Each rank holds 2 chunks of 2·Degree of every sequence (layers/context_split.hpp); attention
// reaches the other ranks' tokens in the given Form. Parameters are replicated over the axis.
template <int Degree = 1, class Form = ring>
struct context {
  static_assert(detail::check_context_degree<Degree>() && detail::check_context_form<Form>());
  static constexpr int degree = Degree;
  using form = Form;
};

// ---- tensor: split each layer's matrices over Degree ranks (Megatron TP) ----
// sequence_parallel is 1 (on), 0 (off) or strata::dynamic (dynamic_sequence_parallel: the launch says).
template <int Degree = 1, class... Options>
struct tensor {
  static_assert(detail::check_tensor_degree<Degree>() && (detail::check_tensor_option<Options>() && ...));
  static_assert((0 + ... +
                 int(std::is_same_v<Options, strata::sequence_parallel> ||
                     std::is_same_v<Options, strata::dynamic_sequence_parallel>)) <= 1,
                "strata::tensor: sequence parallelism is given twice");
  static constexpr int degree = Degree;
  static constexpr int sequence_parallel = (false || ... || std::is_same_v<Options, strata::dynamic_sequence_parallel>)
                                               ? dynamic
                                           : (false || ... || std::is_same_v<Options, strata::sequence_parallel>) ? 1
                                                                                                                  : 0;
};

// ---- pipeline: split the layer stack into Degree stages, fed Microbatches per step ----
// Virtual is the number of model chunks per stage; > 1 only with interleaved_1f1b. The schedule
// may be strata::dynamic_schedule and the numbers strata::dynamic: the launch gives them.
template <int Degree = 1, class Schedule = one_f_one_b, int Microbatches = 1, int Virtual = 1>
struct pipeline {
  static_assert(detail::check_pipeline_degree<Degree>() && detail::check_pipeline_schedule<Schedule>() &&
                detail::check_pipeline_microbatches<Microbatches>() && detail::check_pipeline_virtual<Virtual>() &&
                detail::check_virtual_needs_interleaving<Schedule, Virtual>() &&
                detail::check_interleaved_divisible<Schedule, Microbatches, Degree>());
  static constexpr int degree = Degree;
  using schedule = Schedule;
  static constexpr int microbatches = Microbatches;
  static constexpr int virtual_chunks = Virtual;
};

// ---- expert: shard a mixture of experts' experts over Degree ranks (expert parallelism) ----
// Not a dimension of its own: the expert group is Degree consecutive ranks of the gradient group
// (dp x cp), as Megatron-Core forms it, so Degree must divide dp·cp. Each rank of the group holds
// E/Degree experts, and tokens travel to their experts' ranks by all-to-all (layers/moe.hpp).
// An expert's gradient is reduced over the ranks holding the same experts: the expert-data group,
// dp·cp/Degree ranks. A dynamic degree the launch does not give is 1.
template <int Degree = 1>
struct expert {
  static_assert(detail::check_expert_degree<Degree>());
  static constexpr int degree = Degree;
};

// ---- Recognizers, used by the parser in parallel.hpp ----
template <class T>
struct is_data_axis : std::false_type {};
template <int D, class Z>
struct is_data_axis<data<D, Z>> : std::true_type {};
template <class T>
inline constexpr bool is_data_axis_v = is_data_axis<T>::value;

template <class T>
struct is_context_axis : std::false_type {};
template <int D, class F>
struct is_context_axis<context<D, F>> : std::true_type {};
template <class T>
inline constexpr bool is_context_axis_v = is_context_axis<T>::value;

template <class T>
struct is_tensor_axis : std::false_type {};
template <int D, class... O>
struct is_tensor_axis<tensor<D, O...>> : std::true_type {};
template <class T>
inline constexpr bool is_tensor_axis_v = is_tensor_axis<T>::value;

template <class T>
struct is_expert_axis : std::false_type {};
template <int D>
struct is_expert_axis<expert<D>> : std::true_type {};
template <class T>
inline constexpr bool is_expert_axis_v = is_expert_axis<T>::value;

template <class T>
struct is_pipeline_axis : std::false_type {};
template <int D, class S, int M, int V>
struct is_pipeline_axis<pipeline<D, S, M, V>> : std::true_type {};
template <class T>
inline constexpr bool is_pipeline_axis_v = is_pipeline_axis<T>::value;

}  // namespace strata
