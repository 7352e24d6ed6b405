// Tests for strata/policy: device and schedule tags, the axis parser, and resolve_layout.
// Static properties are checked with static_assert (a failure stops the build); the runtime
// resolution and its error messages are checked with doctest.
#include <doctest/doctest.h>

#include <string>
#include <type_traits>

#include "strata/core/error.hpp"
#include "strata/policy/axes.hpp"
#include "strata/policy/device.hpp"
#include "strata/policy/layout.hpp"
#include "strata/policy/mesh_axes.hpp"
#include "strata/policy/parallel.hpp"
#include "strata/policy/schedule.hpp"

namespace st = strata;

namespace {

// ---- devices ----
static_assert(st::is_device_v<st::host> && st::is_device_v<st::cuda>);
static_assert(!st::is_device_v<st::device_tag> && !st::is_device_v<int> && !st::is_device_v<st::gpipe>);
struct my_gpu : st::cuda {};
static_assert(st::is_device_v<my_gpu>);
static_assert(st::device_name<st::host> == "host" && st::device_name<st::cuda> == "cuda");
static_assert(st::device_name<my_gpu> == "cuda");
static_assert(std::is_empty_v<st::host> && std::is_empty_v<st::cuda>);

// ---- schedules ----
static_assert(st::is_schedule_v<st::gpipe> && st::is_schedule_v<st::one_f_one_b> &&
              st::is_schedule_v<st::interleaved_1f1b>);
static_assert(!st::is_schedule_v<st::schedule_tag> && !st::is_schedule_v<st::host>);
static_assert(st::is_interleaved_v<st::interleaved_1f1b> && !st::is_interleaved_v<st::one_f_one_b>);
static_assert(st::schedule_name<st::gpipe> == "gpipe" && st::schedule_name<st::one_f_one_b> == "one_f_one_b" &&
              st::schedule_name<st::interleaved_1f1b> == "interleaved_1f1b");

// ---- axes ----
static_assert(st::zero<0>::stage == 0 && st::zero<3>::stage == 3);
static_assert(st::data<>::degree == st::dynamic && st::data<>::zero_stage == 0);
static_assert(st::data<4, st::zero<2>>::degree == 4 && st::data<4, st::zero<2>>::zero_stage == 2);
static_assert(st::tensor<>::degree == 1 && !st::tensor<>::sequence_parallel);
static_assert(st::tensor<4, st::sequence_parallel>::sequence_parallel);
static_assert(st::tensor<st::dynamic>::degree == st::dynamic);
using default_pipeline = st::pipeline<>;
static_assert(default_pipeline::degree == 1 && default_pipeline::microbatches == 1 &&
              default_pipeline::virtual_chunks == 1 && std::is_same_v<default_pipeline::schedule, st::one_f_one_b>);
static_assert(st::pipeline<4, st::interleaved_1f1b, 8, 2>::virtual_chunks == 2);
static_assert(st::pipeline<st::dynamic, st::interleaved_1f1b, 6, 2>::degree == st::dynamic);  // checked at start-up
static_assert(st::pipeline<4, st::interleaved_1f1b, st::dynamic, 2>::microbatches == st::dynamic);
static_assert(st::is_data_axis_v<st::data<2>> && !st::is_data_axis_v<st::tensor<2>>);
static_assert(st::is_tensor_axis_v<st::tensor<2, st::sequence_parallel>> && !st::is_tensor_axis_v<int>);
static_assert(st::is_pipeline_axis_v<st::pipeline<2, st::gpipe, 4>> && !st::is_pipeline_axis_v<st::data<>>);

// ---- the parser: any order, defaults ----
using D = st::data<st::dynamic, st::zero<1>>;
using T = st::tensor<2, st::sequence_parallel>;
using P = st::pipeline<2, st::interleaved_1f1b, 8, 2>;
using dtp = st::parallel<D, T, P>;
using pdt = st::parallel<P, D, T>;
using tpd = st::parallel<T, P, D>;

template <class A, class B>
constexpr bool same_traits() {
  return A::dp == B::dp && A::tp == B::tp && A::pp == B::pp && A::zero_stage == B::zero_stage &&
         A::sequence_parallel == B::sequence_parallel && std::is_same_v<typename A::schedule, typename B::schedule> &&
         A::microbatches == B::microbatches && A::virtual_chunks == B::virtual_chunks && A::is_static == B::is_static &&
         std::is_same_v<typename A::canonical, typename B::canonical>;
}
static_assert(same_traits<dtp, pdt>() && same_traits<dtp, tpd>());
static_assert(std::is_same_v<dtp::canonical, st::parallel<D, st::context<1>, T, P, st::expert<1>>> &&
              std::is_same_v<pdt::canonical, dtp::canonical>);
static_assert(dtp::dp == st::dynamic && dtp::tp == 2 && dtp::pp == 2 && dtp::zero_stage == 1);
static_assert(dtp::sequence_parallel && std::is_same_v<dtp::schedule, st::interleaved_1f1b>);
static_assert(dtp::microbatches == 8 && dtp::virtual_chunks == 2 && !dtp::is_static);
static_assert(std::is_same_v<pdt::data_axis, D> && std::is_same_v<pdt::tensor_axis, T> &&
              std::is_same_v<pdt::pipeline_axis, P>);

// Missing axes take their defaults.
using empty = st::parallel<>;
static_assert(std::is_same_v<empty::data_axis, st::data<st::dynamic, st::zero<0>>>);
static_assert(std::is_same_v<empty::tensor_axis, st::tensor<1>> &&
              std::is_same_v<empty::pipeline_axis, st::pipeline<1>>);
static_assert(empty::dp == st::dynamic && empty::tp == 1 && empty::pp == 1 && empty::zero_stage == 0);
static_assert(!empty::sequence_parallel && std::is_same_v<empty::schedule, st::one_f_one_b> && !empty::is_static);
using tp_only = st::parallel<st::tensor<8>>;
static_assert(tp_only::dp == st::dynamic && tp_only::tp == 8 && tp_only::pp == 1);
static_assert(
    same_traits<st::parallel<st::pipeline<4>, st::tensor<2>>, st::parallel<st::tensor<2>, st::pipeline<4>>>());

// serial and the concept.
static_assert(st::serial::dp == 1 && st::serial::tp == 1 && st::serial::pp == 1 && st::serial::is_static);
static_assert(st::parallel_layout<st::serial> && st::parallel_layout<dtp>);
static_assert(!st::parallel_layout<D> && !st::parallel_layout<int>);
static_assert(st::parallel<st::data<4>, st::tensor<2>, st::pipeline<2>>::is_static);

// Throws with a message containing every piece of `wanted`.
template <class F>
void check_throws_containing(F&& f, std::initializer_list<const char*> wanted) {
  std::string message;
  try {
    f();
  } catch (const st::error& e) { message = e.what(); }
  REQUIRE_MESSAGE(!message.empty(), "expected a strata::error");
  for (const char* piece : wanted) CHECK_MESSAGE(message.find(piece) != std::string::npos, message, " lacks ", piece);
}

}  // namespace

