// strata/policy/layout.hpp - a parallel layout resolved against the launch: all numbers known.
//
// A layout type may leave degrees, the microbatch and virtual chunk counts and the ZeRO stage as
// strata::dynamic, sequence parallelism as dynamic_sequence_parallel and the schedule as
// dynamic_schedule. At start-up every rank calls resolve_layout with the world size and the
// values given at launch; the result is a plain layout_config with everything filled in, or a
// strata::error whose one line names the values that disagree. Every rank sees the same inputs,
// so every rank fails with the same words.
//
//   using L = st::parallel<st::data<st::dynamic, st::zero<1>>, st::tensor<st::dynamic>>;
//   st::layout_config cfg = st::resolve_layout<L>(world_size, {.tp = 2});  // dp = world / 2
//
// Rules:
//   - a dynamic cp, tp, pp, microbatch or virtual chunk count, ZeRO stage, sequence parallelism,
//     context form or schedule takes the value given; not given is an error (but for the context
//     form at cp = 1, where there is nothing to choose: ring);
//   - a dynamic dp takes the value given, or else what is left of the world: world / (cp·tp·pp);
//   - a dynamic ep takes the value given, or else 1; it must divide dp·cp (the expert group is
//     formed inside the gradient group, policy/axes.hpp);
//   - a static value may be given again at launch, but only the same number;
//   - the degrees (policy/mesh_axes.hpp) must multiply to the world size;
//   - interleaved 1F1B needs microbatches divisible by pp (checked here when either was dynamic).
#pragma once
#include <string>
#include <string_view>

#include "strata/core/error.hpp"
#include "strata/core/extents.hpp"
#include "strata/policy/mesh_axes.hpp"
#include "strata/policy/parallel.hpp"
#include "strata/policy/schedule.hpp"

namespace strata {

namespace detail {
// The degree field of axis `a` in a struct with one per axis (layout_config, layout_overrides).
template <class Degrees>
constexpr auto& degree_field(Degrees& d, mesh_axis a) {
  switch (a) {
    case mesh_axis::tp: return d.tp;
    case mesh_axis::cp: return d.cp;
    case mesh_axis::dp: return d.dp;
    case mesh_axis::pp: return d.pp;
  }
  return d.dp;
}
}  // namespace detail

// A layout with every value known (once resolved; declared_layout leaves open ones dynamic and
// the schedule "dynamic").
struct layout_config {
  int dp = 1, cp = 1, tp = 1, pp = 1;  // one degree per axis of policy/mesh_axes.hpp
  int ep = 1;                          // experts sharded over ep ranks of dp x cp (no axis of its own)
  int zero_stage = 0;
  int sequence_parallel = 0;          // 1 on, 0 off (strata::dynamic while open)
  std::string context_form = "ring";  // context_form_name of the tag: ring or all_to_all
  int microbatches = 1;
  int virtual_chunks = 1;
  std::string schedule = "one_f_one_b";  // schedule_name of the tag

  int& degree(mesh_axis a) { return detail::degree_field(*this, a); }
  int degree(mesh_axis a) const { return detail::degree_field(*this, a); }
  // Ranks of a group spanning `axes`.
  int ranks(mesh_axis_set axes) const {
    int n = 1;
    for (const auto& d : mesh_axes)
      if (axes.contains(d.axis)) n *= degree(d.axis);
    return n;
  }
  int ranks() const {
    int n = 1;
    for (const auto& d : mesh_axes) n *= degree(d.axis);
    return n;
  }
  // Ranks of the expert-data group: those holding the same experts (dp·cp / ep).
  int expert_data_ranks() const { return dp * cp / ep; }
  // "dp=2 x tp=2 x pp=1" for messages: the axes in the order people write them
  // (mesh_axis_description::written_at), leaving out those in `except` and, at degree 1, those
  // not written_at_one; the expert degree (not a factor) after the product.
  std::string degrees_text(mesh_axis_set except = {}) const {
    std::string s;
    for (int place = 0; place < int(mesh_axis_count); ++place)
      for (const auto& d : mesh_axes) {
        if (d.written_at != place || except.contains(d.axis) || (!d.written_at_one && degree(d.axis) == 1)) continue;
        if (!s.empty()) s += " x ";
        s += std::string(d.name) + "=" + std::to_string(degree(d.axis));
      }
    if (ep != 1) s += " (ep=" + std::to_string(ep) + ")";
    return s;
  }
  bool operator==(const layout_config&) const = default;
};

// The values a launch may supply (from flags or the environment); strata::dynamic (or an empty
// schedule) = not given.
struct layout_overrides {
  int dp = dynamic;  // one degree per axis of policy/mesh_axes.hpp
  int cp = dynamic;
  int tp = dynamic;
  int pp = dynamic;
  int ep = dynamic;
  int microbatches = dynamic;
  int zero_stage = dynamic;
  int sequence_parallel = dynamic;  // 0 or 1
  int virtual_chunks = dynamic;
  std::string context_form{};  // ring or all_to_all
  std::string schedule{};      // gpipe, one_f_one_b (or 1f1b), interleaved_1f1b (or interleaved)

