// tests/mpi/layout_equivalence.hpp - what the declared-model suites (tests/custom, tests/llama)
// share: a model trained serially on one rank, and the same model under a layout over the world,
// on the same corpus, optimizer and schedule, so that their per-step losses and gathered weights
// can be compared.
//
// The serial run accumulates micro-batches of 2 sequences; a layout without a pipeline gives each
// data-parallel rank 2 micro-batches, a pipeline its layout's count: every one sums the gradients
// of the same global batch.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "mpi_test.hpp"

namespace strata_test {

// Everything given at launch: one binary, every layout.
using any_layout =
    strata::parallel<strata::data<strata::dynamic, strata::zero<strata::dynamic>>,
                     strata::tensor<strata::dynamic, strata::dynamic_sequence_parallel>,
                     strata::pipeline<strata::dynamic, strata::dynamic_schedule, strata::dynamic, strata::dynamic>>;
template <class Precision>
using launch_policy = strata::policy<strata::host, any_layout, Precision>;

struct equivalence_setup {
  double lr = 5e-4, adam_eps = 1e-8;
  int steps = 5;
  std::int64_t global_batch = 8;
  std::uint64_t seed = 7;
};

struct layout_case {
  const char* name;
  int dp, tp, pp, zero, sp, microbatches, chunks;
  const char* schedule;
};

struct losses_and_weights {
  std::vector<double> losses, weights;
};

template <class Model>
losses_and_weights serial_run(const typename Model::config& shape, const equivalence_setup& e) {
  using P = typename Model::policy;
  strata::memory_ledger ledger;
  strata::sequential_model<Model> model(ledger, shape, strata::seed{e.seed});
  strata::adamw<P> opt(model, {.lr = e.lr, .eps = e.adam_eps});
  auto o = equivalence_options(e.lr, e.steps);
  o.micro_batch = 2;
  strata::trainer train(model, opt, o);
  auto data = folded_corpus(shape.vocab);
  losses_and_weights out;
  for (int s = 0; s < e.steps; ++s) out.losses.push_back(train.step(data.next_batch(e.global_batch, shape.seq)).loss);
  auto& p = model.parameters();
  for (std::int64_t i = 0; i < p.size(); ++i) out.weights.push_back(strata::convert<double>(p.weights_data()[i]));
  return out;
}

// The training options of layout `c` (buckets of `bucket` elements).
inline strata::training_options launch(const layout_case& c, const equivalence_setup& e, std::int64_t bucket = 1000) {
  strata::training_options o{.layout = {.dp = c.dp,
                                        .tp = c.tp,
                                        .pp = c.pp,
                                        .microbatches = c.microbatches,
                                        .zero_stage = c.zero,
                                        .sequence_parallel = c.sp,
                                        .virtual_chunks = c.chunks,
                                        .schedule = c.schedule},
                             .seed = strata::seed{e.seed},
                             .optimizer = {.lr = e.lr, .eps = e.adam_eps},
                             .trainer = equivalence_options(e.lr, e.steps),
                             .bucket_elems = bucket};
  if (c.pp == 1) o.trainer.micro_batch = e.global_batch / c.dp / 2;  // 2 micro-batches per rank, as serially
  return o;
}

// `steps` steps of `run` on the corpus: the losses and the gathered serial weights.
template <class Run>
losses_and_weights train_steps(Run& run, const typename Run::config& shape, const equivalence_setup& e) {
  auto data = folded_corpus(shape.vocab);
  losses_and_weights out;
  for (int s = 0; s < e.steps; ++s) out.losses.push_back(run.step(data.next_batch(e.global_batch, shape.seq)).loss);
  out.weights = run.serial_weights();
  return out;
}

// One step of `run` (built with one bucket, so that ZeRO's pieces are exact) on the corpus, then
// the plan of the layout from the model's own layer costs against what the busiest rank's
// allocator holds: the model state exactly, the activations within 10% (a pipeline's in-flight
// peak is estimated).
template <class Run>
void check_plan_equals_allocator(Run& run, const typename Run::config& shape, const layout_case& c,
                                 const equivalence_setup& e) {
  auto data = folded_corpus(shape.vocab);
  const auto m = step_and_measure(run, data.next_batch(e.global_batch, shape.seq));
  const auto micro = run.model().pipelined() ? e.global_batch / c.dp / c.microbatches : e.global_batch / c.dp / 2;
  const auto plan = run.plan({.micro = micro, .global = e.global_batch});
  CHECK(busiest(m.params) == plan.params_bytes);
  CHECK(busiest(m.grads) == plan.grads_bytes);
  CHECK(busiest(m.master) == plan.master_bytes);
  CHECK(busiest(m.optimizer) == plan.optimizer_bytes);
  CHECK(busiest(m.comm) == plan.comm_buffer_bytes);
  const std::int64_t act = busiest(m.activations), state = busiest(m.model_state());
  CHECK(std::abs(double(act) - double(plan.activation_bytes)) <= 0.10 * double(plan.activation_bytes));
  if (world().rank() == 0)
    MESSAGE(std::string(c.name) << ": model state " << state << " B (plan " << plan.model_state_bytes()
                                << "), activations " << act << " B (plan " << plan.activation_bytes << ")");
}

}  // namespace strata_test
