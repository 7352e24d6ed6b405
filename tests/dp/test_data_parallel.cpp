// Data parallelism under mpiexec: every (dp, ZeRO stage) trains the library's GPT-2, assembled by
// strata::training from its declaration and a policy, to the same per-step losses, gradient
// norms and final weights as the serial model with the same global batch, which each rank also runs itself as
// the reference; and the allocator's books and the byte counters equal the ZeRO formulas. ZeRO
// 0-3 in a memory space that is not host memory (a GPU's stand-in) give the host run bit for bit,
// with only the batches and losses crossing it (tests/mpi/counting_space_run.hpp); so does ZeRO-3
// started from given weights, which serial_weights() returns as stored.
//
// Error measure for weights: max_i |dp_i - serial_i| / max_i |serial_i|.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include <strata/comm/launch.hpp>
#include <strata/parallel/data_parallel.hpp>
#include <strata/strata.hpp>

#include "../mpi/counting_space_run.hpp"
#include "../mpi/mpi_test.hpp"
#include "strata/models/gpt2.hpp"

namespace st = strata;

namespace {

using P32 = st::policy<st::host, st::serial, st::fp32>;
using PBF16 = st::policy<st::host, st::serial, st::mixed<st::bf16, float>>;
// Data parallel over every rank of the launch, the ZeRO stage given at start-up.
using dp_layout = st::parallel<st::data<st::dynamic, st::zero<st::dynamic>>>;
template <class Precision>
using dp_policy = st::policy<st::host, dp_layout, Precision>;
template <class P>
using gpt2_net = st::sequential_model<strata::models::gpt2::model<P>>;
template <class P>
using gpt2_run = st::training<strata::models::gpt2::model<P>>;

const strata::models::gpt2::dims tiny{.vocab = 256, .seq = 16, .layers = 2, .heads = 2, .d_model = 16};
constexpr std::int64_t global_batch = 8;
constexpr int steps = 5;

st::trainer_options options() {
  st::trainer_options o;
  o.schedule = {3e-3, 3e-4, 1, steps};
  o.micro_batch = 0;
  return o;
}

struct run_result {
  std::vector<double> losses;
  std::vector<double> weights;
  std::vector<double> grad_norms;  // each step's, before clipping
};
// One step's loss and gradient norm: a gradient reduced over the wrong group can leave the
// losses within tolerance and not the norm.
void record(run_result& r, const st::step_result& step) {
  r.losses.push_back(step.loss);
  r.grad_norms.push_back(step.grad_norm);
}

template <class P>
run_result serial_run() {
  st::memory_ledger ledger;
  gpt2_net<P> model(ledger, tiny, st::seed{11});
  st::adamw<P> opt(model, {.lr = 3e-3});
  st::trainer train(model, opt, options());
  st::token_stream data(st::byte_tokens(st::generate_corpus(30000)), 5);
  run_result r;
  for (int s = 0; s < steps; ++s) record(r, train.step(data.next_batch(global_batch, tiny.seq)));
  auto& p = model.parameters();
  for (std::int64_t i = 0; i < p.size(); ++i) r.weights.push_back(st::convert<double>(p.weights_data()[i]));
  return r;
}

// The run's options: ZeRO `zero`, buckets of `bucket_elems`, micro-batches of `micro` (0: whole).
st::training_options dp_options(int zero, std::int64_t bucket_elems, std::int64_t micro = 0) {
  st::training_options o{.layout = {.zero_stage = zero},
                         .seed = st::seed{11},
                         .optimizer = {.lr = 3e-3},
                         .trainer = options(),
                         .bucket_elems = bucket_elems};
  o.trainer.micro_batch = micro;
  return o;
}

template <class Precision>
run_result dp_run(st::mpi_communicator& world, int zero, std::int64_t bucket_elems, std::int64_t micro = 0) {
  gpt2_run<dp_policy<Precision>> run(world, tiny, dp_options(zero, bucket_elems, micro));
  st::token_stream data(st::byte_tokens(st::generate_corpus(30000)), 5);
  run_result r;
  for (int s = 0; s < steps; ++s) record(r, run.step(data.next_batch(global_batch, tiny.seq)));
  r.weights = run.serial_weights();
  return r;
}

// Deeper than `tiny`, so the transformer blocks (not the embedding table) hold most of Ψ: the
// model of the ZeRO-2/3 memory checks.
const strata::models::gpt2::dims deeper{.vocab = 256, .seq = 16, .layers = 6, .heads = 2, .d_model = 32};

// Elements of the k largest buckets: what ZeRO-2/3 may hold beyond the owned pieces in a step.
std::size_t largest_buckets(const st::dp_layout& layout, std::size_t k) {
  std::vector<std::size_t> sizes;
  for (const auto& b : layout.buckets()) sizes.push_back(std::size_t(b.range.size()));
  std::sort(sizes.rbegin(), sizes.rend());
  std::size_t sum = 0;
  for (std::size_t i = 0; i < k && i < sizes.size(); ++i) sum += sizes[i];
  return sum;
}

double weight_error(const run_result& a, const run_result& ref) {
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < ref.weights.size(); ++i) {
    worst = std::max(worst, std::abs(a.weights[i] - ref.weights[i]));
    scale = std::max(scale, std::abs(ref.weights[i]));
  }
  return worst / scale;
}

}  // namespace

