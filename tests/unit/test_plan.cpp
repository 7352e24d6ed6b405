// The planner against the published arithmetic: the back-of-envelope model state (70B, 100B),
// ZeRO's worked example, 6·N·D and 2·N, and Narayanan et al.'s FLOPs per iteration; its
// compile-time use; and its start-up errors. The GPT shapes are planned through the example
// model's declaration (strata/models/gpt2.hpp), the path every declared model takes. (Plan
// against the allocator: tests/plan.)
#include <doctest/doctest.h>

#include <cmath>

#include "strata/models/gpt2.hpp"
#include "strata/plan/plan.hpp"

namespace st = strata;

namespace {

constexpr double GB = 1e9;

// GPT-3 175B (Brown et al. 2020) and GPT-2 small, as the example model's dims.
constexpr strata::models::gpt2::dims gpt3_175b{
    .vocab = 51200, .seq = 2048, .layers = 96, .heads = 96, .d_model = 12288};
constexpr strata::models::gpt2::dims gpt2_small{.vocab = 50304, .seq = 1024, .layers = 12, .heads = 12, .d_model = 768};

// The example GPT-2 in a precision. plan_model takes the layout from its setup; attention keeps
// one logsumexp per query row on the host as on the GPU (last test case).
template <class Precision>
using gpt = strata::models::gpt2::model<st::policy<st::host, st::serial, Precision>>;
using gpt_bf16 = gpt<st::mixed<st::bf16, float>>;

st::plan_setup with(int dp, int tp, int pp, int zero, st::recompute_mode r = st::recompute_mode::none) {
  st::plan_setup s;
  s.layout.dp = dp;
  s.layout.tp = tp;
  s.layout.pp = pp;
  s.layout.zero_stage = zero;
  s.recompute = r;
  return s;
}

}  // namespace

