// tests/mpi/counting_space_run.hpp - an assembled run (st::training) in the counting memory space
// (tests/unit/counting_space.hpp: host memory that claims not to be, and counts what crosses it),
// as a GPU's memory would hold it, and the only crossings a step may make: per micro-batch, the
// tokens up on the stage with the embedding, the targets up and the loss down on the stage with
// the head; per step, on every rank, one read of the trainer's step state after the update (its
// norm and decision, never read before it). The equivalence suites (tests/dp, tp, pp, llama) run their layouts in it
// and compare with the same layouts in host memory, bit for bit.
#pragma once
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include <strata/strata.hpp>

#include "../unit/counting_space.hpp"

namespace strata_test {

struct counting_space_result {
  std::vector<double> losses, weights;
  long uploads = 0, downloads = 0;  // during the steps (not the start-up's initial values)
  long microbatches = 0;            // per step, on this rank
  bool first_stage = true, last_stage = true;
};

// `steps` steps of Model under options `o` (its memory set to the counting space) on `data`.
template <class Model>
counting_space_result run_in_counting_space(strata::mpi_communicator& world, const typename Model::config& shape,
                                            strata::training_options o, int steps, std::int64_t batch,
                                            strata::token_stream data) {
  o.memory = &counting_space();
  const std::int64_t micro_batch = o.trainer.micro_batch;
  strata::training<Model> run(world, shape, std::move(o));
  counting_space_result r;
  const long uploads = counts.uploads, downloads = counts.downloads;
  for (int s = 0; s < steps; ++s) r.losses.push_back(run.step(data.next_batch(batch, shape.seq)).loss);
  r.uploads = counts.uploads - uploads;
  r.downloads = counts.downloads - downloads;
  r.weights = run.serial_weights();
  const auto& l = run.layout();
  r.microbatches = run.model().pipelined() ? run.model().microbatches()
                   : micro_batch > 0       ? long(batch / l.dp / micro_batch)
                                           : 1;
  r.first_stage = run.mesh().position().pp_rank == 0;
  r.last_stage = run.mesh().position().pp_rank == l.pp - 1;
  return r;
}

// Nothing but the batches in, the losses and each step's state out crossed during the steps.
inline void check_only_batches_cross(const counting_space_result& r, int steps) {
  const long per_step = r.microbatches * steps;
  CHECK(r.uploads == per_step * ((r.first_stage ? 1 : 0) + (r.last_stage ? 1 : 0)));
  CHECK(r.downloads == per_step * (r.last_stage ? 1 : 0) + steps);
}

}  // namespace strata_test
