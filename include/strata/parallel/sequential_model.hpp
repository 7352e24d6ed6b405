// strata/parallel/sequential_model.hpp - a declared model built on one rank: the whole model, or
// this rank's pipeline stage of it.
//
//   st::sequential_model<my_model<P>> model(ledger, config, st::seed{1}, placement);
//
// From the declaration (layers/sequential.hpp) and where the rank sits (model_placement: its
// tensor-parallel group, the recomputation mode, its pipeline stage), it builds the layers this
// rank runs and gives the trainer what it needs: forward/backward (one stage), or
// run_microbatches (a pipeline: the schedule's whole step). Nothing here knows any particular
// model.
//
// Pipeline stages: the blocks form p·V virtual stages (p stages of the pipeline group, V chunks
// each; virtual stage v = c·p + s is chunk c of stage s), evenly or with an explicit block count
// per virtual stage. The parts before the blocks go with virtual stage 0, the parts after them
// with the last. Blocks keep their names ("h.5"), so every stage starts with the serial model's
// values. A parameter tied across the two ends (the head sharing the embedding's table) is
// registered again, as a replica, on the stage that lacks its owner; at start-up the replica is
// set to the owner's values, and after each step's backward the two gradients are summed over the
// first and last stages (the embedding group), so they stay equal. A stage builds one copy of its
// layers per micro-batch (sharing one set of parameters): each micro-batch in flight keeps its own
// activations, released after its backward, so the allocator sees exactly the micro-batches the
// schedule holds. Every block is wrapped in recompute<recompute_from_context, Block>: the
// placement's recomputation mode applies to the blocks.
//
// Context parallelism (model_placement::context, cp > 1): the model is given whole sequences and
// takes this rank's chunks of each (layers/context_split.hpp) before the first layer, inputs and
// targets alike, so the trainer, the data and the pipeline executor see [B, T] batches and the
// layers [B, T/cp]; evaluate() averages the loss over the cp group. Generation and logits() are
// refused under cp, a row of the table of supported combinations (policy/support.hpp).
//
// Generation with a key/value cache (train/generate.hpp drives it): forward_cached feeds the new
// positions through the layers' cached forwards (layers/cached_forward.hpp) with any sequence
// split paused; a pipeline passes the new positions' activations [B, n, C] from virtual stage to
// virtual stage in order, using the first micro-batch copy of each chunk, and the last stage's
// head gives the logits of each sequence's last position.
#pragma once
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/comm/group_ref.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/layers/cached_forward.hpp"
#include "strata/layers/context_parallel.hpp"
#include "strata/layers/layer.hpp"
#include "strata/layers/module.hpp"
#include "strata/layers/recompute.hpp"
#include "strata/layers/sequential.hpp"
#include "strata/layers/stack.hpp"
#include "strata/layers/tensor_checks.hpp"
#include "strata/layers/tensor_parallel.hpp"
#include "strata/layers/context_split.hpp"
#include "strata/parallel/pipeline.hpp"
#include "strata/parallel/pipeline_schedule.hpp"
#include "strata/policy/support.hpp"

namespace strata {

// Where this rank sits in the pipeline and how the blocks are split.
struct pipeline_placement {
  pipeline_shape shape{};                              // schedule, stages p, micro-batches M, chunks V
  int stage = 0;                                       // this rank's stage (its rank in the pp group)
  std::vector<std::int64_t> blocks_per_virtual_stage;  // p·V counts in virtual-stage order; empty: even

  bool pipelined() const { return shape.stages > 1 || shape.chunks > 1; }