TEST_CASE("declared_layout reports the type's numbers, dynamic where open") {
  const st::layout_config c = st::declared_layout<dtp>();
  CHECK(c.dp == st::dynamic);
  CHECK(c.tp == 2);
  CHECK(c.pp == 2);
  CHECK(c.zero_stage == 1);
  CHECK(c.sequence_parallel);
  CHECK(c.microbatches == 8);
  CHECK(c.virtual_chunks == 2);
  CHECK(c.schedule == "interleaved_1f1b");
}

TEST_CASE("resolve_layout: a dynamic data degree takes what the other axes leave") {
  const st::layout_config c = st::resolve_layout<dtp>(16);
  CHECK(c.dp == 4);
  CHECK(c.tp == 2);
  CHECK(c.pp == 2);
  CHECK(c.ranks() == 16);
  CHECK(c.zero_stage == 1);
  CHECK(c.sequence_parallel);
  CHECK(c.schedule == "interleaved_1f1b");
  // The axis order does not matter.
  CHECK(st::resolve_layout<pdt>(16) == c);
  CHECK(st::resolve_layout<tpd>(16) == c);
}

TEST_CASE("resolve_layout: serial and fully static layouts") {
  const st::layout_config s = st::resolve_layout<st::serial>(1);
  CHECK(s == st::layout_config{});
  using L = st::parallel<st::pipeline<2, st::gpipe, 4>, st::data<2, st::zero<3>>, st::tensor<2>>;
  const st::layout_config c = st::resolve_layout<L>(8);
  CHECK(c.dp == 2);
  CHECK(c.tp == 2);
  CHECK(c.pp == 2);
  CHECK(c.zero_stage == 3);
  CHECK(c.microbatches == 4);
  CHECK(c.schedule == "gpipe");
  // Repeating a static value at launch is allowed when it agrees.
  CHECK(st::resolve_layout<L>(8, {.dp = 2, .tp = 2, .pp = 2, .microbatches = 4}) == c);
}

