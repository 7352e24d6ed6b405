// strata/policy/support.hpp - the one table of supported combinations.
//
// A combination is a device, the axes that split the run (degree > 1), the kinds of layer the
// model holds or the run uses, the precision and the pipeline schedule. Every combination is
// supported but those a row below refuses; a row names what it constrains and leaves the rest
// open (any_kind). Whatever refuses a combination reads this table, with the same words:
//
//   - a layer whose policy is static (its device, precision and declared degrees): at compile
//     time, through check_static_support<P, kinds...>() in a static_assert;
//   - a layer as it is built, and the run's assembly at start-up (training, the GPU groups,
//     generation, gpt2_train): check_supported(combination, who), alike on every rank;
//   - strata-plan, for the rows its plans can meet (axes and layer kinds; a plan holds no
//     kernel, so the device rows do not stop it), and `strata-plan --supported`, which prints
//     the table that docs/supported-combinations.md holds (a test keeps the two equal).
//
// A refusal reads "<who>: <subject> <condition> (cp=2) is not supported yet (<why>)
// [unsupported combination '<row>', policy/support.hpp]"; at compile time without the degrees.
//
// The rows are a macro because C++20's static_assert takes only a string literal: each row's
// words are literals that the compile-time and the start-up refusals both spell.
#pragma once
#include <array>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>

#include "strata/core/error.hpp"
#include "strata/core/extents.hpp"
#include "strata/policy/device.hpp"
#include "strata/policy/layout.hpp"
#include "strata/policy/mesh_axes.hpp"
#include "strata/policy/parallel.hpp"
#include "strata/policy/precision.hpp"
#include "strata/policy/schedule.hpp"

