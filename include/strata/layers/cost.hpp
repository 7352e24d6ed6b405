// strata/layers/cost.hpp - what a layer costs, as a constexpr value the planner adds up.
//
// Every layer states its costs in one function next to the code that incurs them:
//   static constexpr layer_cost cost(const config& c, const cost_scope& s);
// for one micro-batch of s.batch sequences of s.seq tokens, on one rank of a tensor-parallel
// group split as s.tp and of a context-parallel group of s.cp ranks (each holding s.seq/s.cp
// tokens of every sequence: rows() counts this rank's tokens). A composite layer sums its parts (a.then(b): b runs
// after a, so the output is b's). The planner (plan/plan.hpp) adds the parts of a model under a layout; the tests hold
// the sums to what the allocator and the byte counters really see.
//
// For the planner's time model (plan/time_model.hpp) a layer also says what kind of work its
// FLOPs are: matrix products by shape (gemm_list), the attention core, and the bytes its
// element- and row-wise kernels read and write (memory-bound work).
#pragma once
#include <cstdint>

#include "strata/core/error.hpp"

#include "strata/layers/tensor_split.hpp"
#include "strata/layers/context_split.hpp"
#include "strata/policy/recompute.hpp"

namespace strata {

struct cost_scope {
  tensor_split tp{};
  std::int64_t batch = 1, seq = 1;                  // one micro-batch
  recompute_mode recompute = recompute_mode::none;  // what recompute<recompute_from_context, L> does
  int cp = 1;                                       // context-parallel degree
  context_form form = context_form::ring;           // how attention reaches the other context ranks
  int ep = 1;                                       // expert-parallel degree: a mixture holds 1/ep of its experts

  // This rank's tokens of each sequence, and of the micro-batch.
  constexpr std::int64_t local_seq() const { return seq / cp; }
  constexpr std::int64_t rows() const { return batch * local_seq(); }
  // Tokens held between tensor-parallel regions (a 1/t share under sequence parallelism).
  constexpr std::int64_t local_rows() const { return tp.local_rows(rows()); }
};

// One matrix product C[m x n] = A[m x k] B[k x n].
struct gemm_shape {
  std::int64_t m = 0, n = 0, k = 0;
  constexpr double flops() const { return 2.0 * double(m) * double(n) * double(k); }
  bool operator==(const gemm_shape&) const = default;
};

// The distinct matrix products of a layer, each with how many times one micro-batch runs it.
// A fixed capacity keeps it a constexpr value; equal shapes share an entry.
class gemm_list {
 public:
  struct entry {
    gemm_shape shape{};
    std::int64_t count = 0;
    bool operator==(const entry&) const = default;
  };
  static constexpr int capacity = 40;

  constexpr void add(const gemm_shape& s, std::int64_t count = 1) {
    if (count == 0 || s.m == 0 || s.n == 0 || s.k == 0) return;
    for (int i = 0; i < size_; ++i)
      if (items_[i].shape == s) {
        items_[i].count += count;
        return;
      }
    if (size_ == capacity) fail("gemm_list: more than ", capacity, " distinct matrix-product shapes in one plan");
    items_[size_++] = {s, count};
  }
  constexpr gemm_list& operator+=(const gemm_list& o) {
    for (int i = 0; i < o.size_; ++i) add(o.items_[i].shape, o.items_[i].count);
    return *this;
  }
  constexpr gemm_list times(std::int64_t n) const {
    gemm_list r = *this;
    for (int i = 0; i < r.size_; ++i) r.items_[i].count *= n;
    if (n == 0) r.size_ = 0;
    return r;
  }
  constexpr int size() const { return size_; }
  constexpr const entry* begin() const { return items_; }
  constexpr const entry* end() const { return items_ + size_; }
  constexpr double flops() const {
    double f = 0;
    for (const entry& e : *this) f += e.shape.flops() * double(e.count);
    return f;
  }
  constexpr bool operator==(const gemm_list& o) const {
    if (size_ != o.size_) return false;
    for (int i = 0; i < size_; ++i)
      if (!(items_[i] == o.items_[i])) return false;
    return true;
  }

