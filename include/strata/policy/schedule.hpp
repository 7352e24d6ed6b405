// strata/policy/schedule.hpp - the pipeline schedule tags.
//
// A schedule says in which order a pipeline stage runs the forward and backward passes of its
// microbatches. The tags are empty types refined from schedule_tag; the schedules themselves
// (pure functions of stages, microbatches and virtual chunks) live in strata/parallel/.
//   gpipe            all forwards, then all backwards; simplest, holds every microbatch's activations
//   one_f_one_b      warm-up, then alternate one forward / one backward (PipeDream-Flush, Megatron)
//   interleaved_1f1b 1F1B over several virtual chunks per stage; a smaller bubble for more messages
#pragma once
#include <string_view>
#include <type_traits>

namespace strata {

struct schedule_tag {};
struct gpipe : schedule_tag {};
struct one_f_one_b : schedule_tag {};
struct interleaved_1f1b : schedule_tag {};
// The schedule is given at launch (e.g. a --schedule flag).
struct dynamic_schedule : schedule_tag {};

// True for the schedule tags and tags derived from them; false for schedule_tag itself.
template <class T>
inline constexpr bool is_schedule_v = std::is_base_of_v<schedule_tag, T> && !std::is_same_v<T, schedule_tag>;

// True when the schedule runs several virtual chunks per stage.
template <class Schedule>
inline constexpr bool is_interleaved_v = std::is_base_of_v<interleaved_1f1b, Schedule>;

namespace detail {
template <class Schedule>
constexpr std::string_view schedule_name_of() {
  static_assert(is_schedule_v<Schedule>,
                "strata::schedule_name: not a schedule; expected strata::gpipe, strata::one_f_one_b or "
                "strata::interleaved_1f1b");
  if constexpr (std::is_base_of_v<dynamic_schedule, Schedule>) {
    return "dynamic";
  } else if constexpr (std::is_base_of_v<interleaved_1f1b, Schedule>) {
    return "interleaved_1f1b";
  } else if constexpr (std::is_base_of_v<one_f_one_b, Schedule>) {
    return "one_f_one_b";
  } else {
    return "gpipe";
  }
}
}  // namespace detail

// The schedule's name, spelled as its tag: "gpipe", "one_f_one_b", "interleaved_1f1b" (or
// "dynamic": given at launch).
template <class Schedule>
inline constexpr std::string_view schedule_name = detail::schedule_name_of<Schedule>();

}  // namespace strata
