// A model that is not GPT-2 (tests/custom/custom_model.hpp: RMSNorm, SwiGLU, its own block, an
// untied head), under mpiexec on 8 ranks, with no model-specific pipeline, plan or checkpoint
// code anywhere:
//   - dp 2 x tp 2 (+ sequence parallelism) x pp 2 with ZeRO-1, under 1F1B and interleaved 1F1B,
//     matches the serial run: per-step losses and the gathered weights within 1e-5 (fp32, 5 steps);
//   - a checkpoint saved under dp 2 x tp 2 x pp 2 resumes under dp 4 x tp 2 with ZeRO-3, and the
//     steps after it match the uninterrupted serial run (1e-5);
//   - the plan of each layout, summed from the model's own layer costs, equals the model-state
//     bytes the allocator holds on the busiest rank, and its activations within 10%.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <strata/strata.hpp>

#include "../mpi/layout_equivalence.hpp"
#include "custom_model.hpp"

namespace st = strata;

namespace {

using serial_policy = st::policy<st::host, st::serial, st::fp32>;
using strata_test::launch_policy;

const custom::dims shape{};
constexpr std::int64_t global_batch = 8;
constexpr int steps = 5;
// AdamW divides each step by the gradient's size, so where an element's gradient nearly cancels,
// reduction-order noise (all that differs between layouts) flips or scales its whole step: one
// element of blocks.1.attn.proj.weight has a gradient within rounding noise of zero, and with
// AdamW's usual eps = 1e-8 its weight differed by 1.7e-5 of max|w| after 5 steps at lr 5e-4 (the
// losses by 6e-8). eps = 1e-6, far below every real gradient here, keeps such an element's step
// at noise · lr / eps: the weights then agree to 3.3e-7.
constexpr double lr = 5e-4, adam_eps = 1e-6;

const strata_test::equivalence_setup setup{
    .lr = lr, .adam_eps = adam_eps, .steps = steps, .global_batch = global_batch};
using strata_test::layout_case;
strata_test::losses_and_weights serial_run() {
  return strata_test::serial_run<custom::model<serial_policy>>(shape, setup);
}
st::training_options launch(const layout_case& c, std::int64_t bucket = 1000) {
  return strata_test::launch(c, setup, bucket);
}

const layout_case three_d{"dp2 x tp2+sp x pp2, ZeRO-1, 1F1B", 2, 2, 2, 1, 1, 2, 1, "1f1b"};
const layout_case three_d_interleaved{
    "dp2 x tp2+sp x pp2, ZeRO-1, interleaved V=2", 2, 2, 2, 1, 1, 2, 2, "interleaved"};
const layout_case dp4_tp2{"dp4 x tp2, ZeRO-3", 4, 2, 1, 3, 0, 1, 1, "1f1b"};

bool eight_ranks() { return strata_test::world().size() == 8; }
bool lead() { return strata_test::world().rank() == 0; }

}  // namespace

TEST_CASE("a model that is not GPT-2 trains under dp x tp x pp with ZeRO-1 as it does serially") {
  if (!eight_ranks()) return;
  const auto ref = serial_run();
  for (const auto& c : {three_d, three_d_interleaved})
    strata_test::check_matches_serial<custom::model<launch_policy<st::fp32>>>("custom", shape, ref, c, setup);
}

TEST_CASE("under context parallelism, with every other axis, it trains as it does serially") {
  if (!eight_ranks()) return;
  const auto ref = serial_run();
  using M = custom::model<launch_policy<st::fp32>>;
  for (const auto& c : strata_test::context_layouts)
    strata_test::check_matches_serial<M>("custom", shape, ref, c, setup);
  for (const auto& c : strata_test::context_layouts_four_kv_heads)
    strata_test::check_matches_serial<M>("custom", shape, ref, c, setup);
}