 private:
  entry items_[capacity]{};
  int size_ = 0;
};

// A linear map y[rows x out] = x[rows x in] W: forward's product, and backward's two (the
// input gradient, and the weight gradient whose inner dimension is the rows).
constexpr void add_linear_gemms(gemm_list& forward, gemm_list& backward, std::int64_t rows, std::int64_t in,
                                std::int64_t out, std::int64_t count = 1) {
  forward.add({rows, out, in}, count);
  backward.add({rows, in, out}, count);
  backward.add({out, in, rows}, count);
}

struct layer_cost {
  std::int64_t params = 0;         // parameter elements this rank registers
  std::int64_t tied_params = 0;    // elements of a parameter another layer owns (held again, as a
                                   // replica, where that layer sits on another pipeline stage)
  std::int64_t idle_params = 0;    // of `params`, those a token does not use (experts it is not routed to)
  std::int64_t expert_params = 0;  // of `params`, a mixture's experts (this rank's share under expert
                                   // parallelism, which ZeRO cuts over the dp·cp/ep ranks holding them)
  std::int64_t forward_flops = 0, backward_flops = 0;
  std::int64_t activation_bytes = 0;                           // kept from forward to backward
  std::int64_t output_bytes = 0;                               // the output alone: the next layer's input, and all that
                                                               // full recomputation keeps
  std::int64_t core_bytes = 0;                                 // what selective recomputation drops...
  std::int64_t core_flops = 0;                                 // ...and what recomputing it costs
  double tensor_forward_bytes = 0, tensor_backward_bytes = 0;  // sent per rank in the tensor group
  double context_forward_bytes = 0, context_backward_bytes = 0;  // sent per rank in the context group
  double expert_forward_bytes = 0, expert_backward_bytes = 0;    // sent per rank in the expert group
  // The activation memory's highs in one step, on top of what is already held:
  //   forward_peak_bytes   the most held during forward above what was held when it began, the
  //                        layer's kept activations included (buffers that live only during the
  //                        call come on top of them; 0: just the kept ones, forward_high());
  //   backward_peak_bytes  the most held during backward above everything kept and the output
  //                        gradient it was handed, the input gradient it returns included.
  std::int64_t forward_peak_bytes = 0, backward_peak_bytes = 0;
  // The kinds of work, for the time model: matrix products by shape; the attention core's
  // FLOPs (scores, softmax, values: one fused kernel); bytes read and written by the element-
  // and row-wise kernels (norms, activations, residual sums, embedding, the loss); and the
  // entries of attention's score matrix, which a kernel that writes them out would move.
  gemm_list forward_gemms{}, backward_gemms{};
  double attention_forward_flops = 0, attention_backward_flops = 0;
  double attention_forward_scores = 0, attention_backward_scores = 0;
  double memory_forward_bytes = 0, memory_backward_bytes = 0;

  constexpr std::int64_t forward_high() const {
    return forward_peak_bytes > activation_bytes ? forward_peak_bytes : activation_bytes;
  }