  // First block and block count of each virtual stage; the errors name the numbers.
  std::vector<std::pair<std::int64_t, std::int64_t>> block_ranges(std::int64_t blocks) const {
    const int vs = shape.virtual_stages();
    std::vector<std::int64_t> counts = blocks_per_virtual_stage;
    if (counts.empty()) {
      STRATA_CHECK(blocks % vs == 0, "pipeline: ", blocks, " layers do not split evenly over ", shape.stages,
                   " stages x ", shape.chunks, " chunks = ", vs, " virtual stages; give the layers per stage");
      counts.assign(std::size_t(vs), blocks / vs);
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
    STRATA_CHECK(first == blocks, "pipeline: the layer counts per stage add up to ", first, ", the model has ", blocks);
    return out;
  }
};

// Where a rank's piece of a model sits: what an assembled run (train/training.hpp) fills in from
// the mesh; the default is the serial model.
struct model_placement {
  tensor_parallel tensor{};
  context_parallel context{};  // the ranks sharing each sequence (cp), and the attention form
  group_ref experts{};         // the ranks sharing out each mixture's experts (ep)
  recompute_mode recompute = recompute_mode::none;
  pipeline_placement pipeline{};
  group_ref pipeline_group{};   // the stages in order
  group_ref embedding_group{};  // the first and last stages (an empty group elsewhere, and when p = 1)
};

namespace detail {
// What a part of the declaration becomes on a rank.
template <class Part>
struct built_part;
template <class L>
struct built_part<layer_part<L>> {
  using type = L;
};
template <class L>
struct built_part<blocks_part<L>> {
  using type = stack<recompute<recompute_from_context, L>>;
};

// One copy of the parts a virtual stage holds (the others stay empty).
template <class Layers>
struct built_replica;
template <class... Parts>
struct built_replica<sequential_layers<Parts...>> {
  using type = std::tuple<std::optional<typename built_part<Parts>::type>...>;
};
}  // namespace detail

template <class Model>
class sequential_model {
  static_assert(check_model_declaration<Model>());
  static_assert(check_static_layout<Model>());

 public:
  using declaration = Model;
  using policy = typename Model::policy;
  using T = typename policy::storage;
  using config = typename Model::config;
  using layers_type = layers_of<Model>;

  sequential_model(memory_ledger& ledger, const config& c, strata::seed seed, model_placement where = {})
      : cfg_(c),
        layers_(Model::layers(c)),
        place_(std::move(where)),
        ctx_(ledger, seed, place_.tensor, place_.recompute, place_.context, place_.experts) {
    ctx_.set_block_count(layers_.blocks().count);
    const auto& pl = place_.pipeline;
    const bool piped = pl.pipelined();
    if (piped) exec_.emplace(*this, place_.pipeline_group, pl.shape, ledger);
    const auto ranges = pl.block_ranges(layers_.blocks().count);
    ctx_.share_parameters(piped);
    ctx_.allow_tied_replicas(piped);
    const int replicas = piped ? pl.shape.microbatches : 1;
    for (int ch = 0; ch < pl.shape.chunks; ++ch) {
      const int v = pl.shape.virtual_stage(pl.stage, ch);
      auto& chunk = chunks_.emplace_back();
      chunk.reserve(std::size_t(replicas));  // the layers stay where they are built
      for (int m = 0; m < replicas; ++m)
        build(chunk.emplace_back(), ctx_, layers_, v == 0, v == pl.shape.virtual_stages() - 1, ranges[std::size_t(v)]);
    }
    ctx_.params().materialize();
    if (piped) link_tied_parameters();
  }
  sequential_model(const sequential_model&) = delete;
  sequential_model& operator=(const sequential_model&) = delete;

  // ---- one stage holding the whole model: the trainer's forward and backward ----

