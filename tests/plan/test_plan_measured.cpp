// The plan against what strata's allocator really holds, under mpiexec on 4 ranks: for nine
// layouts of the example GPT-2 (data parallel with ZeRO 0-3, tensor parallel with sequence
// parallelism and recomputation, pipelines with GPipe, 1F1B and interleaved schedules), each
// assembled by strata::training and planned from the model's own declaration, the busiest
// rank's model-state bytes equal the plan exactly and its activation bytes are within 10% (in
// practice equal).
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
#include "strata/models/gpt2.hpp"

namespace st = strata;

namespace {

using layout =
    st::parallel<st::data<st::dynamic, st::zero<st::dynamic>>, st::tensor<st::dynamic, st::dynamic_sequence_parallel>,
                 st::pipeline<st::dynamic, st::dynamic_schedule, st::dynamic, st::dynamic>>;
using PBF16 = st::policy<st::host, layout, st::mixed<st::bf16, float>>;
using model_decl = strata::models::gpt2::model<PBF16>;

// Small enough for 4 ranks on 2 cores; every split below leaves each rank a Ψ its data-parallel
// group divides evenly (one bucket), so the ZeRO pieces are exact.
const strata::models::gpt2::dims shape{.vocab = 64, .seq = 8, .layers = 4, .heads = 4, .d_model = 32};

struct case_t {
  const char* name;
  int dp, tp, pp, zero;
  bool sp = false;
  st::recompute_mode recompute = st::recompute_mode::none;
  st::pipeline_schedule_kind schedule = st::pipeline_schedule_kind::one_f_one_b;
  int chunks = 1, microbatches = 1;
};

strata_test::held_bytes run(const case_t& c, std::int64_t batch) {
  st::training_options o{.layout = {.dp = c.dp,
                                    .tp = c.tp,
                                    .pp = c.pp,
                                    .microbatches = c.microbatches,
                                    .zero_stage = c.zero,
                                    .sequence_parallel = c.sp ? 1 : 0,
                                    .virtual_chunks = c.chunks,
                                    .schedule = std::string(st::schedule_label(c.schedule))},
                         .recompute = c.recompute,
                         .seed = st::seed{1},
                         .optimizer = {.lr = 1e-3},
                         .bucket_elems = 1 << 30};
  o.trainer.schedule = {1e-3, 1e-4, 1, 2};
  o.trainer.micro_batch = c.pp > 1 || c.chunks > 1 ? 0 : batch / c.dp / c.microbatches;
  st::training<model_decl> run(strata_test::world().comm(), shape, o);
  auto tokens = st::byte_tokens(st::generate_corpus(4000));
  for (auto& t : tokens) t = static_cast<std::uint16_t>(t % 64);
  st::token_stream data(std::move(tokens), 3);
  return strata_test::step_and_measure(run, data.next_batch(batch, shape.seq));
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
      {"pp2 x dp2 1F1B M=4, ZeRO-1", 2, 1, 2, 1, false, st::recompute_mode::none, pipeline_schedule_kind::one_f_one_b,
       1, 4},
      {"pp4 GPipe M=4", 1, 1, 4, 0, false, st::recompute_mode::none, pipeline_schedule_kind::gpipe, 1, 4},
      {"pp2 x tp2+sp interleaved V=2 M=4", 1, 2, 2, 0, true, st::recompute_mode::none,
       pipeline_schedule_kind::interleaved, 2, 4},
  };
  const std::int64_t batch = 8;
  for (const auto& c : cases) {
    CAPTURE(std::string(c.name));
    const auto m = run(c, batch);
    st::plan_setup setup;
    setup.layout.dp = c.dp;
    setup.layout.tp = c.tp;
    setup.layout.pp = c.pp;
    setup.layout.zero_stage = c.zero;
    setup.layout.sequence_parallel = c.sp;
    setup.layout.virtual_chunks = c.chunks;
    setup.recompute = c.recompute;
    setup.schedule = c.schedule;
    const auto p = st::plan_model<model_decl>(shape, {.micro = batch / c.dp / c.microbatches, .global = batch}, setup);
    using strata_test::busiest;
    CHECK(busiest(m.params) == p.params_bytes);
    CHECK(busiest(m.grads) == p.grads_bytes);
    CHECK(busiest(m.master) == p.master_bytes);
    CHECK(busiest(m.optimizer) == p.optimizer_bytes);
    CHECK(busiest(m.comm) == p.comm_buffer_bytes);
    const std::int64_t act = busiest(m.activations);
    CHECK(std::abs(double(act) - double(p.activation_bytes)) <= 0.10 * double(p.activation_bytes));
    const std::int64_t state = busiest(m.model_state());  // collective: every rank
    if (strata_test::world().rank() == 0)
      MESSAGE(std::string(c.name) << ": model state " << state << " B (plan " << p.model_state_bytes()
                                  << "), activations " << act << " B (plan " << p.activation_bytes << ")");
  }
}
