// strata/layers/tensor_parallel.hpp - what a layer needs to run sharded over a tensor-parallel
// group, and the conjugate operators at the edges of a sharded region, written once.
//
// Megatron-style tensor parallelism over t ranks: a column-parallel layer splits its output
// features (each rank computes out/t of them from the whole input), a row-parallel layer splits
// its input features (each rank's product is a partial sum of the whole output). A region is
// column-parallel layer, local work, row-parallel layer; its edges are:
//
//                   entering (before column-parallel)     leaving (after row-parallel)
//   tensor only     forward identity                       forward all-reduce
//                   backward all-reduce                    backward identity
//   + sequence      forward all-gather along the sequence  forward reduce-scatter along it
//     parallel      backward reduce-scatter                backward all-gather
//
// Between regions (LayerNorm, residuals) activations are whole on every rank (tensor only) or
// a 1/t piece of the tokens (sequence parallel). Under sequence parallelism a rank's activations
// [B, T/t, C] hold tokens r·(B·T/t) .. (r+1)·(B·T/t)-1 of the flattened [B·T] tokens: a
// contiguous piece, so the gathers and scatters need no reordering, and every op between
// regions works token by token, so which tokens a rank holds does not matter to it.
//
// A layer written outside strata uses the same two edges: enter_forward/enter_backward and
// leave_forward/leave_backward below.
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "strata/comm/group_ref.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/core/tensor.hpp"
#include "strata/layers/cost.hpp"
#include "strata/layers/tensor_split.hpp"

namespace strata {

// Bytes a rank sends at the region edges for `bytes` of whole activations ([B, T, C] of every
// token), by the operators below: what layers add up in their costs.
struct tensor_edge_bytes {
  static constexpr double enter_forward(const tensor_split& s, double bytes) {
    return s.sequence_parallel ? ring_gather_bytes(bytes, s.degree) : 0.0;
  }
  static constexpr double enter_backward(const tensor_split& s, double bytes) {
    return s.sequence_parallel ? ring_gather_bytes(bytes, s.degree) : ring_all_reduce_bytes(bytes, s.degree);
  }
  static constexpr double leave_forward(const tensor_split& s, double bytes) {
    return s.sequence_parallel ? ring_gather_bytes(bytes, s.degree) : ring_all_reduce_bytes(bytes, s.degree);
  }
  static constexpr double leave_backward(const tensor_split& s, double bytes) {
    return s.sequence_parallel ? ring_gather_bytes(bytes, s.degree) : 0.0;
  }
};

// A model's tensor-parallel group and mode. Default: a group of one (nothing is split).
class tensor_parallel {
 public:
  tensor_parallel() = default;
  tensor_parallel(group_ref group, bool sequence_parallel) : group_(std::move(group)), sp_(sequence_parallel) {}

  int degree() const { return group_.size(); }
  int rank() const { return group_.rank(); }
  bool sequence_parallel() const { return sp_ && !paused_ && degree() > 1; }
  tensor_split split() const { return {degree(), sequence_parallel()}; }
  group_ref& group() { return group_; }

  // Generation feeds one position at a time, which no sequence split divides: while the returned
  // guard lives the region edges are plain tensor parallelism's (identity in, all-reduce out) and
  // every rank holds the whole tokens between regions. The weights are the same pieces.
  class sequence_split_pause {
   public:
    explicit sequence_split_pause(tensor_parallel& tp) : tp_(&tp), was_(tp.paused_) { tp.paused_ = true; }
    ~sequence_split_pause() { tp_->paused_ = was_; }
    sequence_split_pause(const sequence_split_pause&) = delete;
    sequence_split_pause& operator=(const sequence_split_pause&) = delete;

   private:
    tensor_parallel* tp_;
    bool was_;
  };
  [[nodiscard]] sequence_split_pause pause_sequence_split() { return sequence_split_pause(*this); }

  // Entering a region: the whole input of a column-parallel layer. Under sequence parallelism
  // the local [B, T/t, C] pieces are gathered into `full` ([B, T, C]); otherwise x is returned.
  template <class T>
  tensor_view<const T> enter_forward(tensor_view<const T> x, buffer<T>& full, memory_ledger& ledger,
                                     memory_category category = memory_category::activations) {
    if (!sequence_parallel()) return x;
    strata::shape s = x.shape;
    s.dims[static_cast<std::size_t>(s.rank - 2)] *= degree();
    if (static_cast<std::int64_t>(full.size()) != s.numel())
      full = buffer<T>(ledger, category, static_cast<std::size_t>(s.numel()));
    group_.all_gather(std::span<const T>(x.data, static_cast<std::size_t>(x.numel())),
                      std::span<T>(full.data(), full.size()));
    return {full.data(), s};
  }
  // Entering a region, backward: the input gradient a column-parallel layer computed from its
  // output features is a partial sum; all-reduced in place, or reduce-scattered to this rank's
  // tokens (a new buffer).
  template <class T>
  buffer<T> enter_backward(buffer<T>&& dx, memory_ledger& ledger) {
    if (degree() == 1) return std::move(dx);
    if (!sequence_parallel()) {
      group_.all_reduce(std::span<T>(dx.data(), dx.size()));
      return std::move(dx);
    }
    buffer<T> mine(ledger, memory_category::activations, dx.size() / static_cast<std::size_t>(degree()));
    group_.reduce_scatter(std::span<const T>(dx.data(), dx.size()), std::span<T>(mine.data(), mine.size()));
    return mine;
  }

  // Leaving a region: a row-parallel layer's partial sums [B, T, C]. All-reduced in place
  // (returns a view of `partial`), or reduce-scattered into `out` ([B, T/t, C]).
  template <class T>
  tensor_view<const T> leave_forward(buffer<T>& partial, strata::shape full_shape, buffer<T>& out,
                                     memory_ledger& ledger) {
    if (!sequence_parallel()) {
      group_.all_reduce(std::span<T>(partial.data(), partial.size()));
      return {partial.data(), full_shape};
    }
    strata::shape s = full_shape;
    s.dims[static_cast<std::size_t>(s.rank - 2)] /= degree();
    if (static_cast<std::int64_t>(out.size()) != s.numel())
      out = buffer<T>(ledger, memory_category::activations, static_cast<std::size_t>(s.numel()));
    group_.reduce_scatter(std::span<const T>(partial.data(), partial.size()), std::span<T>(out.data(), out.size()));
    return {out.data(), s};
  }
  // Leaving a region, backward: the output gradient for every token. Under sequence
  // parallelism the local pieces are gathered into `full`; otherwise dy itself is returned.
  template <class T>
  const buffer<T>& leave_backward(const buffer<T>& dy, buffer<T>& full, memory_ledger& ledger) {
    if (!sequence_parallel()) return dy;
    full = buffer<T>(ledger, memory_category::activations, dy.size() * static_cast<std::size_t>(degree()));
    group_.all_gather(std::span<const T>(dy.data(), dy.size()), std::span<T>(full.data(), full.size()));
    return full;
  }

  template <class T>
  void sum_over_group(std::span<T> partial) {
    if (degree() > 1) group_.all_reduce(partial);
  }

 private:
  group_ref group_;
  bool sp_ = false, paused_ = false;
};

}  // namespace strata
