// The plan against what strata's allocator really holds, under mpiexec on 4 ranks: for nine
// layouts of the example GPT-2 (data parallel with ZeRO 0-3, tensor parallel with sequence
// parallelism and recomputation, pipelines with GPipe, 1F1B and interleaved schedules), the
// busiest rank's model-state bytes equal the plan exactly and its activation bytes are within
// 10% (in practice equal).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include <strata/comm/launch.hpp>
#include <strata/comm/mesh.hpp>
#include <strata/parallel/data_parallel.hpp>
#include <strata/plan/plan.hpp>
#include <strata/strata.hpp>

#include "../mpi/mpi_test.hpp"
#include "gpt2/gpt2.hpp"
#include "gpt2/gpt2_pipeline.hpp"

namespace st = strata;

namespace {

using PBF16 = st::policy<st::host, st::serial, st::mixed<st::bf16, float>>;
using layout = st::parallel<st::data<st::dynamic>, st::tensor<st::dynamic>, st::pipeline<st::dynamic>>;

// Small enough for 4 ranks on 2 cores; every split below leaves each rank a Ψ its data-parallel
// group divides evenly (one bucket), so the ZeRO pieces are exact.
const gpt2::dims shape{.vocab = 64, .seq = 8, .layers = 4, .heads = 4, .d_model = 32};

struct case_t {
  const char* name;
  int dp, tp, pp, zero;
  bool sp = false;
  st::recompute_mode recompute = st::recompute_mode::none;
  st::pipeline_schedule_kind schedule = st::pipeline_schedule_kind::one_f_one_b;
  int chunks = 1, microbatches = 1;
};

struct measured {
  std::int64_t params = 0, grads = 0, master = 0, optimizer = 0, comm = 0, activations = 0;
};

template <class Model>
measured train_one_step(Model& model, st::process_mesh& mesh, st::memory_ledger& ledger, const case_t& c,
                        std::int64_t batch) {
  st::data_parallel<PBF16, st::mpi_communicator> dp(
      model.parameters(), mesh.dp(),
      {.zero_stage = c.zero, .bucket_elems = 1 << 30, .tensor_group = st::group_ref(mesh.tp()),
       .pipeline_group = st::group_ref(mesh.pp())});
  st::adamw<PBF16> opt(model.parameters(), {.lr = 1e-3}, dp.optimizer_segments(), dp.optimizer_elements(),
                       dp.state_weights());
  st::trainer_options o;
  o.schedule = {1e-3, 1e-4, 1, 2};
  o.micro_batch = batch / c.dp / c.microbatches;
  st::trainer train(model, opt, o, dp);
  auto tokens = st::byte_tokens(st::generate_corpus(4000));
  for (auto& t : tokens) t = static_cast<std::uint16_t>(t % 64);
  st::token_stream data(std::move(tokens), 3);
  const std::size_t before = ledger.current(st::memory_category::activations);
  train.step(data.next_batch(batch, shape.seq));
  measured m;
  m.params = std::int64_t(ledger.current(st::memory_category::parameters));
  m.grads = std::int64_t(ledger.current(st::memory_category::gradients));
  m.master = std::int64_t(ledger.current(st::memory_category::master_weights));
  m.optimizer = std::int64_t(ledger.current(st::memory_category::optimizer_state));
  m.comm = std::int64_t(ledger.current(st::memory_category::communication));
  if constexpr (requires { model.last_step(); }) {
    m.activations = std::int64_t(model.last_step().peak_activation_bytes);
  } else {
    // The layers keep their forward buffers between steps: what forward left is still held.
    m.activations = std::int64_t(ledger.current(st::memory_category::activations) - before);
  }
  return m;
}

measured run(const case_t& c, std::int64_t batch) {
  auto& world = strata_test::world().comm();
  st::process_mesh mesh(world, st::resolve_layout<layout>(world.size(), {.dp = c.dp, .tp = c.tp, .pp = c.pp}));
  st::memory_ledger ledger;
  st::tensor_parallel tp(st::group_ref(mesh.tp()), c.sp);
  if (c.pp > 1 || c.chunks > 1) {
    gpt2::pipeline_placement place{{c.schedule, c.pp, c.microbatches, c.chunks}, mesh.position().pp_rank, {}};
    gpt2::staged_model<PBF16> model(ledger, shape, st::seed{1}, tp, c.recompute, place, st::group_ref(mesh.pp()),
                                    mesh.embedding() ? st::group_ref(*mesh.embedding()) : st::group_ref());
    return train_one_step(model, mesh, ledger, c, batch);
  }
  gpt2::model<PBF16> model(ledger, shape, st::seed{1}, tp, c.recompute);
  return train_one_step(model, mesh, ledger, c, batch);
}

std::int64_t busiest(std::int64_t v) {
  double x = double(v);
  strata_test::world().comm().all_reduce(std::span<double>(&x, 1), st::reduce_op::max);
  return std::int64_t(x);
}

}  // namespace

