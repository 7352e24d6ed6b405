// The example GPT-2 (learned positions) and Llama (rotary positions, 8 query heads sharing 2
// key/value heads) under context parallelism, under mpiexec on 8 ranks, against their serial runs
// (fp32, 5 steps: per-step losses and the gathered weights within 1e-5):
//   cp 2 and cp 4 with the ring, cp 2 (both) and cp 4 (GPT-2) with all-to-all, cp 2 x tp 2 + SP,
//   cp 2 x dp 2 x tp 2 with ZeRO-1 and ZeRO-3, cp 2 x dp 2 x pp 2, cp 2 x tp 2 + SP x pp 2, and
//   selective (cp 2, both forms) and full recomputation (with pp 2, each form);
// what each rank's context group carried equals the plan's figure from the layer costs, and
// attention's activations at cp 4 are a quarter of cp 1's in either form; the
// all-to-all form where the key/value heads do not divide, and generation under cp, are refused
// at once with words that say why; in the emulated device space (every buffer through the space,
// fresh ones NaN) both forms give the host run's losses bit for bit. (tests/custom runs the same
// layouts for a model declared outside the repository, with checkpoints across them and the plan
// against the allocator.)
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <strata/core/emulated_memory.hpp>
#include <strata/strata.hpp>

#include "../mpi/layout_equivalence.hpp"
#include "strata/models/gpt2.hpp"
#include "strata/models/llama.hpp"

namespace st = strata;

namespace {

using serial_policy = st::policy<st::host, st::serial, st::fp32>;
using strata_test::launch_policy;

// AdamW's eps 1e-6 rather than 1e-8, for the reason tests/custom/test_custom_model.cpp gives: an
// element whose gradient is within reduction-order noise of zero (what differs between layouts)
// takes a whole step of either sign at eps 1e-8 (GPT-2's weights then differ by 1.4e-5 of max|w|
// after 5 steps, while the losses agree to 2e-8).
const strata_test::equivalence_setup setup{.lr = 5e-4, .adam_eps = 1e-6, .steps = 5, .global_batch = 8};

// seq 8: cp 4 cuts each sequence into 8 chunks of one token.
const strata::models::gpt2::dims gpt2_shape{.vocab = 61, .seq = 8, .layers = 4, .heads = 4, .d_model = 32};
const strata::models::llama::dims llama_shape{
    .vocab = 61, .seq = 8, .layers = 4, .heads = 8, .d_model = 64, .kv_heads = 2, .ffn = 96};

bool eight_ranks() { return strata_test::world().size() == 8; }
bool lead() { return strata_test::world().rank() == 0; }

}  // namespace

TEST_CASE("GPT-2 under context parallelism, with every other axis, trains as it does serially") {
  if (!eight_ranks()) return;
  using M = strata::models::gpt2::model<launch_policy<st::fp32>>;
  const auto ref = strata_test::serial_run<strata::models::gpt2::model<serial_policy>>(gpt2_shape, setup);
  for (const auto& c : strata_test::context_layouts)
    strata_test::check_matches_serial<M>("GPT-2", gpt2_shape, ref, c, setup);
  for (const auto& c : strata_test::context_layouts_four_kv_heads)
    strata_test::check_matches_serial<M>("GPT-2", gpt2_shape, ref, c, setup);
}

TEST_CASE("Llama under context parallelism, with every other axis, trains as it does serially") {
  if (!eight_ranks()) return;
  using M = strata::models::llama::model<launch_policy<st::fp32>>;
  const auto ref = strata_test::serial_run<strata::models::llama::model<serial_policy>>(llama_shape, setup);
  for (const auto& c : strata_test::context_layouts)
    strata_test::check_matches_serial<M>("Llama", llama_shape, ref, c, setup);
}