  // Mean next-token loss over the batch; leaves the loss gradient (times grad_scale) in place.
  double forward(tensor_view<const std::int32_t> inputs, tensor_view<const std::int32_t> targets,
                 double grad_scale = 1.0) {
    check_tokens(inputs);
    double loss = 0;
    run_forward(whole(), tensor_view<const T>{}, local_tokens(inputs, local_inputs_),
                local_tokens(targets, local_targets_), grad_scale, loss);
    return loss;
  }
  void backward() { run_backward(whole(), nullptr); }
  // The loss without gradients (over the whole sequences: averaged over the context group).
  double evaluate(tensor_view<const std::int32_t> inputs, tensor_view<const std::int32_t> targets) {
    check_tokens(inputs);
    auto& r = whole();
    double loss = std::get<N - 1>(r)->evaluate(hidden_to_head(r, local_tokens(inputs, local_inputs_)),
                                               local_tokens(targets, local_targets_));
    if (ctx_.cp().degree() > 1) ctx_.cp().group().all_reduce(std::span<double>(&loss, 1), reduce_op::avg);
    return loss;
  }
  // The output layer's logits for sampling (when it offers them).
  auto logits(tensor_view<const std::int32_t> inputs) {
    refuse_under_context("logits");
    auto& r = whole();
    return std::get<N - 1>(r)->logits(hidden_to_head(r, inputs));
  }

  // ---- generation with a key/value cache ----

  // Feeds tokens [B, n] (host memory), the positions step.pos .. step.pos + n - 1 of each
  // sequence, through this rank's layers, each keeping its cache; the step at position 0 starts
  // the caches with room for step.capacity positions. Collective over the tensor and pipeline
  // groups. Returns the logits of each sequence's last position, [B, V] in host memory, on the
  // ranks holding the head (holds_head()); empty elsewhere.
  std::vector<double> forward_cached(tensor_view<const std::int32_t> tokens, const decode_step& step) {
    refuse_under_context("generation");
    check_cached_tokens(tokens, step);
    const auto pause = ctx_.tensor().pause_sequence_split();  // n = 1 divides no split
    const auto& sh = place_.pipeline.shape;
    const int p = sh.stages, me = place_.pipeline.stage;
    const std::int64_t batch = tokens.shape[0], n = tokens.shape[1], width = block_width();
    std::vector<double> logits;
    buffer<T> received;
    tensor_view<const T> x;
    // Virtual stage v is chunk v / p of stage v % p: each stage runs its chunks in that order,
    // taking its input from the stage before and giving its output to the stage after.
    for (int v = 0; v < sh.virtual_stages(); ++v) {
      if (v % p != me) continue;
      if (v > 0 && (v - 1) % p != me) {
        ensure_size(received, ctx_.ledger(), memory_category::communication, batch * n * width);
        place_.pipeline_group.recv_async(std::span<T>(received.data(), received.size()), (v - 1) % p, v).wait();
        x = {received.data(), {batch, n, width}};
      }
      x = cached_pass(chunks_[std::size_t(v / p)].front(), x, tokens, step, logits);
      if (v + 1 < sh.virtual_stages() && (v + 1) % p != me)
        place_.pipeline_group.send_async(std::span<const T>(x.data, std::size_t(x.numel())), (v + 1) % p, v + 1).wait();
    }
    return logits;
  }
  // Lets every layer go of its cache (and, on a pipeline stage, of the activations the steps left
  // in the first micro-batch's copy, as after its backward).
  void release_caches() {
    for (auto& c : chunks_) {
      if (exec_) release(c.front());
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (
            [&] {
              auto& part = std::get<I>(c.front());
              using L = std::remove_cvref_t<decltype(*part)>;
              if constexpr (requires(L & l) { l.release_cache(); })
                if (part) part->release_cache();
            }(),
            ...);
      }
      (std::make_index_sequence<N>{});
    }
    last_ = buffer<T>();
  }
  // Whether this rank computes the logits (the last pipeline stage, or the whole model).
  bool holds_head() const { return place_.pipeline.stage == place_.pipeline.shape.stages - 1; }
  // The positions a sequence may reach (the input layer's max_positions(config)); 0: no limit.
  std::int64_t max_positions() const {
    using L = typename layers_type::template part_type<0>::layer_type;
    if constexpr (requires { L::max_positions(layers_.template part<0>().config); })
      return L::max_positions(layers_.template part<0>().config);
    else return 0;
  }

