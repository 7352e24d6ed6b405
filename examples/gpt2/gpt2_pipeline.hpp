// examples/gpt2/gpt2_pipeline.hpp - the example GPT-2 split over pipeline stages.
//
// The blocks form p·V virtual stages (p stages of the pipeline group, V chunks each; virtual
// stage v = c·p + s is chunk c of stage s): evenly by default, or with an explicit block count
// per virtual stage. The embedding goes with virtual stage 0, the final LayerNorm and the head
// with the last one. Blocks keep their names ("h.5"), so every stage starts with the serial
// model's values. GPT-2 ties the head to the token table: the last stage keeps its own copy of
// "wte" (same name, same initial values, marked a replica), and after each step's backward the
// two copies' gradients are summed over the first and last stages, so they stay equal.
//
// A stage builds one copy of its layers per micro-batch (sharing one set of parameters): each
// micro-batch in flight keeps its own activations, released after its backward, so the
// allocator sees exactly the micro-batches the schedule holds. strata::pipeline_executor runs
// the schedule; the trainer calls run_microbatches once per step.
#pragma once
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <strata/comm/group_ref.hpp>
#include <strata/parallel/pipeline.hpp>
#include <strata/parallel/pipeline_schedule.hpp>

#include "gpt2.hpp"

namespace gpt2 {

// Where this rank sits in the pipeline and how the blocks are split.
struct pipeline_placement {
  st::pipeline_shape shape;                        // schedule, stages p, micro-batches M, chunks V
  int stage = 0;                                   // this rank's stage (its rank in the pp group)
  std::vector<std::int64_t> layers_per_virtual_stage;  // p·V counts in virtual-stage order; empty: even

  // First block and block count of each virtual stage; the errors name the numbers.
  std::vector<std::pair<std::int64_t, std::int64_t>> layer_ranges(std::int64_t layers) const {
    const int vs = shape.virtual_stages();
    std::vector<std::int64_t> counts = layers_per_virtual_stage;
    if (counts.empty()) {
      STRATA_CHECK(layers % vs == 0, "pipeline: ", layers, " layers do not split evenly over ", shape.stages,
                   " stages x ", shape.chunks, " chunks = ", vs, " virtual stages; give the layers per stage");
      counts.assign(std::size_t(vs), layers / vs);
    }
    STRATA_CHECK(static_cast<int>(counts.size()) == vs, "pipeline: ", counts.size(), " layer counts given for ", vs,
                 " virtual stages (", shape.stages, " stages x ", shape.chunks, " chunks)");
    std::vector<std::pair<std::int64_t, std::int64_t>> out;
    std::int64_t first = 0;
    for (int v = 0; v < vs; ++v) {
      STRATA_CHECK(counts[std::size_t(v)] >= 1, "pipeline: virtual stage ", v, " has ", counts[std::size_t(v)],
                   " layers; every stage needs at least one");
      out.push_back({first, counts[std::size_t(v)]});
      first += counts[std::size_t(v)];
    }
    STRATA_CHECK(first == layers, "pipeline: the layer counts per stage add up to ", first, ", the model has ", layers);
    return out;
  }
};

template <class P>
struct staged_model {
  using policy = P;
  using T = typename P::storage;
  using base = model<P>;
  using block_type = typename base::block_type;