  int degree(mesh_axis a) const { return detail::degree_field(*this, a); }
};

// The layout type's numbers as written, dynamic where the type leaves them open.
template <parallel_layout Layout>
[[nodiscard]] layout_config declared_layout() {
  layout_config c;
  c.dp = Layout::dp;
  c.cp = Layout::cp;
  c.tp = Layout::tp;
  c.pp = Layout::pp;
  c.ep = Layout::ep;
  c.zero_stage = Layout::zero_stage;
  c.sequence_parallel = Layout::sequence_parallel;
  c.context_form = context_form_name<typename Layout::context_form>;
  c.microbatches = Layout::microbatches;
  c.virtual_chunks = Layout::virtual_chunks;
  c.schedule = std::string(schedule_name<typename Layout::schedule>);
  return c;
}

namespace detail {

// One number: the declared value if static (a launch value must agree), else the launch value.
inline int resolve_one(std::string_view name, int declared, int given, int least = 1) {
  if (!is_dynamic(given)) {
    STRATA_CHECK(given >= least, "layout ", name, "=", given, " given at launch must be >= ", least);
  }
  if (!is_dynamic(declared)) {
    STRATA_CHECK(is_dynamic(given) || given == declared, "the layout fixes ", name, "=", declared, " but ", name, "=",
                 given, " was given at launch");
    return declared;
  }
  return given;  // may still be dynamic; the caller decides what that means
}

// A schedule's tag name from what a launch may say.
inline std::string canonical_schedule(const std::string& s) {
  if (s == "gpipe") return "gpipe";
  if (s == "1f1b" || s == "one_f_one_b") return "one_f_one_b";
  if (s == "interleaved" || s == "interleaved_1f1b") return "interleaved_1f1b";
  fail("layout schedule '", s, "' given at launch is not a schedule (gpipe, 1f1b or interleaved)");
}

// A context form's tag name from what a launch may say.
inline std::string canonical_context_form(const std::string& s) {
  if (s == "ring") return "ring";
  if (s == "all_to_all" || s == "all-to-all" || s == "ulysses") return "all_to_all";
  fail("layout context form '", s, "' given at launch is not a form (ring or all_to_all)");
}

}  // namespace detail

// Fills in a declared layout (dynamic where open) from the world size and the launch values.
// The non-template core, usable by tools that read a layout from text.
[[nodiscard]] inline layout_config resolve_layout(const layout_config& declared, int world_size,
                                                  const layout_overrides& given = {}) {
  STRATA_CHECK(world_size >= 1, "the world size must be >= 1, got ", world_size);
  layout_config c = declared;
  for (const auto& a : mesh_axes) {
    int& degree = c.degree(a.axis);
    degree = detail::resolve_one(a.name, declared.degree(a.axis), given.degree(a.axis));
    STRATA_CHECK(a.fills_world || !is_dynamic(degree), "the layout leaves ", a.name, " as strata::dynamic but no ",
                 a.name, " was given at launch");
  }
  c.ep = detail::resolve_one("ep", declared.ep, given.ep);
  if (is_dynamic(c.ep)) c.ep = 1;
  c.microbatches = detail::resolve_one("microbatches", declared.microbatches, given.microbatches);
  c.virtual_chunks = detail::resolve_one("virtual", declared.virtual_chunks, given.virtual_chunks);
  c.zero_stage = detail::resolve_one("zero", declared.zero_stage, given.zero_stage, 0);
  c.sequence_parallel = detail::resolve_one("sp", declared.sequence_parallel, given.sequence_parallel, 0);
  STRATA_CHECK(!is_dynamic(c.microbatches),
               "the layout leaves microbatches as strata::dynamic but no count was given at launch");
  STRATA_CHECK(!is_dynamic(c.virtual_chunks),
               "the layout leaves the virtual chunks as strata::dynamic but no count was given at launch");
  STRATA_CHECK(!is_dynamic(c.zero_stage),
               "the layout leaves the ZeRO stage as strata::dynamic but no stage was given at launch");
  STRATA_CHECK(c.zero_stage <= 3, "layout zero=", c.zero_stage, " given at launch is not a ZeRO stage (0, 1, 2 or 3)");
  STRATA_CHECK(!is_dynamic(c.sequence_parallel),
               "the layout leaves sequence parallelism as "
               "strata::dynamic_sequence_parallel but the launch did not say whether to use it");
  STRATA_CHECK(c.sequence_parallel <= 1, "layout sp=", c.sequence_parallel, " given at launch must be 0 or 1");
  if (!given.schedule.empty()) {
    const std::string named = detail::canonical_schedule(given.schedule);
    STRATA_CHECK(declared.schedule == "dynamic" || declared.schedule == named, "the layout fixes the schedule ",
                 declared.schedule, " but ", given.schedule, " was given at launch");
    c.schedule = named;
  }
  if (!given.context_form.empty()) {
    const std::string named = detail::canonical_context_form(given.context_form);
    STRATA_CHECK(declared.context_form == "dynamic" || declared.context_form == named,
                 "the layout fixes the context form ", declared.context_form, " but ", given.context_form,
                 " was given at launch");
    c.context_form = named;
  }
  // Without a context split the form means nothing: an open one need not be given.
  if (c.context_form == "dynamic" && c.cp == 1) c.context_form = "ring";
  STRATA_CHECK(c.context_form != "dynamic",
               "the layout leaves the context form as strata::dynamic_context_form but "
               "no form was given at launch (cp=",
               c.cp, ")");
  STRATA_CHECK(c.schedule != "dynamic",
               "the layout leaves the schedule as strata::dynamic_schedule but no schedule was given at launch");
  STRATA_CHECK(c.virtual_chunks == 1 || c.schedule == schedule_name<interleaved_1f1b>,
               "layout virtual=", c.virtual_chunks, " chunks per stage need the interleaved_1f1b schedule, not ",
               c.schedule);

  for (const auto& a : mesh_axes) {
    if (!a.fills_world || !is_dynamic(c.degree(a.axis))) continue;
    // This axis (data parallelism) takes whatever the other axes' groups leave.
    int others = 1;
    for (const auto& b : mesh_axes)
      if (b.axis != a.axis) others *= c.degree(b.axis);
    layout_config text = c;
    text.ep = 1;
    STRATA_CHECK(world_size % others == 0, "layout ", text.degrees_text({a.axis}), " = ", others,
                 " ranks does not divide the world size ", world_size, " (", a.name, " is strata::dynamic)");
    c.degree(a.axis) = world_size / others;
  }
  STRATA_CHECK(c.ranks() == world_size, "layout ", c.degrees_text(), " = ", c.ranks(),
               " ranks does not match the world size ", world_size);
  STRATA_CHECK((c.dp * c.cp) % c.ep == 0, "layout ep=", c.ep, " does not divide dp x cp = ", c.dp * c.cp,
               " (the expert group is formed inside the data- and context-parallel ranks)");

  if (c.schedule == schedule_name<interleaved_1f1b>) {
    STRATA_CHECK(c.microbatches % c.pp == 0, "interleaved 1F1B needs microbatches (", c.microbatches,
                 ") divisible by the pipeline degree (", c.pp, ")");
  }
  return c;
}

// Resolves a layout type; see the rules at the top of this file.
template <parallel_layout Layout>
[[nodiscard]] layout_config resolve_layout(int world_size, const layout_overrides& given = {}) {
  return resolve_layout(declared_layout<Layout>(), world_size, given);
}

}  // namespace strata