TEST_CASE("resolve_layout: dynamic degrees and microbatches come from the launch") {
  using L = st::parallel<st::tensor<st::dynamic>, st::pipeline<st::dynamic, st::one_f_one_b, st::dynamic>>;
  const st::layout_config c = st::resolve_layout<L>(24, {.tp = 4, .pp = 3, .microbatches = 12});
  CHECK(c.dp == 2);
  CHECK(c.tp == 4);
  CHECK(c.pp == 3);
  CHECK(c.microbatches == 12);
  // A dynamic dp may be given too; then the product must match the world.
  const st::layout_config g = st::resolve_layout<L>(24, {.dp = 2, .tp = 4, .pp = 3, .microbatches = 12});
  CHECK(g == c);
}

TEST_CASE("resolve_layout: the product of the degrees must equal the world size") {
  using L = st::parallel<st::tensor<2>>;
  check_throws_containing([] { (void)st::resolve_layout<L>(3, {.dp = 2}); },
                          {"layout dp=2 x tp=2 x pp=1 = 4 ranks does not match the world size 3"});
  using S = st::parallel<st::data<2>, st::tensor<2>>;
  check_throws_containing([] { (void)st::resolve_layout<S>(8); },
                          {"layout dp=2 x tp=2 x pp=1 = 4 ranks does not match the world size 8"});
  CHECK_THROWS_AS((void)st::resolve_layout<S>(8), st::error);
}

TEST_CASE("resolve_layout: a dynamic data degree needs the world divisible by tp x pp") {
  using L = st::parallel<st::tensor<4>, st::pipeline<2>>;
  check_throws_containing([] { (void)st::resolve_layout<L>(12); },
                          {"layout tp=4 x pp=2 = 8 ranks does not divide the world size 12"});
  check_throws_containing([] { (void)st::resolve_layout<L>(4); }, {"= 8 ranks", "world size 4"});
}

TEST_CASE("resolve_layout: a static value given differently at launch is an error") {
  using L = st::parallel<st::data<st::dynamic>, st::tensor<2>, st::pipeline<4, st::gpipe, 8>>;
  check_throws_containing([] { (void)st::resolve_layout<L>(16, {.tp = 4}); },
                          {"the layout fixes tp=2 but tp=4 was given at launch"});
  check_throws_containing([] { (void)st::resolve_layout<L>(16, {.pp = 2}); },
                          {"the layout fixes pp=4 but pp=2 was given at launch"});
  check_throws_containing([] { (void)st::resolve_layout<L>(16, {.microbatches = 16}); },
                          {"the layout fixes microbatches=8 but microbatches=16 was given at launch"});
  using S = st::parallel<st::data<2>>;
  check_throws_containing([] { (void)st::resolve_layout<S>(2, {.dp = 1}); },
                          {"the layout fixes dp=2 but dp=1 was given at launch"});
}