  // `next` runs after this: everything adds up, the output is next's.
  // Forward: next runs while this layer's kept activations are held. Backward: next's runs
  // first and hands back the gradient of this layer's output, held while this layer's runs.
  constexpr layer_cost then(const layer_cost& next) const {
    layer_cost r = *this + next;
    r.output_bytes = next.output_bytes;
    r.forward_peak_bytes = max_of(forward_high(), activation_bytes + next.forward_high());
    r.backward_peak_bytes = max_of(next.backward_peak_bytes, output_bytes + backward_peak_bytes);
    return r;
  }
  // n copies one after another.
  constexpr layer_cost repeated(std::int64_t n) const {
    layer_cost r;
    r.params = n * params;
    r.tied_params = n * tied_params;
    r.idle_params = n * idle_params;
    r.expert_params = n * expert_params;
    r.forward_flops = n * forward_flops;
    r.backward_flops = n * backward_flops;
    r.activation_bytes = n * activation_bytes;
    r.output_bytes = output_bytes;
    r.core_bytes = n * core_bytes;
    r.core_flops = n * core_flops;
    r.tensor_forward_bytes = double(n) * tensor_forward_bytes;
    r.tensor_backward_bytes = double(n) * tensor_backward_bytes;
    r.context_forward_bytes = double(n) * context_forward_bytes;
    r.context_backward_bytes = double(n) * context_backward_bytes;
    r.expert_forward_bytes = double(n) * expert_forward_bytes;
    r.expert_backward_bytes = double(n) * expert_backward_bytes;
    r.forward_gemms = forward_gemms.times(n);
    r.backward_gemms = backward_gemms.times(n);
    r.attention_forward_flops = double(n) * attention_forward_flops;
    r.attention_backward_flops = double(n) * attention_backward_flops;
    r.attention_forward_scores = double(n) * attention_forward_scores;
    r.attention_backward_scores = double(n) * attention_backward_scores;
    r.memory_forward_bytes = double(n) * memory_forward_bytes;
    r.memory_backward_bytes = double(n) * memory_backward_bytes;
    r.forward_peak_bytes = (n - 1) * activation_bytes + forward_high();
    r.backward_peak_bytes = n > 1 ? output_bytes + backward_peak_bytes : backward_peak_bytes;
    return r;
  }
  // Side by side (two branches over the same input): everything adds up, outputs included.
  constexpr layer_cost operator+(const layer_cost& o) const {
    layer_cost r = *this;
    r.params += o.params;
    r.tied_params += o.tied_params;
    r.idle_params += o.idle_params;
    r.expert_params += o.expert_params;
    r.forward_flops += o.forward_flops;
    r.backward_flops += o.backward_flops;
    r.activation_bytes += o.activation_bytes;
    r.output_bytes += o.output_bytes;
    r.core_bytes += o.core_bytes;
    r.core_flops += o.core_flops;
    r.tensor_forward_bytes += o.tensor_forward_bytes;
    r.tensor_backward_bytes += o.tensor_backward_bytes;
    r.context_forward_bytes += o.context_forward_bytes;
    r.context_backward_bytes += o.context_backward_bytes;
    r.expert_forward_bytes += o.expert_forward_bytes;
    r.expert_backward_bytes += o.expert_backward_bytes;
    r.forward_gemms += o.forward_gemms;
    r.backward_gemms += o.backward_gemms;
    r.attention_forward_flops += o.attention_forward_flops;
    r.attention_backward_flops += o.attention_backward_flops;
    r.attention_forward_scores += o.attention_forward_scores;
    r.attention_backward_scores += o.attention_backward_scores;
    r.memory_forward_bytes += o.memory_forward_bytes;
    r.memory_backward_bytes += o.memory_backward_bytes;
    // At most both at once.
    r.forward_peak_bytes = forward_high() + o.forward_high();
    r.backward_peak_bytes += o.backward_peak_bytes;
    return r;
  }
  static constexpr std::int64_t max_of(std::int64_t a, std::int64_t b) { return a > b ? a : b; }
  constexpr double tensor_bytes() const { return tensor_forward_bytes + tensor_backward_bytes; }
  constexpr double context_bytes() const { return context_forward_bytes + context_backward_bytes; }
  constexpr double expert_bytes() const { return expert_forward_bytes + expert_backward_bytes; }
  bool operator==(const layer_cost&) const = default;
};

// Bytes each rank sends in ring collectives over n ranks (comm/counters.hpp counts the same):
// an all-reduce of `bytes` sends 2(n-1)/n of them, an all-gather or reduce-scatter (n-1)/n of the
// whole.
constexpr double ring_all_reduce_bytes(double bytes, int n) { return n > 1 ? 2.0 * (n - 1) / n * bytes : 0.0; }
constexpr double ring_gather_bytes(double bytes, int n) { return n > 1 ? double(n - 1) / n * bytes : 0.0; }

}  // namespace strata