  // ---- a pipeline: the schedule's whole step ----

  bool pipelined() const { return exec_.has_value(); }
  int microbatches() const { return place_.pipeline.shape.microbatches; }
  // Every micro-batch's forward and backward under the schedule, then each tied parameter's
  // gradient summed between the first and last stages. Returns the losses' sum.
  double run_microbatches(tensor_view<const std::int32_t> inputs, tensor_view<const std::int32_t> targets,
                          std::int64_t rows, int microbatches, double grad_scale) {
    STRATA_CHECK(exec_, "sequential_model: run_microbatches needs a pipeline (the model is one stage)");
    check_tokens(inputs);
    const double loss = exec_->run(local_tokens(inputs, local_inputs_), local_tokens(targets, local_targets_), rows,
                                   microbatches, grad_scale);
    auto& p = ctx_.params();
    for (const param_handle h : tied_to_sum_)
      place_.embedding_group.all_reduce(std::span<T>(p.grads(h), std::size_t(p.info(h).numel)));
    return loss;
  }

  // The step's auxiliary losses and statistics (layers/auxiliary_loss.hpp), summed over the
  // pipeline stages (each holds its blocks' rows); the model's sums start again from zero.
  auxiliary_sums take_auxiliary() {
    auxiliary_sums s = ctx_.auxiliary().take();
    if (exec_ && place_.pipeline.shape.stages > 1) {
      place_.pipeline_group.all_reduce(std::span<double>(&s.objective, 1));
      if (!s.rows.empty()) place_.pipeline_group.all_reduce(std::span<double>(s.rows.data(), s.rows.size()));
    }
    return s;
  }

  // The executor's stage interface (parallel/pipeline.hpp).
  tensor_view<const T> pipeline_forward(int c, int m, tensor_view<const T> input,
                                        tensor_view<const std::int32_t> inputs, tensor_view<const std::int32_t> targets,
                                        double grad_scale, double& loss) {
    return run_forward(chunks_[std::size_t(c)][std::size_t(m)], input, inputs, targets, grad_scale, loss);
  }
  buffer<T> pipeline_backward(int c, int m, const buffer<T>* output_grad) {
    auto& r = chunks_[std::size_t(c)][std::size_t(m)];
    buffer<T> dx = run_backward(r, output_grad);
    release(r);
    return dx;
  }
  // What flows between stages: [sequences, tokens held, the blocks' width].
  strata::shape pipeline_activation_shape(std::int64_t sequences, std::int64_t seq) const {
    return {sequences, ctx_.tensor().split().local_rows(seq), block_width()};
  }
  const pipeline_step_stats& last_step() const {
    STRATA_CHECK(exec_, "sequential_model: the model is one stage; it keeps no pipeline statistics");
    return exec_->last_step();
  }
  const pipeline_placement& placement() const { return place_.pipeline; }

  // ---- what every model offers ----

  parameter_store<T>& parameters() { return ctx_.params(); }
  model_context<policy>& context() { return ctx_; }
  const model_context<policy>& context() const { return ctx_; }
  const config& shape() const { return cfg_; }
  const layers_type& layers() const { return layers_; }

  // The serial model's parameters in order, each with its element count: the layout the
  // gathered weights, exports and comparisons with the serial run use. Built without allocating.
  static std::vector<std::pair<std::string, std::int64_t>> serial_parameters(const config& c) {
    std::vector<std::pair<std::string, std::int64_t>> out;
    for (const auto& [name, s] : serial_parameter_shapes(c)) out.push_back({name, s.numel()});
    return out;
  }
  // The same parameters with their whole (unsplit) shapes: what a file of named tensors, such
  // as a Hugging Face safetensors file (train/hf_weights.hpp), lays them out by.
  static std::vector<std::pair<std::string, strata::shape>> serial_parameter_shapes(const config& c) {
    memory_ledger scratch;
    model_context<policy> ctx(scratch, strata::seed{});
    const layers_type layers = Model::layers(c);
    replica r;
    build(r, ctx, layers, true, true, {0, layers.blocks().count});
    std::vector<std::pair<std::string, strata::shape>> out;
    for (const auto& e : ctx.params().entries()) out.push_back({e.name, e.shape});
    return out;
  }