TEST_CASE("dp x ZeRO 0/1/2/3 in fp32 match the serial run after 5 steps (rel. error <= 1e-5)") {
  auto& world = strata_test::world().comm();
  const auto ref = serial_run<P32>();
  for (int zero : {0, 1, 2, 3}) {
    for (std::int64_t bucket : {std::int64_t(1000), std::int64_t(1) << 20}) {  // many buckets, and one
      const auto got = dp_run<st::fp32>(world, zero, bucket);
      CAPTURE(zero);
      CAPTURE(bucket);
      for (int s = 0; s < steps; ++s)
        CHECK(std::abs(got.losses[std::size_t(s)] - ref.losses[std::size_t(s)]) <= 1e-5 * ref.losses[std::size_t(s)]);
      const double err = weight_error(got, ref);
      const double gerr = strata_test::elementwise_relative_error(got.grad_norms, ref.grad_norms);
      if (world.rank() == 0)
        MESSAGE("dp=" << world.size() << " zero=" << zero << " bucket=" << bucket << ": weight rel. error " << err
                      << ", gradient norm rel. error " << gerr);
      CHECK(err <= 1e-5);
      CHECK(gerr <= 1e-5);
    }
  }
}

TEST_CASE("ZeRO 0-3 in a memory space that is not host memory: bit for bit, only the batches cross") {
  auto& world = strata_test::world().comm();
  for (int zero : {0, 1, 2, 3}) {
    CAPTURE(zero);
    const auto host = dp_run<st::fp32>(world, zero, 1000);
    const auto other = strata_test::run_in_counting_space<strata::models::gpt2::model<dp_policy<st::fp32>>>(
        world, tiny, dp_options(zero, 1000), steps, global_batch,
        st::token_stream(st::byte_tokens(st::generate_corpus(30000)), 5));
    CHECK(other.losses == host.losses);
    CHECK(other.weights == host.weights);
    strata_test::check_only_batches_cross(other, steps);
  }
}

TEST_CASE(
    "ZeRO-3 from given initial weights: serial_weights() returns them, and a non-host space gives host memory bit for "
    "bit") {
  auto& world = strata_test::world().comm();
  if (world.size() != 2) return;
  auto o = dp_options(3, 1000);
  for (const auto& [name, n] : gpt2_net<dp_policy<st::fp32>>::serial_parameters(tiny))
    for (std::int64_t i = 0; i < n; ++i)
      o.initial_weights.push_back(0.1 * strata_test::raw_value(5, 0, o.initial_weights.size()));
  // fp64 values not representable in fp32: each rank's shard stores them rounded.
  std::vector<double> rounded;
  for (double x : o.initial_weights) rounded.push_back(double(float(x)));
  run_result host;
  {
    gpt2_run<dp_policy<st::fp32>> run(world, tiny, o);
    CHECK(run.serial_weights() == rounded);
    st::token_stream data(st::byte_tokens(st::generate_corpus(30000)), 5);
    for (int s = 0; s < steps; ++s) host.losses.push_back(run.step(data.next_batch(global_batch, tiny.seq)).loss);
    host.weights = run.serial_weights();
  }
  CHECK(host.weights != rounded);  // the steps moved them
  const auto other = strata_test::run_in_counting_space<strata::models::gpt2::model<dp_policy<st::fp32>>>(
      world, tiny, o, steps, global_batch, st::token_stream(st::byte_tokens(st::generate_corpus(30000)), 5));
  CHECK(other.losses == host.losses);
  CHECK(other.weights == host.weights);
  strata_test::check_only_batches_cross(other, steps);
}

