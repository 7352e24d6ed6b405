// strata/layers/cached_forward.hpp - what a layer offers for generation with a key/value cache.
//
// Generation feeds a model its prompt once (prefill), then one token at a time (decode); each
// step passes only the new positions through the layers, so a token costs ~2N FLOPs rather than
// a forward over the whole window. A layer takes part in one of two ways:
//   position_wise   it works on each token alone (norms, feed-forward blocks, linear maps), so
//                   its ordinary forward on the new tokens is already right: it says so with
//                   `static constexpr bool position_wise = true;`
//   cached          it mixes tokens (attention) or places them (a position table, a block holding
//                   an attention): forward_cached(x, step) takes the new tokens at positions
//                   step.pos .. step.pos + n - 1 and keeps what later positions need (keys and
//                   values); release_cache() lets it go
// A layer that is neither fails to compile when a model holding it generates, with a message
// naming what to add: running only the new tokens through a token-mixing layer that does not
// know its cache would silently compute something else.
//
// Under sequence parallelism a step holds too few tokens to split: the model runs its cached
// steps with the sequence split paused (tensor_parallel::pause_sequence_split), every rank holding
// the whole [B, n, C] between tensor-parallel regions.
#pragma once
#include <concepts>
#include <cstdint>
#include <type_traits>

#include "strata/core/tensor.hpp"

namespace strata {

// One cached step: the tokens given sit at positions pos .. pos + n - 1 of each sequence, and
// every position before pos is already in the caches. The caches hold `capacity` positions,
// allocated by the step at pos 0 (the prompt).
struct decode_step {
  std::int64_t pos = 0;
  std::int64_t capacity = 0;
};

template <class L>
concept position_wise_layer = requires {
  { L::position_wise } -> std::convertible_to<bool>;
}
&&L::position_wise;

template <class L>
concept cached_hidden_layer = requires(L& l, tensor_view<const typename L::T> x, const decode_step& s) {
  { l.forward_cached(x, s) } -> std::same_as<tensor_view<const typename L::T>>;
  l.release_cache();
};

// The first part of a model, for generation: token ids at their positions -> activations.
template <class L>
concept cached_input_layer = requires(L& l, tensor_view<const std::int32_t> tokens, const decode_step& s) {
  { l.forward_cached(tokens, s) } -> std::same_as<tensor_view<const typename L::T>>;
};

// The last part of a model, for generation: activations -> logits [B, T, V] (whole on every
// rank of a tensor-parallel group).
template <class L>
concept logits_layer = requires(L& l, tensor_view<const typename L::T> x) {
  { l.logits(x) } -> std::same_as<tensor_view<const typename L::T>>;
};

template <class L>
consteval bool check_generating_hidden_layer() {
  static_assert(cached_hidden_layer<L> || position_wise_layer<L>,
                "strata generation: a hidden layer must either work on each token alone and say so "
                "(`static constexpr bool position_wise = true;`) or keep a cache of what later tokens need "
                "(`tensor_view<const T> forward_cached(tensor_view<const T>, const strata::decode_step&)` and "
                "`void release_cache()`); see docs/generation.md");
  return true;
}

// Runs `layer` on the new tokens x of `step`: its cached forward, or its forward when it works
// token by token.
template <class L>
tensor_view<const typename L::T> run_cached(L& layer, tensor_view<const typename L::T> x, const decode_step& step) {
  static_assert(check_generating_hidden_layer<L>());
  if constexpr (cached_hidden_layer<L>) return layer.forward_cached(x, step);
  else return layer.forward(x);
}

// Lets `layer` go of its cache (nothing, for a layer without one).
template <class L>
void drop_cache(L& layer) {
  if constexpr (cached_hidden_layer<L>) layer.release_cache();
}

}  // namespace strata