 private:
  static constexpr std::size_t N = layers_type::size, B = layers_type::blocks_at;
  using replica = typename detail::built_replica<layers_type>::type;
  using chunk = std::vector<replica>;  // one copy of the chunk's layers per micro-batch in flight

  // Builds the parts virtual stage v holds, in declaration order (an owner before its ties).
  static void build(replica& r, model_context<policy>& ctx, const layers_type& layers, bool first, bool last,
                    std::pair<std::int64_t, std::int64_t> blocks) {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (build_part<I>(r, ctx, layers, first, last, blocks), ...); }
    (std::make_index_sequence<N>{});
  }
  template <std::size_t I>
  static void build_part(replica& r, model_context<policy>& ctx, const layers_type& layers, bool first, bool last,
                         std::pair<std::int64_t, std::int64_t> blocks) {
    const auto& part = layers.template part<I>();
    module_scope<policy> scope(ctx, std::string(part.name));
    if constexpr (I == B) std::get<I>(r).emplace(scope, part.config, blocks.second, blocks.first);
    else if ((I < B && first) || (I > B && last)) std::get<I>(r).emplace(scope, part.config);
  }

  // Checked on every rank alike before anything runs (a pipeline's stages would otherwise wait
  // for one that stopped): sequence parallelism splits each sequence over the tensor group.
  void check_tokens(tensor_view<const std::int32_t> inputs) const {
    const auto split = ctx_.tensor().split();
    STRATA_CHECK(inputs.shape.rank == 2, "model: expected token ids [B, T], got ", inputs.shape.str());
    const context_split cs = ctx_.cp().split_whole(inputs.shape[1]);  // 2·cp chunks must divide T
    STRATA_CHECK(!split.sequence_parallel || cs.local_seq() % split.degree == 0,
                 "model: sequence parallelism over tp=", split.degree, " needs a sequence length divisible by it, got ",
                 cs.local_seq(), cs.degree > 1 ? " tokens per context rank" : "");
  }
  // Under context parallelism: this rank's tokens of every sequence (context_split), copied into
  // `storage`; otherwise the tokens themselves.
  tensor_view<const std::int32_t> local_tokens(tensor_view<const std::int32_t> whole,
                                               std::vector<std::int32_t>& storage) const {
    if (ctx_.cp().degree() == 1 || !whole.data) return whole;
    const std::int64_t batch = whole.shape[0];
    const context_split cs = ctx_.cp().split_whole(whole.shape[1]);
    storage.resize(std::size_t(batch * cs.local_seq()));
    cs.take(whole.data, storage.data(), batch, 1);
    return {storage.data(), {batch, cs.local_seq()}};
  }
  // Generation feeds positions one at a time: no chunk split of the sequence holds them.
  // A row of the table of supported combinations (policy/support.hpp), at compile time too.
  void refuse_under_context(const char* what) const {
    static_assert(check_static_support<policy, layer_kind::output_logits>());
    check_supported(combination{}.with(layer_kind::output_logits).with(mesh_axis::cp, ctx_.cp().degree()),
                    std::string("model: ") + what);
  }