TEST_CASE("micro-batches within each data-parallel rank accumulate to the same step") {
  auto& world = strata_test::world().comm();
  if (global_batch / world.size() < 2) return;  // one sequence per rank: nothing to split
  const auto ref = serial_run<P32>();
  for (int zero : {0, 1, 2, 3}) {  // ZeRO 2/3 communicate every micro-batch, 0/1 only the last
    const auto got = dp_run<st::fp32>(world, zero, 1000, global_batch / world.size() / 2);
    CAPTURE(zero);
    CHECK(weight_error(got, ref) <= 1e-5);
    CHECK(strata_test::elementwise_relative_error(got.grad_norms, ref.grad_norms) <= 1e-5);
  }
}

TEST_CASE("bf16 compute with fp32 master weights tracks the serial bf16 run") {
  auto& world = strata_test::world().comm();
  const auto ref = serial_run<PBF16>();
  const auto got = dp_run<st::mixed<st::bf16, float>>(world, 3, 1000);
  double worst = 0;
  for (int s = 0; s < steps; ++s)
    worst = std::max(worst, std::abs(got.losses[std::size_t(s)] - ref.losses[std::size_t(s)]));
  if (world.rank() == 0)
    MESSAGE("bf16 dp=" << world.size() << ": max loss deviation " << worst << ", weights " << weight_error(got, ref));
  // bf16 rounds each reduced gradient once more than the serial run: 2^-8 relative.
  CHECK(worst <= 2e-2);
  CHECK(weight_error(got, ref) <= 2e-2);
}

TEST_CASE("model-state bytes per rank follow the ZeRO formulas (fp32 AdamW)") {
  auto& world = strata_test::world().comm();
  const int n = world.size();
  using mc = st::memory_category;
  for (int zero : {0, 1, 2, 3}) {
    gpt2_run<dp_policy<st::fp32>> run(world, tiny, dp_options(zero, 1000));
    auto& ledger = run.ledger();
    auto& dp = run.synchronizer();
    const auto psi = std::size_t(run.model().parameters().size());
    CAPTURE(zero);
    CHECK(ledger.current(mc::parameters) == (zero == 3 ? 4 * std::size_t(dp.optimizer_elements()) : 4 * psi));
    if (zero < 2) {
      CHECK(ledger.current(mc::gradients) == 4 * psi);
    } else {
      CHECK(ledger.current(mc::gradients) == 4 * std::size_t(dp.optimizer_elements()));
    }
    CHECK(ledger.current(mc::master_weights) == 0);
    if (zero == 0) {
      CHECK(ledger.current(mc::optimizer_state) == 8 * psi);
    } else {
      // 8Ψ/N up to each bucket's rounding: a rank owns ceil(bucket/N) or fewer of each bucket.
      const auto owned = std::size_t(dp.optimizer_elements());
      CHECK(ledger.current(mc::optimizer_state) == 8 * owned);
      CHECK(owned >= psi / std::size_t(n) - dp.layout().buckets().size());
      CHECK(owned <= psi / std::size_t(n) + dp.layout().buckets().size());
      // Every element is owned by exactly one rank.
      std::vector<double> mine{double(owned)};
      world.all_reduce(std::span<double>(mine), st::reduce_op::sum);
      CHECK(std::size_t(mine[0]) == psi);
    }
  }
}

TEST_CASE("ZeRO-2 holds 4Ψ/N gradient bytes between steps and a few buckets more during backward") {
  auto& world = strata_test::world().comm();
  const int n = world.size();
  using mc = st::memory_category;
  gpt2_run<dp_policy<st::fp32>> run(world, deeper, dp_options(2, 4096));
  auto& ledger = run.ledger();
  auto& dp = run.synchronizer();
  const auto psi = std::size_t(run.model().parameters().size());
  const auto owned = std::size_t(dp.optimizer_elements());
  CHECK(ledger.current(mc::gradients) == 4 * owned);
  CHECK(ledger.current(mc::optimizer_state) == 8 * owned);
  st::token_stream data(st::byte_tokens(st::generate_corpus(30000)), 5);
  ledger.reset_peaks();
  run.step(data.next_batch(global_batch, deeper.seq));
  CHECK(ledger.current(mc::gradients) == 4 * owned);
  // During backward: plus the bucket being written, two in flight, and the tied embedding's
  // (written first by the head, last by the embedding).
  const std::size_t bound = 4 * (owned + largest_buckets(dp.layout(), 4));
  if (world.rank() == 0)
    MESSAGE("ZeRO-2 dp=" << n << ", Ψ=" << psi << ", " << dp.layout().buckets().size() << " buckets: gradient bytes "
                         << 4 * owned << " between steps, peak " << ledger.peak(mc::gradients)
                         << " (a full buffer: " << 4 * psi << "; bound " << bound << ")");
  CHECK(ledger.peak(mc::gradients) <= bound);
  if (n > 1) CHECK(ledger.peak(mc::gradients) < 4 * psi);
}