TEST_CASE("the plan equals the allocator's model state, and its activations within 10%, for nine layouts") {
  if (strata_test::world().size() != 4) return;
  using st::pipeline_schedule_kind;
  const case_t cases[] = {
      {"dp4 ZeRO-0", 4, 1, 1, 0},
      {"dp4 ZeRO-1", 4, 1, 1, 1},
      {"dp4 ZeRO-2", 4, 1, 1, 2},
      {"dp4 ZeRO-3", 4, 1, 1, 3},
      {"tp2+sp x dp2 ZeRO-1, selective", 2, 2, 1, 1, true, st::recompute_mode::selective},
      {"tp4 full recompute", 1, 4, 1, 0, false, st::recompute_mode::full},
      {"pp2 x dp2 1F1B M=4, ZeRO-1", 2, 1, 2, 1, false, st::recompute_mode::none, pipeline_schedule_kind::one_f_one_b, 1, 4},
      {"pp4 GPipe M=4", 1, 1, 4, 0, false, st::recompute_mode::none, pipeline_schedule_kind::gpipe, 1, 4},
      {"pp2 x tp2+sp interleaved V=2 M=4", 1, 2, 2, 0, true, st::recompute_mode::none, pipeline_schedule_kind::interleaved,
       2, 4},
  };
  const std::int64_t batch = 8;
  for (const auto& c : cases) {
    CAPTURE(std::string(c.name));
    const measured m = run(c, batch);
    st::plan_setup setup;
    setup.layout.dp = c.dp;
    setup.layout.tp = c.tp;
    setup.layout.pp = c.pp;
    setup.layout.zero_stage = c.zero;
    setup.layout.sequence_parallel = c.sp;
    setup.layout.virtual_chunks = c.chunks;
    setup.recompute = c.recompute;
    setup.schedule = c.schedule;
    const auto p = st::plan_gpt<PBF16::precision>(
        {.vocab = shape.vocab, .seq = shape.seq, .layers = shape.layers, .heads = shape.heads, .hidden = shape.d_model},
        {.micro = batch / c.dp / c.microbatches, .global = batch}, setup);
    CHECK(busiest(m.params) == p.params_bytes);
    CHECK(busiest(m.grads) == p.grads_bytes);
    CHECK(busiest(m.master) == p.master_bytes);
    CHECK(busiest(m.optimizer) == p.optimizer_bytes);
    CHECK(busiest(m.comm) == p.comm_buffer_bytes);
    const std::int64_t act = busiest(m.activations);
    CHECK(std::abs(double(act) - double(p.activation_bytes)) <= 0.10 * double(p.activation_bytes));
    const std::int64_t state = busiest(m.params + m.grads + m.master + m.optimizer);  // collective: every rank
    if (strata_test::world().rank() == 0)
      MESSAGE(std::string(c.name) << ": model state " << state << " B (plan "
                     << p.model_state_bytes() << "), activations " << act << " B (plan " << p.activation_bytes << ")");
  }
}