TEST_CASE("attention's activations at cp 4: a quarter of cp 1's, ring and all-to-all") {
  // The costs the plan sums; tests/custom holds the plan to the allocator's bytes under cp 4 in
  // both forms.
  using P = serial_policy;
  const st::attention<P>::config c{.channels = 64, .heads = 8, .kv_heads = 2, .rope_theta = 10000};
  const st::cost_scope one{.batch = 2, .seq = 64};
  const auto whole = st::attention<P>::cost(c, one);
  CHECK(whole.context_bytes() == 0);
  const auto ring = st::attention<P>::cost(c, {.batch = 2, .seq = 64, .cp = 4, .form = st::context_form::ring});
  CHECK(ring.activation_bytes * 4 == whole.activation_bytes);
  CHECK(ring.forward_flops * 4 == whole.forward_flops);
  CHECK(ring.context_forward_bytes > 0);
  // All-to-all keeps its heads' gathered qkv [B, T, (H + 2·KV)/4·d] in place of this rank's own
  // [B, T/4, (H + 2·KV)·d], and gathers the output again in backward instead of keeping it twice:
  // the same bytes, and one more all-to-all of the output [B, T/4, H·d] in backward.
  const auto a2a = st::attention<P>::cost(c, {.batch = 2, .seq = 64, .cp = 4, .form = st::context_form::all_to_all});
  CHECK(a2a.activation_bytes * 4 == whole.activation_bytes);
  const std::uint64_t rows = 2 * 64 / 4, d = 8, out_block = rows * (8 / 4) * d * 4;  // fp32, one rank's heads
  CHECK(a2a.context_backward_bytes == a2a.context_forward_bytes + double(3 * out_block));
  if (lead())
    MESSAGE("attention activations per rank: cp 1 " << whole.activation_bytes << " B, cp 4 ring "
                                                    << ring.activation_bytes << " B, cp 4 all-to-all "
                                                    << a2a.activation_bytes << " B");
}

TEST_CASE("all-to-all over more context ranks than key/value heads, and generation under cp, are refused") {
  if (!eight_ranks()) return;
  using L = strata::models::llama::model<launch_policy<st::fp32>>;
  const strata_test::layout_case cp4{"dp2 x cp4 all-to-all", 2, 1, 1, 0, 0, 1, 1, "1f1b", 4, "all_to_all"};
  CHECK_THROWS_WITH_AS(st::training<L>(strata_test::world().comm(), llama_shape, strata_test::launch(cp4, setup)),
                       doctest::Contains("all-to-all context parallelism over cp=4 needs this rank's 8 query heads "
                                         "and 2 key/value heads"),
                       st::error);
  using G = strata::models::gpt2::model<launch_policy<st::fp32>>;
  st::training<G> run(strata_test::world().comm(), gpt2_shape,
                      strata_test::launch(strata_test::context_layouts[0], setup));
  const std::vector<std::int32_t> prompt{1, 2, 3};
  st::generator gen(run);
  CHECK_THROWS_WITH_AS((void)gen.generate(prompt, {.new_tokens = 4}),
                       doctest::Contains("under context parallelism (cp=2) is not supported"), st::error);
}

TEST_CASE("context attention in the emulated device space gives the host run's losses, bit for bit") {
  // The device path's steps (positions uploaded, copies and sums by for_each_index) on memory that
  // fills fresh buffers with NaN: a buffer read before it is written would turn the losses to NaN.
  if (!eight_ranks()) return;
  using M = strata::models::llama::model<launch_policy<st::fp32>>;
  for (const auto& c : {strata_test::context_layouts[0], strata_test::context_layouts[2]}) {
    CAPTURE(std::string(c.name));
    auto train = [&](const st::memory_space* memory) {
      auto o = strata_test::launch(c, setup);
      o.memory = memory;
      st::training<M> run(strata_test::world().comm(), llama_shape, o);
      return strata_test::train_steps(run, llama_shape, setup).losses;
    };
    const auto host = train(nullptr);
    auto& counts = st::emulated_memory_stats();
    const long before = counts.allocations;
    const auto emulated = train(&st::emulated_device_memory());
    CHECK(counts.allocations > before);
    CHECK(counts.live.empty());
    REQUIRE(host.size() == emulated.size());
    for (std::size_t i = 0; i < host.size(); ++i) {
      CHECK(std::isfinite(host[i]));
      CHECK(std::memcmp(&host[i], &emulated[i], sizeof(double)) == 0);
    }
  }
}
