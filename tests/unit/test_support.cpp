// The table of supported combinations (policy/support.hpp), walked row by row: each row refuses
// the combination it names - at start-up through check_supported, in its words with the degree,
// and at compile time through refused_statically under a static policy built from the row -
// and nothing that differs from it in one of the columns it names. A degree left to the launch
// is never refused at compile time. The static_asserts' own words are the compile-fail tests
// unsupported_*; the places that refuse are tested where they refuse (moe, cp, generate, cli).
#include <doctest/doctest.h>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

#include "strata/policy/policy.hpp"
#include "strata/policy/support.hpp"

namespace st = strata;

namespace {

// The combination row `u` names, every axis it names at degree 2; the open columns at the
// defaults (the host, no axis split, no layer kind, fp32, 1F1B).
st::combination named_by(const st::unsupported_combination& u) {
  st::combination c;
  if (!u.device.any) c.device = u.device.value;
  if (!u.axis.any) c.with(u.axis.value, 2);
  if (!u.layer.any) c.with(u.layer.value);
  if (!u.precision.any) c.precision = u.precision.value;
  if (!u.schedule.any) c.schedule = u.schedule.value;
  return c;
}

// The same, one named column moved off the row's value; false when the row leaves it open.
bool moved(const st::unsupported_combination& u, int column, st::combination& c) {
  c = named_by(u);
  const auto other = [](auto v, std::size_t count) { return decltype(v)((std::size_t(v) + 1) % count); };
  switch (column) {
    case 0: c.device = other(c.device, st::device_kind_names.size()); return !u.device.any;
    case 1: c.with(u.axis.value, 1); return !u.axis.any;
    case 2: c.layers = 0; return !u.layer.any;
    case 3: c.precision = other(c.precision, st::precision_kind_names.size()); return !u.precision.any;
    case 4: c.schedule = other(c.schedule, st::schedule_kind_names.size()); return !u.schedule.any;
  }
  return false;
}

// ---- a static policy from row I: its device, precision and schedule, its axis at degree 2 (or
// left to the launch) ----
template <std::size_t I>
constexpr const st::unsupported_combination& row = st::unsupported_combinations[I];

template <std::size_t I>
constexpr int degree(st::run_axis a, int split) {
  if (!row<I>.axis.any && row<I>.axis.value == a) return split;
  return a == st::mesh_axis::dp && !row<I>.axis.any && row<I>.axis.value == st::expert_parallel ? 2 : 1;
}
template <std::size_t I>
using device_of =
    std::conditional_t<!row<I>.device.any && row<I>.device.value == st::device_kind::cuda, st::cuda, st::host>;
template <st::precision_kind K>
using precision_named = std::conditional_t<
    K == st::precision_kind::fp64, st::fp64,
    std::conditional_t<K == st::precision_kind::bf16, st::mixed<st::bf16, float>,
                       std::conditional_t<K == st::precision_kind::fp16, st::mixed<st::fp16, float>, st::fp32>>>;
template <std::size_t I>
using precision_of = precision_named<row<I>.precision.any ? st::precision_kind::fp32 : row<I>.precision.value>;
template <st::schedule_kind K>
using schedule_named = std::conditional_t<
    K == st::schedule_kind::gpipe, st::gpipe,
    std::conditional_t<K == st::schedule_kind::interleaved_1f1b, st::interleaved_1f1b, st::one_f_one_b>>;
template <std::size_t I>
using schedule_of = schedule_named<row<I>.schedule.any ? st::schedule_kind::one_f_one_b : row<I>.schedule.value>;

template <std::size_t I, int Split>
using policy_of = st::policy<
    device_of<I>,
    st::parallel<st::data<degree<I>(st::mesh_axis::dp, Split)>, st::context<degree<I>(st::mesh_axis::cp, Split)>,
                 st::tensor<degree<I>(st::mesh_axis::tp, Split)>,
                 st::pipeline<degree<I>(st::mesh_axis::pp, Split), schedule_of<I>, 4>,
                 st::expert<degree<I>(st::expert_parallel, Split)>>,
    precision_of<I>>;

template <std::size_t I>
constexpr bool refused_at_compile_time() {
  constexpr auto& u = row<I>;
  if constexpr (u.layer.any) return st::refused_statically<policy_of<I, 2>>(u, {});
  else return st::refused_statically<policy_of<I, 2>>(u, {u.layer.value});
}
template <std::size_t I>
constexpr bool left_to_start_up() {
  constexpr auto& u = row<I>;
  if constexpr (u.axis.any) return true;  // nothing the launch gives
  else if constexpr (u.layer.any) return !st::refused_statically<policy_of<I, st::dynamic>>(u, {});
  else return !st::refused_statically<policy_of<I, st::dynamic>>(u, {u.layer.value});
}
template <std::size_t... I>
constexpr bool every_row_at_compile_time(std::index_sequence<I...>) {
  return (refused_at_compile_time<I>() && ...) && (left_to_start_up<I>() && ...);
}
static_assert(every_row_at_compile_time(std::make_index_sequence<st::unsupported_combination_count>{}));

}  // namespace

