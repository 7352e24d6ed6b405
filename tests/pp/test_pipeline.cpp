// Pipeline parallelism under mpiexec (2, 4 and 8 ranks), the library GPT-2's stages derived by
// strata from its declaration and assembled by strata::training:
//   - p = world size (2 or 4) x M in {1, p, 2p, 4p} x every schedule (interleaved where M is
//     divisible by p, with 2 chunks per stage): per-step losses and gradient norms and the
//     weights gathered from the stages match the single-rank run (relative error <= 1e-5 after
//     5 steps);
//   - 8 ranks: dp 2 x tp 2 x pp 2 with ZeRO-1 and sequence parallelism, the same;
//   - 2 ranks: dp 2 x one stage of 2 chunks (interleaved), whose chunks message themselves;
//   - every schedule, the 8-rank layout and the one-stage one, in a memory space that is not host
//     memory (a GPU's stand-in): the host run's losses and weights bit for bit, and only the
//     batches and losses cross it (tests/mpi/counting_space_run.hpp);
//   - micro-batches in flight on each stage, from the allocator: M for GPipe, at most p for
//     1F1B, as the schedule's own simulation predicts for interleaved;
//   - the bubble each stage measures, beside the analytic one (reported).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <strata/comm/launch.hpp>
#include <strata/comm/mesh.hpp>
#include <strata/parallel/data_parallel.hpp>
#include <strata/parallel/gather.hpp>
#include <strata/strata.hpp>

#include "../mpi/counting_space_run.hpp"
#include "../mpi/mpi_test.hpp"
#include "strata/models/gpt2.hpp"

namespace st = strata;

namespace {

using P32 = st::policy<st::host, st::serial, st::fp32>;
// Every setting given at launch.
using layout =
    st::parallel<st::data<st::dynamic, st::zero<st::dynamic>>, st::tensor<st::dynamic, st::dynamic_sequence_parallel>,
                 st::pipeline<st::dynamic, st::dynamic_schedule, st::dynamic, st::dynamic>>;
using PL = st::policy<st::host, layout, st::fp32>;
using kind = st::pipeline_schedule_kind;

// 8 blocks split over p·V = 2, 4 or 8 virtual stages; 67 tokens (padded under tp 2).
const strata::models::gpt2::dims tiny{.vocab = 67, .seq = 8, .layers = 8, .heads = 4, .d_model = 16};
constexpr int steps = 5;
constexpr double lr = 1e-3;  // see tests/tp: AdamW turns reduction-order noise into lr-sized steps

st::trainer_options options() { return strata_test::equivalence_options(lr, steps); }
st::token_stream corpus() { return strata_test::folded_corpus(tiny.vocab); }

struct run_result {
  std::vector<double> losses, weights;
  std::vector<double> grad_norms;  // each step's, before clipping
  st::pipeline_step_stats stats;   // the last step's, on this stage
};
// One step's loss and gradient norm (before clipping): a gradient summed over the wrong group
// can leave the losses within tolerance and not the norm.
void record(run_result& out, const st::step_result& r) {
  out.losses.push_back(r.loss);
  out.grad_norms.push_back(r.grad_norm);
}

// The serial reference with the same micro-batches (so the same accumulation).
run_result serial_run(std::int64_t batch, std::int64_t micro,
                      std::vector<std::pair<std::string, std::int64_t>>* names = nullptr) {
  st::memory_ledger ledger;
  st::sequential_model<strata::models::gpt2::model<P32>> model(ledger, tiny, st::seed{11});
  st::adamw<P32> opt(model, {.lr = lr});
  auto o = options();
  o.micro_batch = micro;
  st::trainer train(model, opt, o);
  auto data = corpus();
  run_result out;
  for (int s = 0; s < steps; ++s) record(out, train.step(data.next_batch(batch, tiny.seq)));
  auto& p = model.parameters();
  for (std::int64_t i = 0; i < p.size(); ++i) out.weights.push_back(p.weights_data()[i]);
  if (names)
    for (const auto& e : p.entries()) names->push_back({e.name, e.numel});
  return out;
}

struct pipeline_run {
  int pp = 2, tp = 1, zero = 0, microbatches = 1, chunks = 1;
  kind schedule = kind::one_f_one_b;
  bool sp = false;
  std::int64_t batch = 8;
  int dp = st::dynamic;  // the rest of the world
};

st::training_options launch(const pipeline_run& c) {
  return {.layout = {.dp = c.dp,
                     .tp = c.tp,
                     .pp = c.pp,
                     .microbatches = c.microbatches,
                     .zero_stage = c.zero,
                     .sequence_parallel = c.sp ? 1 : 0,
                     .virtual_chunks = c.chunks,
                     .schedule = std::string(st::schedule_label(c.schedule))},
          .seed = st::seed{11},
          .optimizer = {.lr = lr},
          .trainer = options(),
          .bucket_elems = 1000};
}

run_result run(const pipeline_run& c) {
  st::training<strata::models::gpt2::model<PL>> run(strata_test::world().comm(), tiny, launch(c));
  auto data = corpus();
  run_result out;
  for (int s = 0; s < steps; ++s) record(out, run.step(data.next_batch(c.batch, tiny.seq)));
  out.stats = run.model().last_step();
  out.weights = run.serial_weights();
  return out;
}

double weight_error(const run_result& a, const run_result& ref) {
  return strata_test::relative_error(a.weights, ref.weights);
}
double loss_error(const run_result& a, const run_result& ref) {
  return strata_test::elementwise_relative_error(a.losses, ref.losses);
}
double norm_error(const run_result& a, const run_result& ref) {
  return strata_test::elementwise_relative_error(a.grad_norms, ref.grad_norms);
}

}  // namespace

