// The example Llama (strata/models/llama.hpp) under every layout, against its serial run, under mpiexec:
//   2 ranks: dp 2 with ZeRO 0-3; tp 2 with and without sequence parallelism; pp 2 under 1F1B and
//            interleaved 1F1B;
//   2 ranks also: a checkpoint saved by a run in a memory space that is not host memory resumes in
//            host memory bit for bit;
//   4 ranks: tp 4 with and without sequence parallelism, 2 key/value heads (each on 2 ranks), and
//            its checkpoint resumed under dp 2 x tp 2;
//   8 ranks: dp 2 x tp 2 (+ SP) x pp 2 with ZeRO-1;
// each within 1e-5 (fp32, 5 steps: per-step losses and the gathered weights). On 2 and 4 ranks, a
// block's communication under tensor parallelism with grouped-query attention is counted and
// equals multi-head attention's: 2 all-reduces of b·s·h forward and 2 backward (under sequence
// parallelism the same volume as gathers and reduce-scatters). The activations a block holds
// equal its cost() formula, grow linearly with the sequence (no s² term) and hold no repeated
// K/V; the plan of a 3-D layout equals the allocator. Every layout also runs in a memory space that
// is not host memory (tests/unit/counting_space.hpp): bit for bit, with only tokens, targets and
// losses crossing it.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "../mpi/layout_equivalence.hpp"
#include "../mpi/counting_space_run.hpp"
#include "strata/models/llama.hpp"

namespace st = strata;

namespace {

using serial_policy = st::policy<st::host, st::serial, st::fp32>;
using strata_test::launch_policy;

// 8 query heads sharing 2 key/value heads; head size 8, rotary; 4 blocks (pp 2 x 2 chunks).
const strata::models::llama::dims shape{
    .vocab = 61, .seq = 8, .layers = 4, .heads = 8, .d_model = 64, .kv_heads = 2, .ffn = 96};
// lr 5e-4 as tests/custom, whose comment explains why its AdamW eps is 1e-6 (here 1e-8 holds).
const strata_test::equivalence_setup setup{.lr = 5e-4, .steps = 5, .global_batch = 8};
strata_test::losses_and_weights serial_run() {
  return strata_test::serial_run<strata::models::llama::model<serial_policy>>(shape, setup);
}

// A layout and the world size it runs on.
struct sized_case {
  int world;
  strata_test::layout_case layout;
};
const sized_case cases[] = {
    {2, {"dp2, ZeRO-0", 2, 1, 1, 0, 0, 1, 1, "1f1b"}},
    {2, {"dp2, ZeRO-1", 2, 1, 1, 1, 0, 1, 1, "1f1b"}},
    {2, {"dp2, ZeRO-2", 2, 1, 1, 2, 0, 1, 1, "1f1b"}},
    {2, {"dp2, ZeRO-3", 2, 1, 1, 3, 0, 1, 1, "1f1b"}},
    {2, {"tp2", 1, 2, 1, 0, 0, 1, 1, "1f1b"}},
    {2, {"tp2 + SP", 1, 2, 1, 0, 1, 1, 1, "1f1b"}},
    {2, {"pp2, 1F1B", 1, 1, 2, 0, 0, 4, 1, "1f1b"}},
    {2, {"pp2, interleaved V=2", 1, 1, 2, 0, 0, 4, 2, "interleaved"}},
    {4, {"tp4 (2 kv heads: each on 2 ranks)", 1, 4, 1, 0, 0, 1, 1, "1f1b"}},
    {4, {"tp4 + SP (2 kv heads: each on 2 ranks)", 1, 4, 1, 0, 1, 1, 1, "1f1b"}},
    {8, {"dp2 x tp2+SP x pp2, ZeRO-1, 1F1B", 2, 2, 2, 1, 1, 2, 1, "1f1b"}},
};
const strata_test::layout_case& tp4 = cases[8].layout;
const strata_test::layout_case& three_d = cases[10].layout;

bool lead() { return strata_test::world().rank() == 0; }

}  // namespace

TEST_CASE("the Llama example trains under every layout as it does serially") {
  const int world = strata_test::world().size();
  const auto ref = serial_run();
  int ran = 0;
  for (const auto& [size, c] : cases) {
    if (size != world) continue;
    ++ran;
    CAPTURE(std::string(c.name));
    st::training<strata::models::llama::model<launch_policy<st::fp32>>> run(strata_test::world().comm(), shape,
                                                                            strata_test::launch(c, setup));
    const auto got = strata_test::train_steps(run, shape, setup);
    strata_test::check_run_matches(c.name, got, ref);
  }
  CHECK(ran > 0);
}