  // `pp`: the pipeline group; `embedding_group`: the first and last stages (an empty group_ref
  // on the others, and when p = 1).
  staged_model(st::memory_ledger& ledger, const dims& dd, st::seed seed, st::tensor_parallel tp, st::recompute_mode r,
               pipeline_placement placement, st::group_ref pp, st::group_ref embedding_group)
      : d(dd), place_(std::move(placement)), ctx(ledger, seed, std::move(tp)), embedding_group_(std::move(embedding_group)),
        exec_(*this, std::move(pp), place_.shape, ledger) {
    base::check(d, ctx.tensor());
    const auto split = ctx.tensor().split();
    const auto ranges = place_.layer_ranges(d.layers);
    const auto& sh = place_.shape;
    const int last = sh.virtual_stages() - 1;
    ctx.share_parameters(true);
    for (int c = 0; c < sh.chunks; ++c) {
      const int v = sh.virtual_stage(place_.stage, c);
      chunk& ch = chunks_.emplace_back();
      ch.replicas.reserve(std::size_t(sh.microbatches));
      for (int m = 0; m < sh.microbatches; ++m) {
        replica& rep = ch.replicas.emplace_back();
        if (v == 0) rep.embed.emplace(st::module_scope<P>(ctx), base::embed_config(d, split));
        rep.blocks.emplace(st::module_scope<P>(ctx, "h"), base::block_init(d, split, r), ranges[std::size_t(v)].second,
                           ranges[std::size_t(v)].first);
        if (v == last) {
          rep.ln_f.emplace(st::module_scope<P>(ctx, "ln_f"), base::ln_config(d, split));
          st::param_handle table = ctx.params().find("wte");
          if (!table.valid()) {
            // The last stage's copy of the tied table: same name, same piece, same initial values.
            const auto cfg = base::embed_config(d, split);
            table = st::module_scope<P>(ctx).add_parameter(
                "wte", st::embedding<P>::token_table_shard(cfg, ctx.tensor().rank()),
                st::init_rule::normal_with_std(cfg.init_std), true);
            ctx.params().mark_replica(table);
          }
          tied_table_ = table;
          rep.head.emplace(st::module_scope<P>(ctx, "lm_head"), base::head_config(d, split), st::tied_to{table});
        }
      }
    }
    if (place_.stage == 0 && chunks_.front().replicas.front().embed)
      tied_table_ = chunks_.front().replicas.front().embed->token_table();
    ctx.params().materialize();
  }

  // The trainer's step: every micro-batch's forward and backward under the schedule, then the
  // tied table's gradient summed between the first and last stages. Returns the losses' sum.
  double run_microbatches(st::tensor_view<const std::int32_t> inputs, st::tensor_view<const std::int32_t> targets,
                          std::int64_t rows, int microbatches, double grad_scale) {
    const double loss = exec_.run(inputs, targets, rows, microbatches, grad_scale);
    if (place_.shape.stages > 1 && tied_table_.valid() && embedding_group_.size() > 1) {
      auto& p = ctx.params();
      embedding_group_.all_reduce(std::span<T>(p.grads(tied_table_), std::size_t(p.info(tied_table_).numel)));
    }
    return loss;
  }

  // The executor's stage interface (strata/parallel/pipeline.hpp).
  st::tensor_view<const T> pipeline_forward(int c, int m, st::tensor_view<const T> input,
                                            st::tensor_view<const std::int32_t> inputs,
                                            st::tensor_view<const std::int32_t> targets, double grad_scale, double& loss) {
    replica& r = chunks_[std::size_t(c)].replicas[std::size_t(m)];
    st::tensor_view<const T> x = r.embed ? r.embed->forward(inputs) : input;
    x = r.blocks->forward(x);
    if (!r.head) return x;
    loss = r.head->forward(r.ln_f->forward(x), targets, grad_scale);
    return {};
  }
  st::buffer<T> pipeline_backward(int c, int m, const st::buffer<T>* output_grad) {
    replica& r = chunks_[std::size_t(c)].replicas[std::size_t(m)];
    st::buffer<T> from_head;
    if (r.head) from_head = r.ln_f->backward(r.head->backward());
    st::buffer<T> dx = r.blocks->backward(r.head ? from_head : *output_grad);
    r.blocks->release_activations();
    if (r.head) {
      r.head->release_activations();
      r.ln_f->release_activations();
    }
    if (!r.embed) return dx;
    r.embed->backward(dx);
    r.embed->release_activations();
    return {};
  }
  st::shape pipeline_activation_shape(std::int64_t sequences) const {
    const auto split = ctx.tensor().split();
    return {sequences, split.sequence_parallel && split.degree > 1 ? d.seq / split.degree : d.seq, d.d_model};
  }

  st::parameter_store<T>& parameters() { return ctx.params(); }
  const dims& shape() const { return d; }
  const pipeline_placement& placement() const { return place_; }
  const st::pipeline_step_stats& last_step() const { return exec_.last_step(); }

  dims d;

 private:
  struct replica {
    std::optional<st::embedding<P>> embed;
    std::optional<st::stack<block_type>> blocks;
    std::optional<st::layernorm<P>> ln_f;
    std::optional<st::lm_head<P>> head;
  };
  struct chunk {
    std::vector<replica> replicas;  // one per micro-batch
  };

  pipeline_placement place_;

 public:
  st::model_context<P> ctx;

 private:
  st::group_ref embedding_group_;
  std::vector<chunk> chunks_;
  st::param_handle tied_table_;
  st::pipeline_executor<staged_model> exec_;
};

}  // namespace gpt2
