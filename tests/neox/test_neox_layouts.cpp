// The GPT-NeoX-shaped model of strata/models/neox.hpp under the layouts each variant must
// survive, against its serial run, under mpiexec (fp32, 5 steps, per-step losses and the gathered
// weights within 1e-5):
//   2 ranks: tp2 + SP (the per-head QKV split by heads, the parallel residual's two tensor-parallel
//            regions fed by one sequence-parallel input), tp2, pp2 under 1F1B, dp2 with ZeRO-3,
//            dp2 with full recomputation;
//   8 ranks: dp2 x tp2+SP x pp2 with ZeRO-1, and cp2 (ring and all-to-all) x tp2 x dp2.
#include <doctest/doctest.h>

#include <string>

#include <strata/strata.hpp>

#include "../mpi/layout_equivalence.hpp"
#include "strata/models/neox.hpp"

namespace st = strata;

namespace {

using serial_policy = st::policy<st::host, st::serial, st::fp32>;
using strata_test::launch_policy;

// 4 heads of 8 (2 of them turned by the rotary embedding), 4 blocks (pp 2 x 2).
const strata::models::neox::dims shape{.vocab = 61, .seq = 8, .layers = 4, .heads = 4, .d_model = 32, .ffn = 64};
const strata_test::equivalence_setup setup{.lr = 5e-4, .steps = 5, .global_batch = 8};

struct sized_case {
  int world;
  strata_test::layout_case layout;
  st::recompute_mode recompute = st::recompute_mode::none;
};
const sized_case cases[] = {
    {2, {"tp2 + SP", 1, 2, 1, 0, 1, 1, 1, "1f1b"}},
    {2, {"tp2", 1, 2, 1, 0, 0, 1, 1, "1f1b"}},
    {2, {"pp2, 1F1B", 1, 1, 2, 0, 0, 4, 1, "1f1b"}},
    {2, {"dp2, ZeRO-3", 2, 1, 1, 3, 0, 1, 1, "1f1b"}},
    {2, {"dp2, full recomputation", 2, 1, 1, 1, 0, 1, 1, "1f1b"}, st::recompute_mode::full},
    {8, {"dp2 x tp2+SP x pp2, ZeRO-1, 1F1B", 2, 2, 2, 1, 1, 2, 1, "1f1b"}},
    {8, {"dp2 x cp2 ring x tp2", 2, 2, 1, 0, 0, 1, 1, "1f1b", 2, "ring"}},
    {8, {"dp2 x cp2 all-to-all x tp2", 2, 2, 1, 0, 0, 1, 1, "1f1b", 2, "all_to_all"}},
};

}  // namespace

TEST_CASE("the GPT-NeoX model trains under every layout as it does serially") {
  const int world = strata_test::world().size();
  const auto ref = strata_test::serial_run<strata::models::neox::model<serial_policy>>(shape, setup);
  int ran = 0;
  for (const auto& [size, c, recompute] : cases) {
    if (size != world) continue;
    ++ran;
    CAPTURE(std::string(c.name));
    auto o = strata_test::launch(c, setup);
    o.recompute = recompute;
    st::training<strata::models::neox::model<launch_policy<st::fp32>>> run(strata_test::world().comm(), shape,
                                                                           std::move(o));
    const auto got = strata_test::train_steps(run, shape, setup);
    strata_test::check_run_matches(c.name, got, ref);
  }
  CHECK(ran > 0);
}