TEST_CASE("ZeRO-3 holds (4Ψ + 4Ψ + 8Ψ)/N between steps, plus the gathered buckets in flight during a step") {
  auto& world = strata_test::world().comm();
  const int n = world.size();
  using mc = st::memory_category;
  gpt2_run<dp_policy<st::fp32>> run(world, deeper, dp_options(3, 4096));
  auto& ledger = run.ledger();
  auto& dp = run.synchronizer();
  const auto psi = std::size_t(run.model().parameters().size());
  const auto owned = std::size_t(dp.optimizer_elements());
  auto model_state = [&] {
    return ledger.current(mc::parameters) + ledger.current(mc::gradients) + ledger.current(mc::optimizer_state);
  };
  CHECK(model_state() == 16 * owned);
  st::token_stream data(st::byte_tokens(st::generate_corpus(30000)), 5);
  ledger.reset_peaks();
  run.step(data.next_batch(global_batch, deeper.seq));
  CHECK(model_state() == 16 * owned);
  // Resident during a pass: three buckets plus the tied table's.
  const std::size_t bound = 4 * (owned + largest_buckets(dp.layout(), 4));
  if (world.rank() == 0)
    MESSAGE("ZeRO-3 dp=" << n << ", Ψ=" << psi << ": model state " << model_state()
                         << " bytes between steps (16Ψ/N = " << 16 * psi / std::size_t(n) << "), parameter peak "
                         << ledger.peak(mc::parameters) << " (bound " << bound << ", full " << 4 * psi << ")");
  CHECK(ledger.peak(mc::parameters) <= bound);
  if (n > 1) CHECK(ledger.peak(mc::parameters) < 4 * psi);
  // Most buckets were already being gathered (prefetched) when a layer asked for them.
  const auto buckets = long(dp.layout().buckets().size());
  if (world.rank() == 0)
    MESSAGE("ZeRO-3: " << dp.prefetch_hits() << " of " << 2 * buckets << " gathers in the step were prefetched");
  CHECK(dp.prefetch_hits() >= buckets);  // all but the first of each pass (and the tied table's)
}

TEST_CASE("bytes communicated per rank per step: 2Ψ(N-1)/N elements for ZeRO 0-2, 3Ψ(N-1)/N for ZeRO-3") {
  auto& world = strata_test::world().comm();
  const int n = world.size(), rank = world.rank();
  for (int zero : {0, 1, 2, 3}) {
    gpt2_run<dp_policy<st::fp32>> run(world, tiny, dp_options(zero, 1000));
    auto& dp = run.synchronizer();
    auto& group = run.mesh().dp();  // every rank of the launch
    st::token_stream data(st::byte_tokens(st::generate_corpus(30000)), 5);
    group.reset_counters();
    run.step(data.next_batch(global_batch, tiny.seq));
    // The analytic volume of the gradient reduction, bucket by bucket, plus the scalar all-reduces
    // of the mean loss (and, under ZeRO 1 and 2, of the squared gradient norm).
    std::uint64_t expected = 0;
    for (const auto& b : dp.layout().buckets()) {
      const auto bytes = std::uint64_t(b.range.size()) * 4, own = std::uint64_t(b.counts[std::size_t(rank)]) * 4;
      if (zero == 0) expected += st::volume::all_reduce(std::uint64_t(b.range.size()), 4, n, rank).sent;
      else expected += st::volume::reduce_scatter(bytes, own, n).sent + st::volume::all_gather(bytes, own, n).sent;
      if (zero == 3) expected += st::volume::all_gather(bytes, own, n).sent;  // gathered in forward and backward
    }
    const std::uint64_t scalars = st::volume::all_reduce(1, 8, n, rank).sent * (zero == 0 ? 1 : 2);
    const auto& c = group.counters();
    const std::uint64_t sent = c.total().bytes_sent;
    CAPTURE(zero);
    CHECK(sent == expected + scalars);
    // And that is 2Ψ(N-1)/N elements up to each bucket's uneven split (< 2 elements per bucket).
    const double psi = double(run.model().parameters().size());
    const double analytic = (zero == 3 ? 3.0 : 2.0) * psi * double(n - 1) / double(n) * 4.0;
    CHECK(std::abs(double(expected) - analytic) <= 12.0 * double(dp.layout().buckets().size()));
    if (rank == 0)
      MESSAGE("zero=" << zero << " dp=" << n << ": " << expected
                      << " bytes of gradients/weights sent per rank, analytic " << (zero == 3 ? 3 : 2)
                      << "Ψ(N-1)/N·4 = " << analytic);
  }
}

