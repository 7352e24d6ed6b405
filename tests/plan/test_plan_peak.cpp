// The plan's activation peak against the allocator's, over a whole training step: forward's
// scratch, everything kept, and backward's scratch (the input gradients in flight, gathered
// inputs under sequence parallelism, a GELU's pre-activation gradient, the per-head QKV copy, the
// logsumexps selective recomputation rebuilds). For GPT-2, the Llama example, the GPT-NeoX model
// of tests/neox and the sandwich blocks of tests/compose (whose costs the compositions derive):
// serially, and under mpiexec on 2 ranks as tp2 + SP (selective recomputation), dp2 with full
// recomputation, and pp2 under 1F1B. The allocator's figure is the ledger's peak of the
// activations category over the first step, from what was held before it.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "../compose/composed_blocks.hpp"
#include "../mpi/layout_equivalence.hpp"
#include "strata/models/neox.hpp"
#include "strata/models/gpt2.hpp"
#include "strata/models/llama.hpp"

namespace st = strata;

namespace {

using strata_test::launch_policy;

const strata::models::gpt2::dims gpt2_shape{.vocab = 64, .seq = 8, .layers = 4, .heads = 4, .d_model = 32};
const strata::models::llama::dims llama_shape{
    .vocab = 61, .seq = 8, .layers = 4, .heads = 4, .d_model = 32, .kv_heads = 2, .ffn = 64};
const strata::models::neox::dims neox_shape{.vocab = 61, .seq = 8, .layers = 4, .heads = 4, .d_model = 32, .ffn = 64};
constexpr std::int64_t batch = 8;

std::vector<std::int32_t> token_ids(std::int64_t n, std::int64_t vocab, std::int64_t shift) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[std::size_t(i)] = std::int32_t((i * 7 + shift) % vocab);
  return v;
}

// One serial forward and backward from a fresh ledger: the peak against the plan's.
template <class Model>
void check_serial(const char* name, const typename Model::config& shape) {
  using mc = st::memory_category;
  st::memory_ledger ledger;
  st::sequential_model<Model> model(ledger, shape, st::seed{1});
  const auto tokens = token_ids(batch * shape.seq, shape.vocab, 0),
             targets = token_ids(batch * shape.seq, shape.vocab, 3);
  ledger.reset_peaks();
  const std::size_t before = ledger.current(mc::activations);
  model.forward({tokens.data(), {batch, shape.seq}}, {targets.data(), {batch, shape.seq}});
  const auto kept = std::int64_t(ledger.current(mc::activations) - before);
  model.backward();
  const auto peak = std::int64_t(ledger.peak(mc::activations) - before);
  const auto p = st::plan_model<Model>(shape, {.micro = batch, .global = batch}, st::plan_setup{});
  MESSAGE(std::string(name) << " serial: peak " << peak << " B (plan " << p.activation_peak_bytes << "), kept " << kept
                            << " B (plan " << p.activation_bytes << ")");
  CHECK(peak == p.activation_peak_bytes);
  CHECK(kept == p.activation_bytes);
  CHECK(peak > kept);  // backward's scratch is real, and counted
}

struct peak_case {
  strata_test::layout_case layout;
  st::recompute_mode recompute = st::recompute_mode::none;
};
const peak_case cases[] = {
    {{"tp2 + SP, selective recomputation", 1, 2, 1, 0, 1, 1, 1, "1f1b"}, st::recompute_mode::selective},
    {{"dp2, full recomputation", 2, 1, 1, 0, 0, 1, 1, "1f1b"}, st::recompute_mode::full},
    {{"pp2, 1F1B M=4", 1, 1, 2, 0, 0, 4, 1, "1f1b"}},
};

// The first step of `c` through strata::training, on every rank: the busiest rank's peak
// against the plan's.
template <class Family>
void check_layouts(const char* name, const typename Family::config& shape) {
  using Model = typename Family::template apply<launch_policy<st::fp32>>;
  const strata_test::equivalence_setup setup{.steps = 1, .global_batch = batch};
  for (const auto& [c, recompute] : cases) {
    CAPTURE(std::string(c.name));
    auto o = strata_test::launch(c, setup);
    o.recompute = recompute;
    st::training<Model> run(strata_test::world().comm(), shape, o);
    auto& ledger = run.ledger();
    auto data = strata_test::folded_corpus(shape.vocab);
    const auto tokens = data.next_batch(batch, shape.seq);
    ledger.reset_peaks();
    const std::size_t before = ledger.current(st::memory_category::activations);
    run.step(tokens);
    double peak = double(ledger.peak(st::memory_category::activations) - before);
    strata_test::world().comm().all_reduce(std::span<double>(&peak, 1), st::reduce_op::max);
    st::plan_setup plan;
    plan.layout.dp = c.dp;
    plan.layout.tp = c.tp;
    plan.layout.pp = c.pp;
    plan.layout.zero_stage = c.zero;
    plan.layout.sequence_parallel = c.sp;
    plan.layout.microbatches = c.microbatches;
    plan.recompute = recompute;
    const std::int64_t micro = c.pp > 1 ? batch / c.dp / c.microbatches : o.trainer.micro_batch;
    const auto p = st::plan_model<Model>(shape, {.micro = micro, .global = batch}, plan);
    if (strata_test::world().rank() == 0)
      MESSAGE(std::string(name) << " " << std::string(c.name) << ": peak " << std::int64_t(peak) << " B (plan "
                                << p.activation_peak_bytes << "), kept at most " << p.activation_bytes << " B");
    CHECK(std::int64_t(peak) == p.activation_peak_bytes);
  }
}

template <template <class> class M, class Config>
struct family {
  using config = Config;
  template <class P>
  using apply = M<P>;
};

}  // namespace

TEST_CASE("the plan's activation peak equals the allocator's, serially") {
  if (strata_test::world().rank() != 0) return;
  using P = st::policy<st::host, st::serial, st::fp32>;
  check_serial<strata::models::gpt2::model<P>>("GPT-2", gpt2_shape);
  check_serial<strata::models::llama::model<P>>("Llama", llama_shape);
  check_serial<strata::models::neox::model<P>>("GPT-NeoX", neox_shape);
  check_serial<composed::model<P>>("sandwich", composed::dims{});
}

TEST_CASE("the plan's activation peak equals the allocator's under tp2 + SP, full recomputation and pp2") {
  if (strata_test::world().size() != 2) return;
  check_layouts<family<strata::models::gpt2::model, strata::models::gpt2::dims>>("GPT-2", gpt2_shape);
  check_layouts<family<strata::models::llama::model, strata::models::llama::dims>>("Llama", llama_shape);
  check_layouts<family<strata::models::neox::model, strata::models::neox::dims>>("GPT-NeoX", neox_shape);
  check_layouts<family<composed::model, composed::dims>>("sandwich", composed::dims{});
}
