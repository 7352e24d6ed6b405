// strata/train/generate.hpp - a continuation of a prompt by a declared model, with a key/value
// cache.
//
//   st::generator gen(run);  // an assembled st::training (or a sequential_model and a group)
//   std::vector<std::int32_t> next = gen.generate(prompt, {.new_tokens = 64,
//                                                          .sample = {.temperature = 0.8, .top_k = 40, .seed = 1}});
//
// The prompt goes through the model once (prefill: every attention layer keeps its keys and
// values), then each new token alone (decode: one position through every layer, its query
// attending to the cache: layers/cached_forward.hpp), so a token costs ~2N FLOPs plus attention
// over the cached positions instead of a forward over the window. Positions are absolute: a
// token at place p of the sequence takes the position table's row p (GPT-2) or the rotary angle
// of p (Llama). Tokens are chosen by train/sampling.hpp: greedy, or drawn from (seed, token
// index) alone. generation::cache = false is the reference: a whole forward over the growing
// window for each token (sequential_model::logits), the last position's logits deciding.
//
// Every rank of the group given (an assembled run's world) generates the same tokens: each
// token is decided from the logits on one rank holding the model's head and broadcast, so ranks
// stay in step even if their logits differed in a last bit. Under each layout:
//   dp        every data-parallel rank runs the whole model on the same prompt
//   ZeRO-3    the layers ask for their weights as in forward: each bucket is gathered when first
//             needed and a few stay resident, so every decoded token gathers the weights once
//   tp        each rank caches its own key/value heads; the head's logits are gathered whole
//   tp + SP   a step holds too few positions to split, so cached steps pause the sequence split:
//             plain tensor parallelism (all-reduce at region edges), every rank holding the
//             whole [B, n, C] between regions; the weights are the same pieces
//   pp        the stages pass the new positions' activations [B, n, C] along in virtual-stage
//             order (interleaved chunks too); the last stage's logits decide the token
// The uncached reference needs the whole model on each rank: refused under pp. There is no
// CUDA kernel for attention over a cache yet: under a cuda policy the cache is refused at the
// first step (every rank alike); the uncached reference runs there. Both refusals are rows of
// the table of supported combinations (policy/support.hpp).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/comm/group_ref.hpp"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/core/tensor.hpp"
#include "strata/layers/cached_forward.hpp"
#include "strata/parallel/sequential_model.hpp"
#include "strata/policy/device.hpp"
#include "strata/policy/support.hpp"
#include "strata/train/sampling.hpp"

namespace strata {

struct generation {
  std::int64_t new_tokens = 0;
  strata::sampling sample{};  // greedy by default
  bool cache = true;          // false: a whole forward over the window per token (the reference)
};

template <class Model>
class generator {
 public:
  using model_type = sequential_model<Model>;
  using T = typename model_type::T;
  // Called for each new token with its index, the token and the logits it was chosen from
  // (empty on ranks without the model's head).
  using observer = std::function<void(std::int64_t index, std::int32_t token, std::span<const double> logits)>;

  // `everyone`: the ranks that generate together (each runs its piece of `model`); the tokens
  // are broadcast over it. A group of one: this rank alone, holding the whole model's head.
  // Collective over `everyone`.
  explicit generator(model_type& model, group_ref everyone = {}) : model_(&model), everyone_(std::move(everyone)) {
    double holder = model.holds_head() ? double(everyone_.rank()) : -1.0;
    everyone_.all_reduce(std::span<double>(&holder, 1), reduce_op::max);
    STRATA_CHECK(holder >= 0, "generator: no rank of the group '", everyone_.name(),
                 "' holds the model's head (its last pipeline stage); give the group every stage is in");
    root_ = static_cast<int>(holder);
  }
  // An assembled run (train/training.hpp): its model, over its world.
  template <class Run>
  requires requires(Run& r) {
    { r.model() } -> std::same_as<model_type&>;
    r.mesh().world();
  }
  explicit generator(Run& run) : generator(run.model(), group_ref(run.mesh().world())) {}
  ~generator() { model_->release_caches(); }
  generator(const generator&) = delete;
  generator& operator=(const generator&) = delete;

