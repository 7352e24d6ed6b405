// strata/policy/recompute.hpp - activation recomputation: the modes and their tags.
//
//   none       keep every activation from forward to backward
//   selective  drop the attention's logsumexps (one per query row) after forward and recompute
//              them in backward (after Korthikanti et al. 2022, who drop the probabilities)
//   full       keep only each wrapped layer's output; backward runs its forward again first
//
// A mode is fixed in a type (strata::recompute<strata::selective, L>) or taken at run time from
// where the layer is built (strata::recompute_from_context: the model context's mode, which an
// assembled model sets from its options, e.g. a --recompute flag).
#pragma once
#include <string_view>
#include <type_traits>

#include "strata/core/error.hpp"

namespace strata {

enum class recompute_mode { none, selective, full };

inline recompute_mode parse_recompute_mode(std::string_view s) {
  if (s == "none") return recompute_mode::none;
  if (s == "selective") return recompute_mode::selective;
  if (s == "full") return recompute_mode::full;
  fail("recompute: unknown mode '", s, "' (none, selective or full)");
}
constexpr std::string_view recompute_label(recompute_mode m) {
  switch (m) {
    case recompute_mode::selective: return "selective";
    case recompute_mode::full: return "full";
    case recompute_mode::none: break;
  }
  return "none";
}

struct recompute_tag {};
struct no_recompute : recompute_tag {
  static constexpr recompute_mode mode = recompute_mode::none;
};
struct selective : recompute_tag {
  static constexpr recompute_mode mode = recompute_mode::selective;
};
struct full : recompute_tag {
  static constexpr recompute_mode mode = recompute_mode::full;
};
// The mode of the model context the layer is built in.
struct recompute_from_context : recompute_tag {};

template <class T>
inline constexpr bool is_recompute_tag_v = std::is_base_of_v<recompute_tag, T> && !std::is_same_v<T, recompute_tag>;

}  // namespace strata