  // The same checks on every rank before any stage runs (the first stage alone would see a bad
  // token, and the others would wait for it).
  void check_cached_tokens(tensor_view<const std::int32_t> tokens, const decode_step& step) const {
    STRATA_CHECK(tokens.shape.rank == 2 && tokens.shape[0] >= 1 && tokens.shape[1] >= 1,
                 "model: generation expects token ids [B, n] with B, n >= 1, got ", tokens.shape.str());
    const std::int64_t n = tokens.shape[1], limit = max_positions();
    STRATA_CHECK(step.pos >= 0 && step.pos + n <= step.capacity, "model: ", n, " tokens at position ", step.pos,
                 " do not fit a cache of ", step.capacity, " positions");
    STRATA_CHECK(limit == 0 || step.pos + n <= limit, "model: generation reaches position ", step.pos + n - 1,
                 ", past the ", limit, " positions the model knows (its position table)");
    if constexpr (requires { layers_.template part<0>().config.vocab; }) {
      const std::int64_t vocab = layers_.template part<0>().config.vocab;
      for (std::int64_t i = 0; i < tokens.numel(); ++i)
        STRATA_CHECK(tokens.data[i] >= 0 && tokens.data[i] < vocab, "model: token id ", tokens.data[i], " at position ",
                     step.pos + i % n, " is out of range for vocab ", vocab);
    }
  }
  // The parts one virtual stage holds, on the new positions: x is the stage's input (none on the
  // first, which reads the tokens); the head, on the last, sets `logits` from each sequence's
  // last position.
  tensor_view<const T> cached_pass(replica& r, tensor_view<const T> x, tensor_view<const std::int32_t> tokens,
                                   const decode_step& step, std::vector<double>& logits) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            auto& part = std::get<I>(r);
            using L = std::remove_cvref_t<decltype(*part)>;
            if (!part) return;
            if constexpr (I == 0) {
              static_assert(cached_input_layer<L>,
                            "strata generation: the model's first part needs "
                            "`tensor_view<const T> forward_cached(tensor_view<const std::int32_t> "
                            "tokens, const strata::decode_step&)` (tokens at their positions)");
              x = part->forward_cached(tokens, step);
            } else if constexpr (I + 1 == N) {
              static_assert(logits_layer<L>,
                            "strata generation: the model's last part needs "
                            "`tensor_view<const T> logits(tensor_view<const T>)`");
              logits = to_host(part->logits(last_positions(x)));
              x = {};
            } else {
              x = run_cached(*part, x, step);
            }
          }(),
          ...);
    }
    (std::make_index_sequence<N>{});
    return x;
  }
  // x [B, n, C] -> its last position of each sequence, [B, 1, C].
  tensor_view<const T> last_positions(tensor_view<const T> x) {
    const std::int64_t b = x.shape[0], n = x.shape[1], c = x.shape[2];
    if (n == 1) return x;
    ensure_size(last_, ctx_.ledger(), memory_category::activations, b * c);
    for (std::int64_t i = 0; i < b; ++i)
      last_.copy_within(x.data + (i * n + n - 1) * c, std::size_t(c), std::size_t(i * c));
    return {last_.data(), {b, 1, c}};
  }
  std::vector<double> to_host(tensor_view<const T> y) {
    std::vector<T> here(std::size_t(y.numel()));
    ctx_.ledger().space().copy(here.data(), y.data, here.size() * sizeof(T), copy_direction::space_to_host);
    std::vector<double> out(here.size());
    for (std::size_t i = 0; i < here.size(); ++i) out[i] = convert<double>(here[i]);
    return out;
  }

  replica& whole() {
    STRATA_CHECK(!exec_,
                 "sequential_model: the model is split over pipeline stages; the trainer runs its "
                 "micro-batches through run_microbatches");
    return chunks_.front().front();
  }

  tensor_view<const T> run_forward(replica& r, tensor_view<const T> x, tensor_view<const std::int32_t> inputs,
                                   tensor_view<const std::int32_t> targets, double grad_scale, double& loss) {
    ctx_.auxiliary().set_grad_scale(grad_scale);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            auto& part = std::get<I>(r);
            if (!part) return;
            if constexpr (I == 0) x = part->forward(inputs);
            else if constexpr (I + 1 == N) {
              loss = part->forward(x, targets, grad_scale);
              x = {};
            } else x = part->forward(x);
          }(),
          ...);
    }
    (std::make_index_sequence<N>{});
    return x;
  }
  // Parts in reverse; the last virtual stage starts from its loss, the others from `output_grad`.
  buffer<T> run_backward(replica& r, const buffer<T>* output_grad) {
    buffer<T> d;
    const buffer<T>* dy = output_grad;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            constexpr std::size_t J = N - 1 - I;
            auto& part = std::get<J>(r);
            if (!part) return;
            if constexpr (J + 1 == N) {
              d = part->backward();
            } else if constexpr (J == 0) {
              part->backward(dy ? *dy : d);
              d = buffer<T>();
            } else {
              d = part->backward(dy ? *dy : d);
            }
            dy = nullptr;
          }(),
          ...);
    }
    (std::make_index_sequence<N>{});
    return d;
  }
  // Everything before the output layer (one stage holding the whole model).
  tensor_view<const T> hidden_to_head(replica& r, tensor_view<const std::int32_t> inputs) {
    tensor_view<const T> x;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (I == 0) x = std::get<I>(r)->forward(inputs);
            else if constexpr (I + 1 < N) x = std::get<I>(r)->forward(x);
          }(),
          ...);
    }
    (std::make_index_sequence<N>{});
    return x;
  }
  static void release(replica& r) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            auto& part = std::get<I>(r);
            if constexpr (releases_activations<std::remove_cvref_t<decltype(*part)>>)
              if (part) part->release_activations();
          }(),
          ...);
    }
    (std::make_index_sequence<N>{});
  }

  // Elements per token of what the blocks pass on.
  std::int64_t block_width() const {
    using block = typename layers_type::template part_type<B>::layer_type;
    const layer_cost one = block::cost(layers_.blocks().config, cost_scope{});
    return one.output_bytes / static_cast<std::int64_t>(sizeof(T));
  }

  // The names of the parameters tied across parts, in declaration order (the same on every rank).
  std::vector<std::string> tied_names() const {
    std::vector<std::string> out;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            using L = typename layers_type::template part_type<I>::layer_type;
            if constexpr (ties_a_parameter<L>) {
              const std::string_view name = L::tied_parameter(layers_.template part<I>().config);
              if (!name.empty()) out.emplace_back(name);
            }
          }(),
          ...);
    }
    (std::make_index_sequence<N>{});
    return out;
  }
  // For each tie held on both the first and the last stage (owner and replica): the replica
  // takes the owner's values, and its gradient is summed after every step. Collective over the
  // embedding group.
  void link_tied_parameters() {
    auto& p = ctx_.params();
    for (const std::string& name : tied_names()) {
      const param_handle h = p.find(name);
      double holders = h.valid() ? 1.0 : 0.0;
      place_.embedding_group.all_reduce(std::span<double>(&holders, 1));
      if (h.valid() && p.info(h).replica)
        STRATA_CHECK(holders == 2.0, "pipeline: the tied parameter '", name,
                     "' has no owner on the first stage "
                     "(no part before the blocks registers it)");
      if (holders != 2.0) continue;
      std::vector<T> values(std::size_t(p.info(h).numel));
      p.download_weights(h, values);
      if (p.info(h).replica) std::fill(values.begin(), values.end(), convert<T>(0.0));
      place_.embedding_group.all_reduce(std::span<T>(values));
      p.upload_weights(h, values);
      tied_to_sum_.push_back(h);
    }
  }

  config cfg_;
  layers_type layers_;
  model_placement place_;
  model_context<policy> ctx_;
  std::vector<chunk> chunks_;
  std::vector<param_handle> tied_to_sum_;
  std::optional<pipeline_executor<sequential_model>> exec_;
  buffer<T> last_;  // generation: each sequence's last position, when a step has several
  std::vector<std::int32_t> local_inputs_, local_targets_;  // context parallelism: this rank's tokens
};

}  // namespace strata