  // The g.new_tokens tokens that follow `prompt`, the same on every rank of the group.
  std::vector<std::int32_t> generate(std::span<const std::int32_t> prompt, const generation& g,
                                     const observer& watch = {}) {
    STRATA_CHECK(!prompt.empty(), "generate: the prompt is empty; give at least one token");
    STRATA_CHECK(g.new_tokens >= 0, "generate: new_tokens must be >= 0, got ", g.new_tokens);
    const auto n = static_cast<std::int64_t>(prompt.size());
    const std::int64_t limit = model_->max_positions();
    STRATA_CHECK(limit == 0 || n + g.new_tokens - 1 <= limit, "generate: a prompt of ", n, " tokens and ", g.new_tokens,
                 " new ones need ", n + g.new_tokens - 1, " positions; the model knows ", limit,
                 " (its position table): ask for at most ", limit - n + 1, " new tokens");
    std::vector<std::int32_t> window(prompt.begin(), prompt.end()), out;
    std::vector<double> logits;
    if (g.cache && g.new_tokens > 0) logits = prefill(prompt, n + g.new_tokens - 1);
    for (std::int64_t i = 0; i < g.new_tokens; ++i) {
      if (!g.cache) logits = window_logits(window);
      const std::int32_t token = agree(logits.empty() ? -1 : choose_token(logits, g.sample, std::uint64_t(i)));
      if (watch) watch(i, token, logits);
      out.push_back(token);
      window.push_back(token);
      if (g.cache && i + 1 < g.new_tokens) logits = decode(token);
    }
    if (g.cache) model_->release_caches();
    return out;
  }

  // ---- the steps generate is made of ----

  // The prompt through the model, every cache started with room for `capacity` positions; the
  // logits of its last position (empty on ranks without the head).
  std::vector<double> prefill(std::span<const std::int32_t> prompt, std::int64_t capacity) {
    check_supported(
        combination{.device = device_kind_of<typename Model::policy::device>()}.with(layer_kind::cached_attention),
        "generate");
    const auto n = static_cast<std::int64_t>(prompt.size());
    capacity_ = capacity;
    pos_ = n;
    return model_->forward_cached({prompt.data(), {1, n}}, {.pos = 0, .capacity = capacity});
  }
  // `token` at the next position; its logits (empty on ranks without the head).
  std::vector<double> decode(std::int32_t token) {
    STRATA_CHECK(pos_ > 0 && pos_ < capacity_, "generate: decode at position ", pos_,
                 " needs a prefill with room "
                 "for it (capacity ",
                 capacity_, ")");
    auto logits = model_->forward_cached({&token, {1, 1}}, {.pos = pos_, .capacity = capacity_});
    ++pos_;
    return logits;
  }
  // The reference without a cache: a whole forward over `window`; its last position's logits.
  std::vector<double> window_logits(std::span<const std::int32_t> window) {
    check_supported(combination{}.with(layer_kind::whole_model).with(mesh_axis::pp, model_->pipelined() ? 0 : 1),
                    "generate");
    const auto len = static_cast<std::int64_t>(window.size());
    // Sequence parallelism splits the window: pad it at the end (attention is causal, so the
    // padding changes no logit before it).
    const auto split = model_->context().tensor().split();
    const std::int64_t multiple = split.sequence_parallel ? split.degree : 1;
    std::vector<std::int32_t> padded(window.begin(), window.end());
    padded.resize(std::size_t((len + multiple - 1) / multiple * multiple), 0);
    auto all = model_->logits({padded.data(), {1, static_cast<std::int64_t>(padded.size())}});
    const std::int64_t vocab = all.shape[2];
    std::vector<T> row(static_cast<std::size_t>(vocab));
    model_->context().ledger().space().copy(row.data(), all.data + (len - 1) * vocab, row.size() * sizeof(T),
                                            copy_direction::space_to_host);
    std::vector<double> out(row.size());
    for (std::size_t v = 0; v < row.size(); ++v) out[v] = convert<double>(row[v]);
    return out;
  }
  // The token the head's rank chose (-1 elsewhere), on every rank of the group.
  std::int32_t agree(std::int32_t token) {
    double t = token;
    everyone_.broadcast(std::span<double>(&t, 1), root_);
    return static_cast<std::int32_t>(t);
  }

 private:
  model_type* model_;
  group_ref everyone_;
  int root_ = 0;
  std::int64_t pos_ = 0, capacity_ = 0;
};

template <class Model>
generator(sequential_model<Model>&, group_ref = {}) -> generator<Model>;
template <class Run>
generator(Run&) -> generator<typename Run::declaration>;

}  // namespace strata