TEST_CASE("every schedule at p = world size and M in {1, p, 2p, 4p} matches the serial run") {
  const int p = strata_test::world().size();
  if (p != 2 && p != 4) return;
  const bool lead = strata_test::world().rank() == 0;
  for (int M : {1, p, 2 * p, 4 * p}) {
    const std::int64_t batch = 2 * M;  // two sequences per micro-batch
    const auto ref = serial_run(batch, 2);
    for (kind k : {kind::gpipe, kind::one_f_one_b, kind::interleaved}) {
      if (k == kind::interleaved && M % p != 0) continue;  // the schedule cannot take it
      pipeline_run c{
          .pp = p, .microbatches = M, .chunks = k == kind::interleaved ? 2 : 1, .schedule = k, .batch = batch};
      CAPTURE(M);
      CAPTURE(std::string(st::schedule_label(k)));
      const auto got = run(c);
      const double lerr = loss_error(got, ref), gerr = norm_error(got, ref), werr = weight_error(got, ref);
      // In flight on this stage, from the allocator: the activation bytes held at the step's
      // peak over those of one chunk-micro-batch (exact where every chunk holds the same).
      const auto sim = st::simulate({k, p, M, c.chunks});
      const int s = strata_test::world().rank();
      CHECK(got.stats.peak_in_flight == sim.peak_in_flight[std::size_t(s)]);
      const std::size_t one = got.stats.largest_chunk_bytes;
      if (c.chunks == 1) {  // every micro-batch of the stage holds the same
        CHECK(got.stats.peak_activation_bytes == std::size_t(sim.peak_in_flight[std::size_t(s)]) * one);
        if (k == kind::gpipe) CHECK(got.stats.peak_activation_bytes == std::size_t(M) * one);
        if (k == kind::one_f_one_b) CHECK(got.stats.peak_activation_bytes == std::size_t(std::min(p - s, M)) * one);
      } else {  // chunks differ (the embedding, the head): bounded by the largest
        CHECK(got.stats.peak_activation_bytes <= std::size_t(sim.peak_in_flight[std::size_t(s)]) * one);
        CHECK(got.stats.peak_activation_bytes > std::size_t(sim.peak_in_flight[std::size_t(s)] - 1) * one);
      }
      const double idle = got.stats.idle_seconds / (got.stats.idle_seconds + got.stats.busy_seconds);
      if (lead)
        MESSAGE("p=" << p << " M=" << M << " " << std::string(st::schedule_label(k))
                     << std::string(c.chunks > 1 ? " V=2" : "") << ": loss rel. error " << lerr
                     << ", gradient norm rel. error " << gerr << ", weight rel. error " << werr << "; stage 0 holds "
                     << got.stats.peak_in_flight << " chunk-micro-batches; idle " << idle << " (analytic bubble "
                     << st::analytic_bubble({k, p, M, c.chunks}) << ")");
      CHECK(lerr <= 1e-5);
      CHECK(gerr <= 1e-5);
      CHECK(werr <= 1e-5);
    }
  }
}

TEST_CASE("dp 2 x tp 2 x pp 2 with ZeRO-1 and sequence parallelism matches the serial run") {
  if (strata_test::world().size() != 8) return;
  const auto ref = serial_run(8, 2);
  for (kind k : {kind::one_f_one_b, kind::interleaved}) {
    pipeline_run c{.pp = 2,
                   .tp = 2,
                   .zero = 1,
                   .microbatches = 2,
                   .chunks = k == kind::interleaved ? 2 : 1,
                   .schedule = k,
                   .sp = true,
                   .batch = 8};
    const auto got = run(c);
    const double lerr = loss_error(got, ref), gerr = norm_error(got, ref), werr = weight_error(got, ref);
    if (strata_test::world().rank() == 0)
      MESSAGE("dp2 x tp2+sp x pp2 ZeRO-1 " << std::string(st::schedule_label(k)) << ": loss rel. error " << lerr
                                           << ", gradient norm rel. error " << gerr << ", weight rel. error " << werr);
    CHECK(lerr <= 1e-5);
    CHECK(gerr <= 1e-5);
    CHECK(werr <= 1e-5);
    // The same layout in a memory space that is not host memory: bit for bit, only the batches cross.
    const auto other = strata_test::run_in_counting_space<strata::models::gpt2::model<PL>>(
        strata_test::world().comm(), tiny, launch(c), steps, c.batch, corpus());
    CHECK(other.losses == got.losses);
    CHECK(other.weights == got.weights);
    strata_test::check_only_batches_cross(other, steps);
  }
}