TEST_CASE(
    "every layout in a memory space that is not host memory: bit for bit, tokens in and losses and step states out "
    "only") {
  const int world = strata_test::world().size();
  for (const auto& [size, c] : cases) {
    if (size != world) continue;
    CAPTURE(std::string(c.name));
    const auto host = [&] {
      st::training<strata::models::llama::model<launch_policy<st::fp32>>> run(strata_test::world().comm(), shape,
                                                                              strata_test::launch(c, setup));
      return strata_test::train_steps(run, shape, setup);
    }();
    const auto other = strata_test::run_in_counting_space<strata::models::llama::model<launch_policy<st::fp32>>>(
        strata_test::world().comm(), shape, strata_test::launch(c, setup), setup.steps, setup.global_batch,
        strata_test::folded_corpus(shape.vocab));
    CHECK(other.losses == host.losses);  // bit for bit
    CHECK(other.weights == host.weights);
    strata_test::check_only_batches_cross(other, setup.steps);
  }
}

TEST_CASE("a checkpoint saved from a memory space that is not host memory resumes in host memory bit for bit") {
  if (strata_test::world().size() != 2) return;
  const strata_test::layout_case& tp2_sp = cases[5].layout;
  using M = strata::models::llama::model<launch_policy<st::fp32>>;
  const auto uninterrupted = [&] {
    st::training<M> run(strata_test::world().comm(), shape, strata_test::launch(tp2_sp, setup));
    return strata_test::train_steps(run, shape, setup);
  }();
  const std::string dir = (std::filesystem::current_path() / "llama_space_checkpoints").string();
  if (lead()) std::filesystem::remove_all(dir);
  strata_test::world().comm().barrier();
  constexpr int saved_at = 3;
  {
    auto o = strata_test::launch(tp2_sp, setup);
    o.memory = &strata_test::counting_space();
    st::training<M> a(strata_test::world().comm(), shape, std::move(o));
    auto ckpt = a.make_checkpointer({dir, 0});
    auto data = strata_test::folded_corpus(shape.vocab);
    for (int s = 0; s < saved_at; ++s) a.step(data.next_batch(setup.global_batch, shape.seq));
    a.save(ckpt, data.position());
  }
  st::training<M> b(strata_test::world().comm(), shape, strata_test::launch(tp2_sp, setup));
  auto ckpt = b.make_checkpointer({dir, 0});
  const auto loaded = b.resume(ckpt);
  REQUIRE(loaded.has_value());
  auto data = strata_test::folded_corpus(shape.vocab);
  data.seek(loaded->progress.data_position);
  std::vector<double> after, expected(uninterrupted.losses.begin() + saved_at, uninterrupted.losses.end());
  for (int s = saved_at; s < setup.steps; ++s)
    after.push_back(b.step(data.next_batch(setup.global_batch, shape.seq)).loss);
  CHECK(after == expected);  // bit for bit
  CHECK(b.serial_weights() == uninterrupted.weights);
}

TEST_CASE("a checkpoint saved with key/value heads shared by ranks resumes under another layout") {
  if (strata_test::world().size() != 4) return;
  const auto ref = serial_run();
  const std::string dir = (std::filesystem::current_path() / "llama_checkpoints").string();
  if (lead()) std::filesystem::remove_all(dir);
  strata_test::world().comm().barrier();
  constexpr int saved_at = 3;
  {
    st::training<strata::models::llama::model<launch_policy<st::fp32>>> a(strata_test::world().comm(), shape,
                                                                          strata_test::launch(tp4, setup));
    auto ckpt = a.make_checkpointer({dir, 0});
    auto data = strata_test::folded_corpus(shape.vocab);
    for (int s = 0; s < saved_at; ++s) a.step(data.next_batch(setup.global_batch, shape.seq));
    a.save(ckpt, data.position());
  }
  const strata_test::layout_case dp2_tp2{"dp2 x tp2, ZeRO-1", 2, 2, 1, 1, 0, 1, 1, "1f1b"};
  st::training<strata::models::llama::model<launch_policy<st::fp32>>> b(strata_test::world().comm(), shape,
                                                                        strata_test::launch(dp2_tp2, setup));
  auto ckpt = b.make_checkpointer({dir, 0});
  const auto loaded = b.resume(ckpt);
  REQUIRE(loaded.has_value());
  CHECK(loaded->progress.step == saved_at);
  auto data = strata_test::folded_corpus(shape.vocab);
  data.seek(loaded->progress.data_position);
  std::vector<double> after, expected(ref.losses.begin() + saved_at, ref.losses.end());
  for (int s = saved_at; s < setup.steps; ++s)
    after.push_back(b.step(data.next_batch(setup.global_batch, shape.seq)).loss);
  const double lerr = strata_test::elementwise_relative_error(after, expected);
  const double werr = strata_test::relative_error(b.serial_weights(), ref.weights);
  if (lead())
    MESSAGE("saved under tp4 (each kv head on 2 ranks) at step 3, resumed under "
            << std::string(dp2_tp2.name) << ": loss rel. error " << lerr << ", weight rel. error " << werr);
  CHECK(lerr <= 1e-5);
  CHECK(werr <= 1e-5);
}