TEST_CASE("resolve_layout: a dynamic value not given at launch is an error") {
  using T = st::parallel<st::tensor<st::dynamic>>;
  check_throws_containing([] { (void)st::resolve_layout<T>(4); }, {"tp as strata::dynamic", "no tp was given"});
  using P = st::parallel<st::pipeline<st::dynamic>>;
  check_throws_containing([] { (void)st::resolve_layout<P>(4); }, {"pp as strata::dynamic", "no pp was given"});
  using M = st::parallel<st::pipeline<2, st::gpipe, st::dynamic>>;
  check_throws_containing([] { (void)st::resolve_layout<M>(4); }, {"microbatches as strata::dynamic"});
}

TEST_CASE("resolve_layout: bad launch values and world sizes") {
  using T = st::parallel<st::tensor<st::dynamic>>;
  check_throws_containing([] { (void)st::resolve_layout<T>(4, {.tp = 0}); },
                          {"layout tp=0 given at launch must be >= 1"});
  check_throws_containing([] { (void)st::resolve_layout<st::serial>(0); }, {"the world size must be >= 1, got 0"});
}

TEST_CASE("resolve_layout: interleaved 1F1B checks divisibility once the numbers are known") {
  using L = st::parallel<st::pipeline<st::dynamic, st::interleaved_1f1b, 6, 2>>;
  check_throws_containing([] { (void)st::resolve_layout<L>(4, {.pp = 4}); },
                          {"interleaved 1F1B needs microbatches (6) divisible by the pipeline degree (4)"});
  const st::layout_config ok = st::resolve_layout<L>(6, {.pp = 3});
  CHECK(ok.dp == 2);
  CHECK(ok.virtual_chunks == 2);
  using M = st::parallel<st::pipeline<4, st::interleaved_1f1b, st::dynamic, 2>>;
  check_throws_containing([] { (void)st::resolve_layout<M>(4, {.microbatches = 6}); },
                          {"microbatches (6)", "pipeline degree (4)"});
  CHECK(st::resolve_layout<M>(4, {.microbatches = 8}).microbatches == 8);
}

TEST_CASE("resolve_layout: the non-template core takes a declared config") {
  st::layout_config declared;
  declared.dp = st::dynamic;
  declared.tp = 2;
  const st::layout_config c = st::resolve_layout(declared, 6);
  CHECK(c.dp == 3);
  CHECK(c.tp == 2);
  CHECK(c.pp == 1);
}

// ---- the context axis ----
using C2 = st::context<2>;
using dct = st::parallel<st::data<2, st::zero<1>>, C2, st::tensor<2>>;
using tcd = st::parallel<st::tensor<2>, st::data<2, st::zero<1>>, C2>;
static_assert(dct::cp == 2 && std::is_same_v<dct::context_form, st::ring> && dct::is_static && dct::is_fully_static);
static_assert(std::is_same_v<dct::canonical, tcd::canonical>);
static_assert(st::parallel<>::cp == 1 && st::serial::cp == 1);
static_assert(std::is_same_v<st::parallel<st::context<4, st::all_to_all>>::context_form, st::all_to_all>);
static_assert(!st::parallel<st::context<st::dynamic>>::is_static);
static_assert(!st::parallel<st::data<1>, st::context<2, st::dynamic_context_form>>::is_fully_static);

TEST_CASE("mesh_axes: one description per axis, in rank order, tp fastest") {
  CHECK(st::mesh_axes.size() == 4);
  CHECK(st::mesh_axes[0].name == "tp");
  CHECK(st::mesh_axes[1].name == "cp");
  CHECK(st::mesh_axes[2].name == "dp");
  CHECK(st::mesh_axes[3].name == "pp");
  const auto replicating = st::mesh_axis_set::replicating();
  CHECK(replicating == st::mesh_axis_set{st::mesh_axis::dp, st::mesh_axis::cp});
  st::layout_config c;
  c.dp = 3;
  c.cp = 2;
  c.tp = 4;
  c.pp = 5;
  CHECK(c.ranks() == 120);
  CHECK(c.ranks(replicating) == 6);
  CHECK(c.degree(st::mesh_axis::cp) == 2);
  CHECK(c.degrees_text() == "dp=3 x cp=2 x tp=4 x pp=5");
  c.cp = 1;
  CHECK(c.degrees_text() == "dp=3 x tp=4 x pp=5");
}