TEST_CASE("every schedule in a memory space that is not host memory: bit for bit, only the batches cross") {
  const int p = strata_test::world().size();
  if (p != 2 && p != 4) return;
  for (kind k : {kind::gpipe, kind::one_f_one_b, kind::interleaved}) {
    const pipeline_run c{
        .pp = p, .microbatches = 2 * p, .chunks = k == kind::interleaved ? 2 : 1, .schedule = k, .batch = 4 * p};
    CAPTURE(std::string(st::schedule_label(k)));
    const auto host = run(c);
    const auto other = strata_test::run_in_counting_space<strata::models::gpt2::model<PL>>(
        strata_test::world().comm(), tiny, launch(c), steps, c.batch, corpus());
    CHECK(other.losses == host.losses);
    CHECK(other.weights == host.weights);
    strata_test::check_only_batches_cross(other, steps);
  }
}

TEST_CASE("one stage of 2 chunks (messages to itself) matches the serial run, and in a non-host space bit for bit") {
  if (strata_test::world().size() != 2) return;
  // dp 2 x pp 1, interleaved with V = 2: chunk 0 hands its activations to chunk 1 on the same rank.
  const pipeline_run c{.pp = 1, .microbatches = 2, .chunks = 2, .schedule = kind::interleaved, .batch = 8, .dp = 2};
  const auto ref = serial_run(8, 2);  // 2 sequences per micro-batch, as each rank's
  const auto host = run(c);
  CHECK(host.stats.peak_in_flight == st::simulate({kind::interleaved, 1, 2, 2}).peak_in_flight[0]);
  CHECK(loss_error(host, ref) <= 1e-5);
  CHECK(norm_error(host, ref) <= 1e-5);
  CHECK(weight_error(host, ref) <= 1e-5);
  const auto other = strata_test::run_in_counting_space<strata::models::gpt2::model<PL>>(
      strata_test::world().comm(), tiny, launch(c), steps, c.batch, corpus());
  CHECK(other.losses == host.losses);
  CHECK(other.weights == host.weights);
  CHECK(other.microbatches == 2);  // the pipeline's count, so the crossings are counted per micro-batch
  strata_test::check_only_batches_cross(other, steps);
}

TEST_CASE("explicit layers per stage, and splits that cannot work, say so") {
  const int p = strata_test::world().size();
  if (p != 2) return;
  const auto ref = serial_run(4, 2);
  {
    auto options = launch({.pp = 2, .microbatches = 2, .batch = 4});
    options.blocks_per_virtual_stage = {5, 3};
    st::training<strata::models::gpt2::model<PL>> run(strata_test::world().comm(), tiny, options);
    // Stage 0 holds the embedding and blocks 0-4, stage 1 blocks 5-7, ln_f and the head.
    const int stage = run.mesh().position().pp_rank;
    auto& params = run.model().parameters();
    CHECK(params.find("h.4.attn.qkv.weight").valid() == (stage == 0));
    CHECK(params.find("h.5.attn.qkv.weight").valid() == (stage == 1));
    CHECK(params.find("ln_f.weight").valid() == (stage == 1));
    CHECK(params.find("wte").valid());  // the first stage's own, the last stage's replica
    CHECK(params.info(params.find("wte")).replica == (stage == 1));
    auto data = corpus();
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) losses.push_back(run.step(data.next_batch(4, tiny.seq)).loss);
    for (int s = 0; s < steps; ++s)
      CHECK(std::abs(losses[std::size_t(s)] - ref.losses[std::size_t(s)]) <= 1e-5 * ref.losses[std::size_t(s)]);
  }
  st::pipeline_placement uneven{{kind::one_f_one_b, 2, 2, 1}, 0, {}};
  CHECK_THROWS_WITH_AS(uneven.block_ranges(7),
                       "pipeline: 7 layers do not split evenly over 2 stages x 1 chunks = 2 "
                       "virtual stages; give the layers per stage",
                       st::error);
  st::pipeline_placement wrong{{kind::interleaved, 2, 2, 2}, 0, {4, 4}};
  CHECK_THROWS_WITH_AS(wrong.block_ranges(8),
                       "pipeline: 2 layer counts given for 4 virtual stages (2 stages x 2 chunks)", st::error);
  st::pipeline_placement empty{{kind::one_f_one_b, 2, 2, 1}, 0, {8, 0}};
  CHECK_THROWS_WITH_AS(empty.block_ranges(8), "pipeline: virtual stage 1 has 0 layers; every stage needs at least one",
                       st::error);
  // ZeRO-2 under a pipeline is refused on every rank at start-up.
  CHECK_THROWS_WITH_AS(st::training<strata::models::gpt2::model<PL>>(strata_test::world().comm(), tiny,
                                                                     launch({.pp = 2, .zero = 2, .microbatches = 2})),
                       doctest::Contains("pipeline parallelism works with ZeRO 0 or 1, not 2"), st::error);
}
