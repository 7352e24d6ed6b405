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
                     strata::context<strata::dynamic, strata::dynamic_context_form>,
                     strata::tensor<strata::dynamic, strata::dynamic_sequence_parallel>,
                     strata::pipeline<strata::dynamic, strata::dynamic_schedule, strata::dynamic, strata::dynamic>,
                     strata::expert<strata::dynamic>>;
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
  int cp = 1;                         // context parallelism...
  const char* context_form = "ring";  // ...and its form
  int ep = 1;                         // expert parallelism, inside dp x cp
  strata::recompute_mode recompute = strata::recompute_mode::none;
};

struct losses_and_weights {
  std::vector<double> losses, weights;
  std::vector<double> grad_norms;  // each step's global gradient norm, before clipping
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
  for (int s = 0; s < e.steps; ++s) {
    const strata::step_result r = train.step(data.next_batch(e.global_batch, shape.seq));
    out.losses.push_back(r.loss);
    out.grad_norms.push_back(r.grad_norm);
  }
  auto& p = model.parameters();
  for (std::int64_t i = 0; i < p.size(); ++i) out.weights.push_back(strata::convert<double>(p.weights_data()[i]));
  return out;
}

// The training options of layout `c` (buckets of `bucket` elements).
inline strata::training_options launch(const layout_case& c, const equivalence_setup& e, std::int64_t bucket = 1000) {
  strata::training_options o{.layout = {.dp = c.dp,
                                        .cp = c.cp,
                                        .tp = c.tp,
                                        .pp = c.pp,
                                        .ep = c.ep,
                                        .microbatches = c.microbatches,
                                        .zero_stage = c.zero,
                                        .sequence_parallel = c.sp,
                                        .virtual_chunks = c.chunks,
                                        .context_form = c.context_form,
                                        .schedule = c.schedule},
                             .seed = strata::seed{e.seed},
                             .optimizer = {.lr = e.lr, .eps = e.adam_eps},
                             .trainer = equivalence_options(e.lr, e.steps),
                             .bucket_elems = bucket};
  o.recompute = c.recompute;
  if (c.pp == 1) o.trainer.micro_batch = e.global_batch / c.dp / 2;  // 2 micro-batches per rank, as serially
  return o;
}

// Context parallelism with every other axis on 8 ranks (a sequence of 8 tokens cuts into 2·cp
// chunks at cp 2 and 4): the cases every declared-model suite runs...
inline const layout_case context_layouts[] = {
    {"dp4 x cp2 ring", 4, 1, 1, 0, 0, 1, 1, "1f1b", 2, "ring"},
    {"dp2 x cp4 ring", 2, 1, 1, 0, 0, 1, 1, "1f1b", 4, "ring"},
    {"dp4 x cp2 all-to-all", 4, 1, 1, 0, 0, 1, 1, "1f1b", 2, "all_to_all"},
    {"dp2 x cp2 x tp2+sp ring", 2, 2, 1, 0, 1, 1, 1, "1f1b", 2, "ring"},
    {"dp2 x cp2 x tp2, ZeRO-1", 2, 2, 1, 1, 0, 1, 1, "1f1b", 2, "ring"},
    {"dp2 x cp2 x tp2, ZeRO-3", 2, 2, 1, 3, 0, 1, 1, "1f1b", 2, "ring"},
    {"dp2 x cp2 x pp2, 1F1B", 2, 1, 2, 1, 0, 2, 1, "1f1b", 2, "ring"},
    {"cp2 x tp2+sp x pp2, 1F1B", 1, 2, 2, 0, 1, 2, 1, "1f1b", 2, "ring"},
    // Recomputation: the core again in backward (selective), or the whole block (full).
    {"dp4 x cp2 ring, selective recomputation", 4, 1, 1, 0, 0, 1, 1, "1f1b", 2, "ring", 1,
     strata::recompute_mode::selective},
    {"dp4 x cp2 all-to-all, selective recomputation", 4, 1, 1, 0, 0, 1, 1, "1f1b", 2, "all_to_all", 1,
     strata::recompute_mode::selective},
    {"dp2 x cp2 x pp2 all-to-all, full recomputation", 2, 1, 2, 1, 0, 2, 1, "1f1b", 2, "all_to_all", 1,
     strata::recompute_mode::full},
    {"cp2 x tp2+sp x pp2 ring, full recomputation", 1, 2, 2, 0, 1, 2, 1, "1f1b", 2, "ring", 1,
     strata::recompute_mode::full},
};
// ...and those that split 4 heads (and as many key/value heads) 4 ways by all-to-all.
inline const layout_case context_layouts_four_kv_heads[] = {
    {"dp2 x cp4 all-to-all", 2, 1, 1, 0, 0, 1, 1, "1f1b", 4, "all_to_all"},
    {"dp2 x cp2 x tp2 all-to-all", 2, 2, 1, 0, 0, 1, 1, "1f1b", 2, "all_to_all"},
};

// `steps` steps of `run` on the corpus: the losses and the gathered serial weights.
template <class Run>
losses_and_weights train_steps(Run& run, const typename Run::config& shape, const equivalence_setup& e) {
  auto data = folded_corpus(shape.vocab);
  losses_and_weights out;
  for (int s = 0; s < e.steps; ++s) {
    const strata::step_result r = run.step(data.next_batch(e.global_batch, shape.seq));
    out.losses.push_back(r.loss);
    out.grad_norms.push_back(r.grad_norm);
  }
  out.weights = run.serial_weights();
  return out;
}

// A layout's run against the serial one: per-step losses, gradient norms and the gathered weights
// within 1e-5 (a gradient summed over the wrong group can leave the losses within that and not
// the norms).
inline void check_run_matches(const std::string& what, const losses_and_weights& got, const losses_and_weights& ref) {
  const double lerr = elementwise_relative_error(got.losses, ref.losses);
  const double gerr = elementwise_relative_error(got.grad_norms, ref.grad_norms);
  const double werr = relative_error(got.weights, ref.weights);
  if (world().rank() == 0)
    MESSAGE(what << ": loss rel. error " << lerr << ", gradient norm rel. error " << gerr << ", weight rel. error "
                 << werr);
  CHECK(lerr <= 1e-5);
  CHECK(gerr <= 1e-5);
  CHECK(werr <= 1e-5);
}

// Layout `c` of Model trained against the serial run `ref` (check_run_matches); under context
// parallelism without a pipeline, also the bytes the cp group carried
// against the plan's figure from the layer costs (its busiest rank is every rank).
template <class Model, class Run = strata::training<Model>>
void check_matches_serial(const char* family, const typename Model::config& shape, const losses_and_weights& ref,
                          const layout_case& c, const equivalence_setup& e) {
  CAPTURE(std::string(family) + " " + c.name);
  Run run(world().comm(), shape, launch(c, e));
  const auto got = train_steps(run, shape, e);
  check_run_matches(std::string(family) + " " + c.name, got, ref);
  CHECK(run.layout().cp == c.cp);
  CHECK(run.model().pipelined() == (c.pp > 1));
  if (c.cp > 1 && c.pp == 1) {
    const auto plan = run.plan({.micro = e.global_batch / c.dp / 2, .global = e.global_batch});
    CHECK(plan.comm_bytes.cp > 0);
    CHECK(double(run.mesh().cp().counters().total().bytes_sent) ==
          doctest::Approx(e.steps * plan.comm_bytes.cp).epsilon(1e-12));
  }
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