TEST_CASE("a 3-D layout's plan, from the model's own costs, equals what the allocator holds") {
  if (strata_test::world().size() != 8) return;
  using M = strata::models::llama::model<launch_policy<st::mixed<st::bf16, float>>>;
  const auto& c = three_d;
  st::training<M> run(strata_test::world().comm(), shape,
                      strata_test::launch(c, setup, std::int64_t(1) << 30));  // one bucket: exact ZeRO pieces
  strata_test::check_plan_equals_allocator(run, shape, c, setup);
}

namespace {

using P32 = st::policy<st::host, st::serial, st::fp32>;
using block_t = st::llama_block<P32>;

// One Llama block over `tp` as its tensor-parallel group, on a [b, s, h] input.
struct block_bench {
  static constexpr std::int64_t b = 2, h = 32, heads = 4;
  std::int64_t s;
  st::memory_ledger ledger;
  st::model_context<P32> ctx;
  block_t block;
  st::buffer<float> x;

  block_bench(st::mpi_communicator& tp, bool sp, std::int64_t kv_heads, std::int64_t seq = 8)
      : s(seq),
        ctx(ledger, st::seed{3}, st::tensor_parallel(st::group_ref(tp), sp)),
        block(st::module_scope<P32>(ctx, "h.0"), config(kv_heads)),
        x(ledger, st::memory_category::workspace, std::size_t(b * local_seq(tp.size(), sp) * h)) {
    ctx.params().materialize();
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(strata_test::raw_value(9, tp.rank(), i));
  }
  static block_t::config config(std::int64_t kv_heads) {
    return {.channels = h, .heads = heads, .hidden = 96, .kv_heads = kv_heads, .rope_theta = 10000, .bias = false};
  }
  std::int64_t local_seq(int t, bool sp) const { return sp ? s / t : s; }
  st::tensor_view<const float> input(int t, bool sp) { return {x.data(), {b, local_seq(t, sp), h}}; }
};

st::comm_volume times(st::comm_volume v, std::uint64_t k) { return {v.sent * k, v.received * k}; }
st::comm_volume of(const st::op_counts& c) { return {c.bytes_sent, c.bytes_received}; }

// Forward and backward of one block; the counters of each.
struct counted {
  st::op_counts forward_all_reduce, backward_all_reduce, forward_total, backward_total;
  st::op_counts forward_gather, forward_scatter, backward_gather, backward_scatter;
};
counted count_block(st::mpi_communicator& tp, bool sp, std::int64_t kv_heads) {
  using st::op_kind;
  const int t = tp.size();
  block_bench bb(tp, sp, kv_heads);
  counted out;
  tp.reset_counters();
  auto y = bb.block.forward(bb.input(t, sp));
  const auto& c = tp.counters();
  out.forward_all_reduce = c[op_kind::all_reduce];
  out.forward_gather = c[op_kind::all_gather];
  out.forward_scatter = c[op_kind::reduce_scatter];
  out.forward_total = c.total();
  tp.reset_counters();
  st::buffer<float> dy(bb.ledger, st::memory_category::activations, std::size_t(y.numel()));
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = float(strata_test::raw_value(10, tp.rank(), i));
  auto dx = bb.block.backward(dy);
  out.backward_all_reduce = c[op_kind::all_reduce];
  out.backward_gather = c[op_kind::all_gather];
  out.backward_scatter = c[op_kind::reduce_scatter];
  out.backward_total = c.total();
  return out;
}

}  // namespace