TEST_CASE("back of the envelope: 70B in bf16 and 100B in fp32") {
  // bf16 weights and gradients, fp32 AdamW moments, no master copy.
  const auto bf16 = st::model_state_plan(70'000'000'000, {.storage_bytes = 2, .master_bytes = 0});
  CHECK(bf16.params_bytes == 140 * GB);
  CHECK(bf16.grads_bytes == 140 * GB);
  CHECK(bf16.optimizer_bytes == 560 * GB);
  CHECK(bf16.model_state_bytes() == 840 * GB);
  CHECK(double(bf16.model_state_bytes()) / st::hw::h100_80gb.memory_bytes == 10.5);
  // Keeping fp32 master weights adds 280 GB.
  const auto master = st::model_state_plan(70'000'000'000, {.storage_bytes = 2, .master_bytes = 4});
  CHECK(master.master_bytes == 280 * GB);
  CHECK(master.model_state_bytes() == 1120 * GB);
  // 100B in fp32: 400 GB of weights.
  CHECK(st::model_state_plan(100'000'000'000, {.storage_bytes = 4, .master_bytes = 0}).params_bytes == 400 * GB);
  // SGD with momentum keeps one moment.
  CHECK(st::model_state_plan(1000, {.storage_bytes = 4, .master_bytes = 0, .optimizer = st::optimizer_kind::sgd})
            .optimizer_bytes == 4000);
}

TEST_CASE("ZeRO's worked example: 7.5B parameters over 64 ranks, mixed-precision Adam") {
  const std::int64_t psi = 7'500'000'000;
  const auto at = [&](int zero) {
    return double(st::model_state_plan(psi, {.storage_bytes = 2, .master_bytes = 4, .dp = 64, .zero = zero})
                      .model_state_bytes()) /
           GB;
  };
  CHECK(at(0) == doctest::Approx(120.0));
  CHECK(std::round(at(1) * 10) / 10 == 31.4);
  CHECK(std::round(at(2) * 10) / 10 == 16.6);
  CHECK(std::round(at(3) * 10) / 10 == 1.9);
}

TEST_CASE("FLOPs per iteration follow Narayanan et al. 2021, with and without full recomputation") {
  for (const auto& m : {gpt3_175b, gpt2_small}) {
    const double B = 512, s = double(m.seq), l = double(m.layers), h = double(m.d_model), V = double(m.vocab);
    const double with_recompute = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
    const double without = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
    const auto full =
        st::plan_model<gpt_bf16>(m, {.micro = 1, .global = 512}, with(8, 1, 1, 1, st::recompute_mode::full));
    const auto none = st::plan_model<gpt_bf16>(m, {.micro = 1, .global = 512}, with(8, 1, 1, 1));
    // strata also counts LayerNorms, residuals, softmax and the embedding: O(B·s·h) more, a
    // relative ~1/h (3e-3 at h = 768, 2e-4 at h = 12288).
    const double tolerance = 3.0 / h;
    CAPTURE(h);
    CHECK(std::abs(full.flops_per_step / with_recompute - 1) <= tolerance);
    CHECK(std::abs(none.flops_per_step / without - 1) <= tolerance);
    CHECK(full.flops_per_step > with_recompute);  // the extra terms only add
    CHECK(none.model_flops_per_step == none.flops_per_step);
    CHECK(full.model_flops_per_step == none.flops_per_step);
  }
}

TEST_CASE("training costs about 6·N FLOPs per token, inference about 2·N") {
  for (const auto& m : {gpt3_175b, gpt2_small}) {
    const auto p = st::plan_model<gpt_bf16>(m, {.micro = 1, .global = 64}, with(1, 1, 1, 0));
    const double tokens = 64.0 * double(m.seq), N = double(p.params_total);
    const double l = double(m.layers), s = double(m.seq), h = double(m.d_model);
    CAPTURE(m.d_model);
    // 6·N per token, plus the attention scores' 12·l·s·h (Kaplan et al. 2020 count the same
    // term), which 6·N·D leaves out: 2.6% at GPT-3's shape, 15% at GPT-2 small's s = 1024.
    CHECK(p.model_flops_per_step / ((6 * N + 12 * l * s * h) * tokens) == doctest::Approx(1.0).epsilon(3.0 / h));
    CHECK(p.model_flops_per_step / 3 / ((2 * N + 4 * l * s * h) * tokens) == doctest::Approx(1.0).epsilon(3.0 / h));
  }
  // For a large model 6·N·D and 2·N are within 3%.
  const auto big = st::plan_model<gpt_bf16>(gpt3_175b, {.micro = 1, .global = 64}, with(1, 1, 1, 0));
  const double D = 64.0 * 2048;
  CHECK(big.model_flops_per_step / (6 * double(big.params_total) * D) == doctest::Approx(1.0).epsilon(0.03));
  // The shapes' own parameter counts: GPT-3's 175B (12lh² + 13lh + Vh + sh + 2h) and GPT-2
  // small's 124M (with a 50304-token vocabulary).
  CHECK(big.params_total == 174'615'846'912);
  CHECK(st::plan_model<gpt<st::fp32>>(gpt2_small, {}, with(1, 1, 1, 0)).params_total == 124'475'904);
}

namespace {
using fits_policy = st::policy<st::cuda, st::parallel<st::data<8, st::zero<1>>, st::tensor<2, st::sequence_parallel>>,
                               st::mixed<st::bf16, float>>;
// The compile-time form: the layout from the policy (a layout that does not fit:
// tests/compile_fail/plan_does_not_fit.cpp).
static_assert(st::plan<strata::models::gpt2::model<fits_policy>>(gpt2_small, st::batch{.micro = 4, .global = 512})
                  .fits(st::hw::h100_80gb));
// The same for a model whose shape is part of its type.
struct gpt2_small_model : strata::models::gpt2::model<fits_policy> {
  static constexpr strata::models::gpt2::dims shape = gpt2_small;
};
static_assert(
    st::plan<gpt2_small_model>(st::batch{.micro = 4, .global = 512}).params_total ==
    st::plan<strata::models::gpt2::model<fits_policy>>(gpt2_small, st::batch{.micro = 4, .global = 512}).params_total);
}  // namespace

TEST_CASE("the plan splits what tensor, sequence and pipeline parallelism split") {
  const st::batch b{.micro = 4, .global = 512};
  using P = gpt_bf16;
  const auto one = st::plan_model<P>(gpt2_small, b, with(8, 1, 1, 0));
  const auto tp = st::plan_model<P>(gpt2_small, b, with(4, 2, 1, 0));
  auto sp_setup = with(4, 2, 1, 0);
  sp_setup.layout.sequence_parallel = 1;
  const auto sp = st::plan_model<P>(gpt2_small, b, sp_setup);
  CHECK(tp.params_per_rank < one.params_per_rank);
  CHECK(tp.activation_bytes < one.activation_bytes);
  CHECK(sp.activation_bytes < tp.activation_bytes);
  CHECK(tp.comm_bytes.tp > 0);
  CHECK(one.comm_bytes.tp == 0);
  // ZeRO-3 holds 1/dp of everything; pipeline stages split the blocks.
  const auto z3 = st::plan_model<P>(gpt2_small, b, with(8, 1, 1, 3));
  CHECK(z3.params_bytes == (one.params_per_rank + 7) / 8 * 2);
  auto pp = with(4, 1, 2, 1);
  pp.schedule = st::pipeline_schedule_kind::one_f_one_b;
  const auto piped = st::plan_model<P>(gpt2_small, b, pp);
  CHECK(piped.in_flight == 2);
  CHECK(piped.bubble_fraction == doctest::Approx(1.0 / (32 + 1)));
  CHECK(piped.comm_bytes.pp > 0);
  CHECK(piped.comm_bytes.embedding > 0);
  // The search-friendly runtime form agrees with the fits() check.
  CHECK(one.fits(st::hw::h100_80gb));
  CHECK_FALSE(st::plan_model<P>(gpt3_175b, {.micro = 1, .global = 8}, with(8, 1, 1, 0)).fits(st::hw::h100_80gb));
}

TEST_CASE("a plan that cannot be split or does not fit says so at start-up") {
  using P = gpt_bf16;
  CHECK_THROWS_WITH_AS(st::plan_model<P>(gpt2_small, {.micro = 1, .global = 8}, with(1, 5, 1, 0)),
                       "plan: tensor parallelism tp=5 does not divide heads = 12 (blocks 'h')", st::error);
  CHECK_THROWS_WITH_AS(st::plan_model<P>(gpt2_small, {.micro = 1, .global = 8}, with(1, 1, 5, 0)),
                       "plan: 12 layers do not split evenly over 5 stages x 1 chunks", st::error);
  CHECK_THROWS_WITH_AS(st::plan_model<P>(gpt2_small, {.micro = 3, .global = 8}, with(1, 1, 1, 0)),
                       "plan: the global batch 8 does not split into dp=1 x micro-batches of 3", st::error);
  const auto big = st::plan_model<P>(gpt3_175b, {.micro = 1, .global = 8}, with(8, 1, 1, 0));
  CHECK_THROWS_WITH_AS(big.check_fits(st::hw::h100_80gb), doctest::Contains("plan: model state of"), st::error);
}

TEST_CASE("attention keeps one logsumexp per query row on every device: no s² term") {
  using host_attention = st::attention<st::policy<st::host, st::serial, st::mixed<st::bf16, float>>>;
  using gpu_attention = st::attention<st::policy<st::cuda, st::serial, st::mixed<st::bf16, float>>>;
  constexpr host_attention::config hc{.channels = 768, .heads = 12};
  constexpr gpu_attention::config gc{.channels = 768, .heads = 12};
  constexpr st::cost_scope one_sequence{.batch = 1, .seq = 1024}, two_sequences{.batch = 1, .seq = 2048};
  // GPT-2 small, one sequence of 1024: 12 x 1024 fp32 statistics, and twice that at 2048.
  static_assert(host_attention::cost(hc, one_sequence).core_bytes == 12LL * 1024 * 4);
  static_assert(gpu_attention::cost(gc, one_sequence).core_bytes == 12LL * 1024 * 4);
  static_assert(host_attention::cost(hc, two_sequences).activation_bytes ==
                2 * host_attention::cost(hc, one_sequence).activation_bytes);
  // The plan of a model is the same on each device.
  const st::batch b{.micro = 1, .global = 8};
  const auto on_host = st::plan_model<gpt_bf16>(gpt2_small, b, with(8, 1, 1, 0));
  const auto on_gpu =
      st::plan_model<strata::models::gpt2::model<gpu_attention::policy>>(gpt2_small, b, with(8, 1, 1, 0));
  CHECK(on_host.activation_bytes == on_gpu.activation_bytes);
  CHECK(on_host.model_state_bytes() == on_gpu.model_state_bytes());
}