TEST_CASE("a global batch that does not divide over the ranks is refused with the numbers") {
  auto& world = strata_test::world().comm();
  if (world.size() == 1) return;
  st::memory_ledger ledger;
  gpt2_net<P32> model(ledger, tiny, st::seed{11});
  st::data_parallel<P32, st::mpi_communicator> dp(model.parameters(), world, {});
  const std::int64_t bad = world.size() + 1;
  const std::string expected =
      "global batch " + std::to_string(bad) + " does not divide over dp = " + std::to_string(world.size()) + " ranks";
  CHECK_THROWS_WITH_AS(dp.local_rows(bad), doctest::Contains(expected.c_str()), st::error);
}

TEST_CASE("bucket reductions start during backward, as each bucket's gradients become final") {
  auto& world = strata_test::world().comm();
  for (int zero : {0, 1, 2}) {
    gpt2_run<dp_policy<st::fp32>> run(world, tiny, dp_options(zero, 1000));
    auto& dp = run.synchronizer();
    st::token_stream data(st::byte_tokens(st::generate_corpus(30000)), 5);
    run.step(data.next_batch(global_batch, tiny.seq));
    const int buckets = int(dp.layout().buckets().size());
    REQUIRE(buckets >= 4);
    // Every bucket but the one holding the tied embedding (final only after the embedding's
    // backward, the very last) is posted before backward returns.
    CAPTURE(zero);
    CHECK(dp.buckets_posted_during_backward() >= buckets - 1);
    CHECK(dp.hidden_share() >= 0.0);
    CHECK(dp.hidden_share() <= 1.0);
  }
}

TEST_CASE("the ZeRO stage comes from the policy's data<N, zero<S>> unless the options name one") {
  auto& world = strata_test::world().comm();
  using P3 = st::policy<st::host, st::parallel<st::data<st::dynamic, st::zero<3>>>, st::fp32>;
  st::memory_ledger ledger;
  gpt2_net<P3> model(ledger, tiny, st::seed{11});
  st::data_parallel<P3, st::mpi_communicator> from_policy(model.parameters(), world, {});
  CHECK(from_policy.zero_stage() == 3);
  st::memory_ledger ledger2;
  gpt2_net<P3> model2(ledger2, tiny, st::seed{11});
  st::data_parallel<P3, st::mpi_communicator> overridden(model2.parameters(), world, {.zero_stage = 1});
  CHECK(overridden.zero_stage() == 1);
  // Assembled: the policy's stage is a compile-time constant; a launch that names another stops
  // every rank at start-up, naming both.
  gpt2_run<P3> assembled(world, tiny);
  CHECK(assembled.synchronizer().zero_stage() == 3);
  CHECK_THROWS_WITH_AS(gpt2_run<P3>(world, tiny, {.layout = {.zero_stage = 1}}),
                       "the layout fixes zero=3 but zero=1 was given at launch", st::error);
}

TEST_CASE("an optimizer built from the model, paired with a sharding synchronizer, is refused naming both") {
  auto& world = strata_test::world().comm();
  for (int zero : {1, 2, 3}) {
    st::memory_ledger ledger;
    gpt2_net<P32> model(ledger, tiny, st::seed{11});
    st::data_parallel<P32, st::mpi_communicator> dp(model.parameters(), world, {.zero_stage = zero});
    st::adamw<P32> whole(model, {.lr = 3e-3});  // every parameter: wrong for a ZeRO shard
    CAPTURE(zero);
    if (world.size() > 1 || zero == 3) {
      const std::string expected = "but the synchronizer, data_parallel ZeRO-" + std::to_string(zero) +
                                   " over dp=" + std::to_string(world.size());
      CHECK_THROWS_WITH_AS(st::trainer(model, whole, options(), dp), doctest::Contains(expected.c_str()), st::error);
    }
    // Built from the synchronizer it is right.
    st::adamw<P32> sharded(dp, {.lr = 3e-3});
    st::trainer train(model, sharded, options(), dp);
    st::token_stream data(st::byte_tokens(st::generate_corpus(30000)), 5);
    CHECK(std::isfinite(train.step(data.next_batch(global_batch, tiny.seq)).loss));
  }
  // An optimizer of another model is refused too.
  st::memory_ledger ledger;
  gpt2_net<P32> a(ledger, tiny, st::seed{1}), b(ledger, tiny, st::seed{2});
  st::adamw<P32> opt_b(b, {});
  CHECK_THROWS_WITH_AS(st::trainer(a, opt_b, options()),
                       "trainer: the optimizer was built for another model's parameters", st::error);
}