TEST_CASE("a Llama block with grouped-query attention communicates exactly as with multi-head attention") {
  auto& world = strata_test::world().comm();
  const int t = world.size();
  if (t != 2 && t != 4) return;
  auto tp = world.split(0, world.rank(), "tp");
  const int r = tp.rank();
  const std::uint64_t bsh = block_bench::b * 8 * block_bench::h, bytes = bsh * sizeof(float);
  using st::op_kind;
  const auto all_reduces = times(st::volume::all_reduce(bsh, sizeof(float), t, r), 2);

  SUBCASE("tensor parallel: 2 all-reduces of b·s·h forward, 2 backward") {
    const auto gqa = count_block(tp, false, t),
               mha = count_block(tp, false, block_bench::heads);  // kv_heads = t: one per rank
    for (const auto* c : {&gqa, &mha}) {
      CHECK(c->forward_all_reduce.calls == 2u);
      CHECK(of(c->forward_all_reduce) == all_reduces);
      CHECK(of(c->forward_total) == all_reduces);
      CHECK(c->backward_all_reduce.calls == 2u);
      CHECK(of(c->backward_total) == all_reduces);
    }
    if (r == 0)
      MESSAGE("tp=" << t << " Llama block (GQA " << t << " kv heads): forward " << gqa.forward_total.bytes_sent
                    << " B sent per rank, backward " << gqa.backward_total.bytes_sent << "; MHA the same");
  }
  SUBCASE("sequence parallel: the same volume as gathers and reduce-scatters") {
    const auto gqa = count_block(tp, true, t), mha = count_block(tp, true, block_bench::heads);
    const std::uint64_t own = bytes / std::uint64_t(t);
    const auto gather = st::volume::all_gather(bytes, own, t), scatter = st::volume::reduce_scatter(bytes, own, t);
    for (const auto* c : {&gqa, &mha}) {
      CHECK(c->forward_all_reduce.calls == 0u);
      CHECK(of(c->forward_gather) == times(gather, 2));
      CHECK(of(c->forward_scatter) == times(scatter, 2));
      CHECK(of(c->forward_total) == all_reduces);
      // Backward: the conjugates, the column-parallel layers' input gathered again (2 more
      // gathers), and the two RMSNorm gains' partial gradients summed (2 all-reduces of h).
      CHECK(of(c->backward_scatter) == times(scatter, 2));
      CHECK(of(c->backward_gather) == times(gather, 4));
      CHECK(c->backward_all_reduce.calls == 2u);
      CHECK(of(c->backward_all_reduce) == times(st::volume::all_reduce(block_bench::h, sizeof(float), t, r), 2));
    }
    CHECK(of(gqa.backward_total) == of(mha.backward_total));
  }
}

TEST_CASE("a Llama block's activations equal its formula: linear in the sequence, no repeated K/V") {
  auto& world = strata_test::world().comm();
  if (world.size() != 2) return;
  auto one = world.split(world.rank(), 0, "alone");  // each rank on its own: the serial block
  const auto held = [&](std::int64_t kv_heads, std::int64_t seq) {
    block_bench bb(one, false, kv_heads, seq);
    const auto before = bb.ledger.current(st::memory_category::activations);
    bb.block.forward(bb.input(1, false));
    const auto bytes = std::int64_t(bb.ledger.current(st::memory_category::activations) - before);
    CHECK(bytes ==
          block_t::cost(block_bench::config(kv_heads), {.batch = block_bench::b, .seq = seq}).activation_bytes);
    return bytes;
  };
  const std::int64_t gqa8 = held(1, 8), gqa16 = held(1, 16), gqa32 = held(1, 32), mha8 = held(4, 8);
  CHECK(gqa16 == 2 * gqa8);  // no term in s²: one logsumexp per query row
  CHECK(gqa32 == 4 * gqa8);
  // Multi-head keeps 3 more key/value heads' k and v (and nothing else): K/V are not repeated.
  const std::int64_t head_dim = block_bench::h / block_bench::heads;
  CHECK(mha8 - gqa8 == block_bench::b * 8 * 2 * 3 * head_dim * std::int64_t(sizeof(float)));
  if (strata_test::world().rank() == 0)
    MESSAGE("Llama block activations (b 2, h 32, 4 heads): GQA 1 kv head "
            << gqa8 << " B at s 8, " << gqa16 << " at 16, " << gqa32 << " at 32; MHA " << mha8 << " at 8");
}
