// Blocks of library layers under every axis, against their serial runs (fp32, 5 steps; losses,
// gradient norms and gathered weights, tests/mpi/layout_equivalence.hpp):
//   - a model of Gemma 2's sandwich blocks, declared with st::chain and st::residual alone
//     (tests/compose/composed_blocks.hpp), under tp2 + SP, pp2, cp2 (ring and all-to-all) and dp2
//     with ZeRO-3, and with recomputation; its plan, from the derived costs, against the
//     allocator;
//   - Qwen3's attention written as a user writes one (tests/compose/qwen3_attention.hpp): per-head
//     norms whose gains are head shares, no reduction call in the layer, under tp2 and tp4 (with
//     and without SP) equal to serial within 1e-6 in losses and gradient norms; the same layer
//     with its gains registered as its own leaves the losses close and the gradient norms not.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "../mpi/layout_equivalence.hpp"
#include "composed_blocks.hpp"
#include "qwen3_attention.hpp"

namespace st = strata;

namespace {

using serial_policy = st::policy<st::host, st::serial, st::fp32>;
using strata_test::launch_policy;
using strata_test::layout_case;

const strata_test::equivalence_setup setup{.lr = 5e-4, .adam_eps = 1e-6, .steps = 5, .global_batch = 8};
bool lead() { return strata_test::world().rank() == 0; }

const layout_case two_rank_layouts[] = {
    {"tp2+sp", 1, 2, 1, 0, 1, 1, 1, "1f1b"},
    {"pp2, 1F1B", 1, 1, 2, 0, 0, 4, 1, "1f1b"},
    {"cp2 ring", 1, 1, 1, 0, 0, 1, 1, "1f1b", 2, "ring"},
    {"cp2 all-to-all", 1, 1, 1, 0, 0, 1, 1, "1f1b", 2, "all_to_all"},
    {"dp2, ZeRO-3", 2, 1, 1, 3, 0, 1, 1, "1f1b"},
    {"tp2+sp, selective recomputation", 1, 2, 1, 0, 1, 1, 1, "1f1b", 1, "ring", 1, st::recompute_mode::selective},
    {"pp2, full recomputation", 1, 1, 2, 0, 0, 4, 1, "1f1b", 1, "ring", 1, st::recompute_mode::full},
};

}  // namespace

TEST_CASE("a block declared from compositions alone trains under every axis as it does serially") {
  if (strata_test::world().size() != 2) return;
  const composed::dims shape{};
  const auto ref = strata_test::serial_run<composed::model<serial_policy>>(shape, setup);
  for (const auto& c : two_rank_layouts)
    strata_test::check_matches_serial<composed::model<launch_policy<st::fp32>>>("sandwich", shape, ref, c, setup);
}

TEST_CASE("its plan, from the costs the compositions derive, equals what the allocator holds") {
  if (strata_test::world().size() != 2) return;
  using M = composed::model<launch_policy<st::mixed<st::bf16, float>>>;
  const composed::dims shape{};
  for (const auto& c : two_rank_layouts) {
    CAPTURE(std::string(c.name));
    st::training<M> run(strata_test::world().comm(), shape, strata_test::launch(c, setup, std::int64_t(1) << 30));
    strata_test::check_plan_equals_allocator(run, shape, c, setup);
  }
}

namespace {
template <template <class> class Attention>
strata_test::losses_and_weights qwen3_run(const layout_case& c) {
  st::training<qwen3::model<launch_policy<st::fp32>, Attention>> run(strata_test::world().comm(), qwen3::dims{},
                                                                     strata_test::launch(c, setup));
  return strata_test::train_steps(run, qwen3::dims{}, setup);
}
}  // namespace

TEST_CASE("Qwen3's attention, written as a user would, trains under tp2 and tp4 as it does serially") {
  const int world = strata_test::world().size();
  if (world != 2 && world != 4) return;
  const auto ref = strata_test::serial_run<qwen3::model<serial_policy>>(qwen3::dims{}, setup);
  const std::string t = "tp" + std::to_string(world);
  for (const layout_case& c :
       {layout_case{"", 1, world, 1, 0, 0, 1, 1, "1f1b"}, layout_case{"+sp", 1, world, 1, 0, 1, 1, 1, "1f1b"}}) {
    const std::string name = t + c.name;
    CAPTURE(name);
    const auto got = qwen3_run<qwen3::attention>(c);
    const double lerr = strata_test::elementwise_relative_error(got.losses, ref.losses);
    const double gerr = strata_test::elementwise_relative_error(got.grad_norms, ref.grad_norms);
    const double werr = strata_test::relative_error(got.weights, ref.weights);
    if (lead())
      MESSAGE("qwen3 " << name << ": loss rel. error " << lerr << ", gradient norm rel. error " << gerr
                       << ", weight rel. error " << werr);
    CHECK(lerr <= 1e-6);
    CHECK(gerr <= 1e-6);
    CHECK(werr <= 1e-5);
  }
  // The gains said to be the rank's own: nothing sums them, each rank's update uses its heads'
  // share alone. The gradient norms show it.
  if (world == 2) {
    const auto wrong = qwen3_run<qwen3::attention_as_own>({"tp2", 1, 2, 1, 0, 0, 1, 1, "1f1b"});
    const double gerr = strata_test::elementwise_relative_error(wrong.grad_norms, ref.grad_norms);
    if (lead()) MESSAGE("qwen3 tp2 with the gains registered as own: gradient norm rel. error " << gerr);
    CHECK(gerr > 1e-5);
  }
}

TEST_CASE("a head share's gradient written by hand is refused, naming the parameter") {
  if (strata_test::world().size() != 2) return;
  // A norm-like layer that writes its gain's gradient itself, as layers did before the
  // registration said what to sum.
  struct by_hand {
    using P = launch_policy<st::fp32>;
    static void run() {
      st::memory_ledger ledger;
      auto tp = strata_test::world().comm().split(0, strata_test::world().rank(), "tp");
      st::model_context<P> ctx(ledger, st::seed{1}, st::tensor_parallel(st::group_ref(tp), false));
      st::module_scope<P> scope(ctx, "layer");
      const auto h = scope.add_parameter("gain", {4}, st::init_rule::ones(), false, st::tensor_gradient::head_share);
      ctx.params().materialize();
      ctx.params().grads(h)[0] += 1;
      CHECK_THROWS_WITH_AS(ctx.params().grad_written(h),
                           doctest::Contains("parameter 'layer.gain' is registered as a head_share of the tensor "
                                             "group, which is summed over the group now"),
                           st::error);
      // Through module_scope::gradients the shares are summed: 1 from each of the 2 ranks.
      auto g = scope.gradients(h);
      g[0][1] += 1;
      g.written();
      CHECK(ctx.params().grads(h)[1] == 2.0f);
    }
  };
  by_hand::run();
}