TEST_CASE("each row of the table refuses the combination it names, in its words with the degree") {
  REQUIRE(st::unsupported_combination_count >= 6);
  for (const auto& u : st::unsupported_combinations) {
    CAPTURE(u.name);
    const auto c = named_by(u);
    const auto* found = st::refusal_of(c);
    REQUIRE(found != nullptr);
    CHECK(found->row == u.row);
    std::string words = std::string(u.subject) + " " + std::string(u.condition);
    if (!u.axis.any) words += " (" + std::string(u.axis.value.name()) + "=2)";
    words += " is not supported yet (" + std::string(u.why) + ") [unsupported combination '" + std::string(u.name) +
             "', policy/support.hpp]";
    CHECK(st::refusal_text(u, c) == words);
    CHECK_THROWS_WITH_AS(st::check_supported(c, "start-up"), ("start-up: " + words).c_str(), st::error);
    // Without the degree (the caller's words say it): the compile-time words exactly.
    auto unsaid = c;
    if (!u.axis.any) unsaid.with(u.axis.value);
    CHECK(st::refusal_text(u, unsaid) == std::string(u.text));
  }
}

TEST_CASE("no row refuses a combination that differs from it in a column it names") {
  int moves = 0;
  for (const auto& u : st::unsupported_combinations) {
    for (int column = 0; column < 5; ++column) {
      CAPTURE(u.name);
      CAPTURE(column);
      st::combination c;
      if (!moved(u, column, c)) continue;
      ++moves;
      CHECK_FALSE(st::matches(u, c));
    }
  }
  CHECK(moves >= 2 * int(st::unsupported_combination_count));  // each row names two columns at least
}

TEST_CASE("what no row names is supported, and the table prints one line per row") {
  st::combination everything_split;
  for (const auto& a : st::mesh_axes) everything_split.with(a.axis, 2);
  everything_split.with(st::expert_parallel, 2);
  everything_split.precision = st::precision_kind::bf16;
  everything_split.schedule = st::schedule_kind::interleaved_1f1b;
  CHECK(st::refusal_of(everything_split) == nullptr);  // dense layers, the host, every axis
  CHECK_NOTHROW(
      st::check_supported(st::combination{.device = st::device_kind::cuda}.with(st::mesh_axis::tp, 8), "start-up"));
  const std::string table = st::unsupported_combinations_markdown();
  std::size_t rows = 0;
  for (std::size_t at = table.find("\n| `"); at != std::string::npos; at = table.find("\n| `", at + 1)) ++rows;
  CHECK(rows == st::unsupported_combination_count);
  for (const auto& u : st::unsupported_combinations)
    CHECK(table.find("| `" + std::string(u.name) + "` |") != std::string::npos);
}

TEST_CASE("a combination from a policy and a resolved layout") {
  using P = st::policy<st::host, st::parallel<st::data<st::dynamic>>, st::mixed<st::bf16, float>>;
  st::layout_config l;
  l.cp = 2;
  l.pp = 2;
  l.schedule = "gpipe";
  const auto c = st::combination_of<P>(l, {st::layer_kind::experts});
  CHECK(c.device == st::device_kind::host);
  CHECK(c.precision == st::precision_kind::bf16);
  CHECK(c.schedule == st::schedule_kind::gpipe);
  CHECK(c.splits(st::mesh_axis::cp));
  CHECK_FALSE(c.splits(st::mesh_axis::tp));
  CHECK(c.splits(st::mesh_axis::pp));
  CHECK_FALSE(c.splits(st::expert_parallel));
  const auto* u = st::refusal_of(c);
  REQUIRE(u != nullptr);
  CHECK(u->row == st::support_row::experts_under_context);
  CHECK(st::device_kind_of<st::cuda>() == st::device_kind::cuda);
  CHECK(st::precision_kind_of<st::fp64>() == st::precision_kind::fp64);
  CHECK_THROWS_WITH_AS(st::schedule_kind_of("zigzag"), doctest::Contains("'zigzag' is not a pipeline schedule"),
                       st::error);
}