namespace strata {

enum class device_kind : int { host, cuda };
// An axis a row may name: one of the mesh's (policy/mesh_axes.hpp), or expert parallelism, which
// shares experts out inside the gradient group and is no dimension of the mesh.
struct run_axis {
  std::size_t index = 0;  // into mesh_axes; mesh_axis_count for expert parallelism
  constexpr run_axis() = default;
  constexpr run_axis(mesh_axis a) : index(index_of(a)) {}
  static constexpr run_axis experts() {
    run_axis a;
    a.index = mesh_axis_count;
    return a;
  }
  constexpr bool operator==(const run_axis&) const = default;
  constexpr bool is_mesh_axis() const { return index < mesh_axis_count; }
  constexpr std::string_view name() const { return is_mesh_axis() ? mesh_axes[index].name : "ep"; }
};
inline constexpr std::size_t run_axis_count = mesh_axis_count + 1;
inline constexpr run_axis expert_parallel = run_axis::experts();
enum class layer_kind : int {
  experts,           // a mixture of experts (st::moe)
  cached_attention,  // attention over a key/value cache (generation with the cache)
  output_logits,     // the output layer's logits for sampling, and generation
  whole_model,       // a forward of the whole model on each rank (generation without the cache)
};
enum class precision_kind : int { fp32, fp64, bf16, fp16 };
enum class schedule_kind : int { gpipe, one_f_one_b, interleaved_1f1b };

inline constexpr std::array<std::string_view, 2> device_kind_names{"host", "cuda"};
inline constexpr std::array<std::string_view, 4> layer_kind_names{"experts", "cached_attention", "output_logits",
                                                                  "whole_model"};
inline constexpr std::array<std::string_view, 4> precision_kind_names{"fp32", "fp64", "bf16", "fp16"};
inline constexpr std::array<std::string_view, 3> schedule_kind_names{"gpipe", "one_f_one_b", "interleaved_1f1b"};

// A row's column: one value, or any.
struct any_kind_t {};
inline constexpr any_kind_t any_kind{};
template <class E>
struct support_column {
  bool any = true;
  E value{};
  constexpr support_column(any_kind_t) {}
  template <class V>
  requires std::is_convertible_v<V, E>
  constexpr support_column(V v) : any(false), value(v) {}
};

// clang-format off
// ROW(name, device, axis, layer, precision, schedule, subject, condition, why)
#define STRATA_UNSUPPORTED_COMBINATIONS(ROW)                                                                   \
  ROW(experts_on_cuda, device_kind::cuda, any_kind, layer_kind::experts, any_kind, any_kind,                   \
      "a mixture of experts", "on the CUDA device",                                                             \
      "the mixture-of-experts kernels run on the host only so far")                                            \
  ROW(expert_parallel_on_cuda, device_kind::cuda, expert_parallel, any_kind, any_kind, any_kind,               \
      "expert parallelism", "on the CUDA device",                                                               \
      "the mixture-of-experts kernels run on the host only so far")                                            \
  ROW(experts_under_context, any_kind, mesh_axis::cp, layer_kind::experts, any_kind, any_kind,                 \
      "a mixture of experts", "under context parallelism",                                                      \
      "its per-sequence statistics would be split over the context group")                                     \
  ROW(cached_attention_on_cuda, device_kind::cuda, any_kind, layer_kind::cached_attention, any_kind, any_kind, \
      "generation with the key/value cache", "on the CUDA device",                                              \
      "attention over a cache has no CUDA kernel yet (kernels/cached_attention.hpp); under a cuda policy "      \
      "generate with generation::cache = false")                                                                \
  ROW(logits_under_context, any_kind, mesh_axis::cp, layer_kind::output_logits, any_kind, any_kind,            \
      "logits and generation", "under context parallelism",                                                     \
      "each rank holds chunks of a sequence, and decoding adds one position at a time; load the checkpoint "   \
      "into a layout without cp (checkpoints resume under any layout)")                                         \
  ROW(whole_model_under_pipeline, any_kind, mesh_axis::pp, layer_kind::whole_model, any_kind, any_kind,        \
      "generation without the key/value cache", "under pipeline parallelism",                                   \
      "the reference runs the whole model on each rank; this one is split over pipeline stages (generate "     \
      "with the cache)")
// clang-format on

#define STRATA_SUPPORT_ROW_NAME(name, ...) name,
enum class support_row : int { STRATA_UNSUPPORTED_COMBINATIONS(STRATA_SUPPORT_ROW_NAME) };
#undef STRATA_SUPPORT_ROW_NAME

struct unsupported_combination {
  support_row row;
  std::string_view name;
  support_column<device_kind> device;
  support_column<run_axis> axis;
  support_column<layer_kind> layer;
  support_column<precision_kind> precision;
  support_column<schedule_kind> schedule;
  std::string_view subject, condition, why;
  std::string_view text;  // the refusal without the degrees: what a static_assert says
};

// The refusal's words as one literal, for the compile-time check (the start-up one inserts the
// degrees after the condition).
#define STRATA_SUPPORT_ROW_TEXT(name, subject, condition, why)                             \
  subject " " condition " is not supported yet (" why ") [unsupported combination '" #name \
          "', "                                                                            \
          "policy/support.hpp]"
#define STRATA_SUPPORT_ROW_ENTRY(name, device, axis, layer, precision, schedule, subject, condition, why) \
  unsupported_combination{support_row::name,                                                              \
                          #name,                                                                          \
                          device,                                                                         \
                          axis,                                                                           \
                          layer,                                                                          \
                          precision,                                                                      \
                          schedule,                                                                       \
                          subject,                                                                        \
                          condition,                                                                      \
                          why,                                                                            \
                          STRATA_SUPPORT_ROW_TEXT(name, subject, condition, why)},
inline constexpr unsupported_combination unsupported_combinations[] = {
    STRATA_UNSUPPORTED_COMBINATIONS(STRATA_SUPPORT_ROW_ENTRY)};
#undef STRATA_SUPPORT_ROW_ENTRY
inline constexpr std::size_t unsupported_combination_count = std::size(unsupported_combinations);
static_assert([] {
  for (std::size_t i = 0; i < unsupported_combination_count; ++i)
    if (static_cast<std::size_t>(unsupported_combinations[i].row) != i) return false;
  return true;
}());

constexpr const unsupported_combination& describe(support_row r) {
  return unsupported_combinations[static_cast<std::size_t>(r)];
}

// A combination to check. A degree of 0 means "more than one, not said" (the refusal then names
// no number: the caller's words already do).
struct combination {
  device_kind device = device_kind::host;
  std::array<int, run_axis_count> degrees = [] {
    std::array<int, run_axis_count> d{};
    d.fill(1);
    return d;
  }();
  unsigned layers = 0;  // bits by layer_kind
  precision_kind precision = precision_kind::fp32;
  schedule_kind schedule = schedule_kind::one_f_one_b;

