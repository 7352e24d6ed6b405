// tests/mpi/layout_equivalence.hpp - what the declared-model suites (tests/custom, tests/llama)
// share: a model trained serially on one rank, and the same model under a layout over the world,
// on the same corpus, optimizer and schedule, so that their per-step losses and gathered weights
// can be compared.
//
// The serial run accumulates micro-batches of 2 sequences; a layout without a pipeline gives each
// data-parallel rank 2 micro-batches, a pipeline its layout's count: every one sums the gradients
// of the same global batch.
#pragma once
#include <cstdint>
#include <vector>

#include <strata/strata.hpp>

#include "mpi_test.hpp"

namespace strata_test {

// Everything given at launch: one binary, every layout.
using any_layout = strata::parallel<strata::data<strata::dynamic, strata::zero<strata::dynamic>>,
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
  strata::training_options o{.layout = {.dp = c.dp, .tp = c.tp, .pp = c.pp, .microbatches = c.microbatches,
                                        .zero_stage = c.zero, .sequence_parallel = c.sp, .virtual_chunks = c.chunks,
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

}  // namespace strata_test