TEST_CASE("resolve_layout: the context axis") {
  const st::layout_config c = st::resolve_layout<dct>(8);
  CHECK(c.cp == 2);
  CHECK(c.dp == 2);
  CHECK(c.context_form == "ring");
  CHECK(c.ranks() == 8);
  // A dynamic data degree takes what cp x tp x pp leave.
  using L = st::parallel<st::context<st::dynamic>, st::tensor<2>>;
  const st::layout_config d = st::resolve_layout<L>(16, {.cp = 4});
  CHECK(d.dp == 2);
  CHECK(d.cp == 4);
  check_throws_containing([] { (void)st::resolve_layout<L>(16); }, {"cp as strata::dynamic", "no cp was given"});
  check_throws_containing([] { (void)st::resolve_layout<L>(12, {.cp = 4}); },
                          {"cp=4 x tp=2 x pp=1 = 8 ranks does not divide the world size 12"});
  check_throws_containing([] { (void)st::resolve_layout<dct>(8, {.cp = 4}); },
                          {"the layout fixes cp=2 but cp=4 was given at launch"});
  check_throws_containing([] { (void)st::resolve_layout<dct>(6); },
                          {"layout dp=2 x cp=2 x tp=2 x pp=1 = 8 ranks does not match the world size 6"});
  // The form: fixed by the type, or given at launch.
  using F = st::parallel<st::context<2, st::dynamic_context_form>>;
  CHECK(st::resolve_layout<F>(4, {.context_form = "all_to_all"}).context_form == "all_to_all");
  CHECK(st::resolve_layout<F>(4, {.context_form = "ring"}).context_form == "ring");
  check_throws_containing([] { (void)st::resolve_layout<F>(4); }, {"context form as strata::dynamic_context_form"});
  using G = st::parallel<st::context<st::dynamic, st::dynamic_context_form>>;
  CHECK(st::resolve_layout<G>(4, {.cp = 1}).context_form == "ring");  // nothing to choose at cp = 1
  check_throws_containing([] { (void)st::resolve_layout<G>(4, {.cp = 2}); }, {"no form was given at launch (cp=2)"});
  check_throws_containing([] { (void)st::resolve_layout<F>(4, {.context_form = "star"}); },
                          {"context form 'star'", "ring or all_to_all"});
  check_throws_containing([] { (void)st::resolve_layout<dct>(8, {.context_form = "all_to_all"}); },
                          {"fixes the context form ring but all_to_all was given"});
}

TEST_CASE("resolve_layout: the expert degree, inside dp x cp") {
  using E = st::parallel<st::data<st::dynamic>, st::expert<st::dynamic>>;
  static_assert(E::ep == st::dynamic && st::parallel<>::ep == 1 && st::parallel<st::expert<4>>::ep == 4);
  CHECK(st::resolve_layout<E>(8).ep == 1);  // not given: 1
  const st::layout_config c = st::resolve_layout<E>(8, {.ep = 4});
  CHECK(c.ep == 4);
  CHECK(c.dp == 8);
  CHECK(c.ranks() == 8);  // not a factor of the world size
  CHECK(c.expert_data_ranks() == 2);
  CHECK(c.degrees_text() == "dp=8 x tp=1 x pp=1 (ep=4)");
  // With context parallelism the group is dp x cp.
  using EC = st::parallel<st::context<2>, st::expert<st::dynamic>>;
  CHECK(st::resolve_layout<EC>(4, {.ep = 4}).expert_data_ranks() == 1);
  check_throws_containing([] { (void)st::resolve_layout<E>(6, {.ep = 4}); },
                          {"layout ep=4 does not divide dp x cp = 6"});
  check_throws_containing([] { (void)st::resolve_layout<st::parallel<st::expert<2>>>(4, {.ep = 4}); },
                          {"the layout fixes ep=2 but ep=4 was given at launch"});
  check_throws_containing([] { (void)st::resolve_layout<E>(4, {.ep = 0}); },
                          {"layout ep=0 given at launch must be >= 1"});
}