TEST_CASE("its checkpoint saved under one layout resumes under another") {
  if (!eight_ranks()) return;
  const auto ref = serial_run();
  const std::string dir = (std::filesystem::current_path() / "custom_model_checkpoints").string();
  constexpr int saved_at = 3;
  const layout_case& dp2_cp2_tp2 = strata_test::context_layouts[4];  // ZeRO-1
  const layout_case& dp2_cp4_ata = strata_test::context_layouts_four_kv_heads[0];
  // From a pipeline to ZeRO-3, out of context parallelism, and into it.
  for (const auto& [from, to] :
       {std::pair{three_d, dp4_tp2}, std::pair{dp2_cp2_tp2, dp4_tp2}, std::pair{dp4_tp2, dp2_cp4_ata}}) {
    if (lead()) std::filesystem::remove_all(dir);
    strata_test::world().comm().barrier();
    std::uint64_t position = 0;
    {
      st::training<custom::model<launch_policy<st::fp32>>> a(strata_test::world().comm(), shape, launch(from));
      auto ckpt = a.make_checkpointer({dir, 0});
      auto data = strata_test::folded_corpus(shape.vocab);
      for (int s = 0; s < saved_at; ++s) a.step(data.next_batch(global_batch, shape.seq));
      position = data.position();
      a.save(ckpt, position);
    }
    st::training<custom::model<launch_policy<st::fp32>>> b(strata_test::world().comm(), shape, launch(to));
    auto ckpt = b.make_checkpointer({dir, 0});
    const auto loaded = b.resume(ckpt);
    REQUIRE(loaded.has_value());
    CHECK(loaded->progress.step == saved_at);
    CHECK(loaded->layout.at("pp") == from.pp);
    CHECK(loaded->layout.at("cp") == from.cp);
    CHECK(b.steps() == saved_at);
    auto data = strata_test::folded_corpus(shape.vocab);
    data.seek(loaded->progress.data_position);
    CHECK(loaded->progress.data_position == position);
    std::vector<double> after, expected(ref.losses.begin() + saved_at, ref.losses.end());
    for (int s = saved_at; s < steps; ++s) after.push_back(b.step(data.next_batch(global_batch, shape.seq)).loss);
    const double lerr = strata_test::elementwise_relative_error(after, expected);
    const double werr = strata_test::relative_error(b.serial_weights(), ref.weights);
    if (lead())
      MESSAGE("saved under " << std::string(from.name) << " at step " << saved_at << ", resumed under "
                             << std::string(to.name) << ": steps 4-5 loss rel. error " << lerr
                             << ", final weight rel. error " << werr);
    CHECK(lerr <= 1e-5);
    CHECK(werr <= 1e-5);
  }
}

TEST_CASE("its plan, from its own layer costs, equals what the allocator holds") {
  if (!eight_ranks()) return;
  using M = custom::model<launch_policy<st::mixed<st::bf16, float>>>;
  const auto& cp = strata_test::context_layouts;
  for (const auto& c : {three_d, three_d_interleaved, dp4_tp2, cp[1], strata_test::context_layouts_four_kv_heads[0],
                        cp[3], cp[5], cp[7], cp[9], cp[10]}) {
    CAPTURE(std::string(c.name));
    st::training<M> run(strata_test::world().comm(), shape,
                        launch(c, std::int64_t(1) << 30));  // one bucket: exact ZeRO pieces
    strata_test::check_plan_equals_allocator(run, shape, c, setup);
  }
}

TEST_CASE("its layers meet strata's concepts, and its shape is checked against a layout") {
  using P = serial_policy;
  static_assert(st::hidden_layer<custom::rmsnorm<P>> && st::hidden_layer<custom::swiglu<P>> &&
                st::hidden_layer<custom::block<P>>);
  static_assert(st::model_declaration<custom::model<P>>);
  // 4 heads: tp 3 is refused at start-up, naming the numbers (a static tensor<3> fails to compile:
  // tests/compile_fail/tensor_degree_not_dividing_heads.cpp).
  CHECK_THROWS_WITH_AS(st::check_tensor_extents<custom::model<P>>(shape, 3),
                       "tensor parallelism tp=3 does not divide heads = 4 (blocks 'blocks')", st::error);
  CHECK_THROWS_WITH_AS(st::check_tensor_extents<custom::model<P>>({.hidden = 50}, 4),
                       "tensor parallelism tp=4 does not divide FFN width = 50 (blocks 'blocks')", st::error);
  // Its names come from its declaration: what checkpoints and exports key on.
  const auto names = st::sequential_model<custom::model<P>>::serial_parameters(shape);
  CHECK(names.front().first == "embed.wte");
  CHECK(names.back().first == "head.weight");
  CHECK(names.size() == 2 + 4 * (2 + 4 + 3) + 1 + 1);
}