  constexpr bool splits(run_axis a) const { return degrees[a.index] != 1; }
  constexpr bool holds(layer_kind k) const { return (layers >> unsigned(k)) & 1u; }
  constexpr combination& with(layer_kind k) {
    layers |= 1u << unsigned(k);
    return *this;
  }
  constexpr combination& with(run_axis a, int degree = 0) {
    degrees[a.index] = degree;
    return *this;
  }
};

constexpr bool matches(const unsupported_combination& u, const combination& c) {
  return (u.device.any || u.device.value == c.device) && (u.axis.any || c.splits(u.axis.value)) &&
         (u.layer.any || c.holds(u.layer.value)) && (u.precision.any || u.precision.value == c.precision) &&
         (u.schedule.any || u.schedule.value == c.schedule);
}
// The first row that refuses `c`, or null.
constexpr const unsupported_combination* refusal_of(const combination& c) {
  for (const auto& u : unsupported_combinations)
    if (matches(u, c)) return &u;
  return nullptr;
}

// The refusal's words for `c`: the row's, with the refused axis's degree when `c` says it.
inline std::string refusal_text(const unsupported_combination& u, const combination& c) {
  std::string s = std::string(u.subject) + " " + std::string(u.condition);
  if (!u.axis.any && c.degrees[u.axis.value.index] > 1)
    s += " (" + std::string(u.axis.value.name()) + "=" + std::to_string(c.degrees[u.axis.value.index]) + ")";
  return s + std::string(u.text.substr(u.subject.size() + 1 + u.condition.size()));
}

// Start-up: refuses `c` if a row does, naming `who`, the combination and the row.
inline void check_supported(const combination& c, std::string_view who) {
  if (const auto* u = refusal_of(c)) fail(who, ": ", refusal_text(*u, c));
}

// ---- what a policy says ----

template <class Device>
constexpr device_kind device_kind_of() {
  return std::is_base_of_v<cuda, Device> ? device_kind::cuda : device_kind::host;
}
template <class Precision>
constexpr precision_kind precision_kind_of() {
  using S = typename Precision::storage;
  if constexpr (std::is_same_v<S, double>) return precision_kind::fp64;
  else if constexpr (std::is_same_v<S, bf16>) return precision_kind::bf16;
  else if constexpr (std::is_same_v<S, fp16>) return precision_kind::fp16;
  else return precision_kind::fp32;
}
inline schedule_kind schedule_kind_of(std::string_view name) {
  for (std::size_t i = 0; i < schedule_kind_names.size(); ++i)
    if (schedule_kind_names[i] == name) return schedule_kind(i);
  fail("strata: '", name, "' is not a pipeline schedule (gpipe, one_f_one_b or interleaved_1f1b)");
}

// A run of policy P under the resolved layout `l`, its model holding `layers`.
template <class P>
combination combination_of(const layout_config& l, std::initializer_list<layer_kind> layers = {}) {
  combination c{.device = device_kind_of<typename P::device>(),
                .precision = precision_kind_of<typename P::precision>(),
                .schedule = schedule_kind_of(l.schedule)};
  for (const auto& a : mesh_axes) c.with(a.axis, l.degree(a.axis));
  c.with(expert_parallel, l.ep);
  for (const auto k : layers) c.with(k);
  return c;
}

namespace detail {
template <class Layout>
constexpr int static_degree(run_axis a) {
  return a.is_mesh_axis() ? Layout::degree_of(mesh_axes[a.index].axis) : Layout::ep;
}
template <class Schedule>
constexpr bool static_schedule_is(schedule_kind k) {
  if constexpr (std::is_same_v<Schedule, dynamic_schedule>) return false;
  else return schedule_name<Schedule> == schedule_kind_names[std::size_t(k)];
}
}  // namespace detail

// Whether row `u` refuses every run of policy P whose model holds `layers`: the device and the
// precision are P's; an axis is known to split when the layout declares its degree above one, a
// schedule when the layout declares it. A dynamic degree is left to the start-up check.
template <class P>
constexpr bool refused_statically(const unsupported_combination& u, std::initializer_list<layer_kind> layers) {
  using L = typename P::layout;
  bool layer = u.layer.any;
  for (const auto k : layers) layer = layer || k == u.layer.value;
  const auto degree = u.axis.any ? 2 : detail::static_degree<L>(u.axis.value);
  return layer && (u.device.any || u.device.value == device_kind_of<typename P::device>()) &&
         (u.precision.any || u.precision.value == precision_kind_of<typename P::precision>()) &&
         (u.axis.any || (!is_dynamic(degree) && degree > 1)) &&
         (u.schedule.any || detail::static_schedule_is<typename L::schedule>(u.schedule.value));
}

// Compile time: true, or a static_assert naming the first refused row in its own words.
//   static_assert(check_static_support<P, layer_kind::experts>());
template <class P, layer_kind... Layers>
constexpr bool check_static_support() {
#define STRATA_SUPPORT_STATIC_CHECK(name, device, axis, layer, precision, schedule, subject, condition, why) \
  static_assert(!refused_statically<P>(describe(support_row::name), {Layers...}),                            \
                "strata: " STRATA_SUPPORT_ROW_TEXT(name, subject, condition, why));
  STRATA_UNSUPPORTED_COMBINATIONS(STRATA_SUPPORT_STATIC_CHECK)
#undef STRATA_SUPPORT_STATIC_CHECK
  return true;
}

// The table as docs/supported-combinations.md holds it (strata-plan --supported prints it).
inline std::string unsupported_combinations_markdown() {
  const auto cell = [](const auto& column, const auto& names) {
    return column.any ? std::string("any") : "`" + std::string(names[std::size_t(column.value)]) + "`";
  };
  const auto axis_cell = [](const support_column<run_axis>& column) {
    return column.any ? std::string("any") : "`" + std::string(column.value.name()) + "`";
  };
  std::string s =
      "| row | device | axis | layer kind | precision | schedule | refused because |\n"
      "|---|---|---|---|---|---|---|\n";
  for (const auto& u : unsupported_combinations)
    s += "| `" + std::string(u.name) + "` | " + cell(u.device, device_kind_names) + " | " + axis_cell(u.axis) + " | " +
         cell(u.layer, layer_kind_names) + " | " + cell(u.precision, precision_kind_names) + " | " +
         cell(u.schedule, schedule_kind_names) + " | " + std::string(u.subject) + " " + std::string(u.condition) +
         ": " + std::string(u.why) + " |\n";
  return s;
}

}  // namespace strata
