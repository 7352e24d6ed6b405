// strata/parallel/data_parallel.hpp - data parallelism with ZeRO stages 0 and 1 over any
// communicator.
//
// Every data-parallel rank runs the whole model on its slice of the global batch; then:
//   stage 0  each bucket of gradients is all-reduced (averaged); every rank updates every weight.
//   stage 1  each bucket is reduce-scattered (averaged) so a rank holds the reduced gradients
//            of the piece it owns; the optimizer (fp32 master weights and moments) exists only
//            for that piece; after the update each bucket's weights are all-gathered.
// Both move 2Ψ(n-1)/n elements per rank per step. Buckets follow backward order (dp_layout).
// Gradient norms are global: squares summed over the owned pieces, then over the group.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "strata/comm/communicator.hpp"
#include "strata/core/memory.hpp"
#include "strata/kernels/host/reduce.hpp"
#include "strata/layers/parameters.hpp"
#include "strata/parallel/dp_layout.hpp"

namespace strata {

struct data_parallel_options {
  int zero_stage = 0;
  std::int64_t bucket_elems = 1 << 20;  // elements per gradient bucket (4 MiB of fp32)
};

template <class P, communicator Comm>
class data_parallel {
 public:
  using T = typename P::storage;

  data_parallel(parameter_store<T>& params, Comm& group, data_parallel_options o)
      : params_(&params), group_(&group), opt_(o), layout_(params.entries(), group.size(), group.rank(), o.bucket_elems) {
    STRATA_CHECK(o.zero_stage == 0 || o.zero_stage == 1, "data_parallel: ZeRO stage ", o.zero_stage,
                 " is not available yet (stages 0 and 1 are)");
    if (o.zero_stage == 1)
      reduced_ = buffer<T>(params.ledger(), memory_category::communication,
                           static_cast<std::size_t>(layout_.owned_elements()));
  }

  int zero_stage() const { return opt_.zero_stage; }
  const dp_layout& layout() const { return layout_; }
  Comm& group() { return *group_; }

  // The rows of a global batch of `batch` sequences this rank trains on.
  std::pair<std::int64_t, std::int64_t> local_rows(std::int64_t batch) const {
    const int n = group_->size();
    STRATA_CHECK(batch % n == 0, "data parallelism: global batch ", batch, " does not divide over dp = ", n, " ranks");
    return {group_->rank() * (batch / n), batch / n};
  }

  // What the optimizer updates on this rank, and the size of its state.
  std::vector<owned_segment> optimizer_segments() const {
    if (opt_.zero_stage == 0) {
      std::vector<owned_segment> all;
      for (const auto& e : params_->entries()) all.push_back({e.offset, e.offset, e.numel, e.weight_decay});
      return all;
    }
    return layout_.owned_segments();
  }
  std::int64_t optimizer_elements() const {
    return opt_.zero_stage == 0 ? params_->size() : layout_.owned_elements();
  }

  // After the last micro-batch's backward: reduce every bucket (all posted, then all waited).
  void reduce_gradients() {
    T* g = params_->grads_data();
    std::vector<comm_handle> pending;
    pending.reserve(layout_.buckets().size());
    std::int64_t state = 0;
    for (const auto& b : layout_.buckets()) {
      std::span<T> grads(g + b.range.begin, static_cast<std::size_t>(b.range.size()));
      if (opt_.zero_stage == 0) {
        pending.push_back(group_->all_reduce_async(grads, reduce_op::avg));
      } else {
        const auto mine = static_cast<std::size_t>(b.owned(layout_.rank()).size());
        std::span<T> out(reduced_.data() + state, mine);
        pending.push_back(
            group_->reduce_scatter_async(std::span<const T>(grads), out, std::span<const std::size_t>(b.counts),
                                         reduce_op::avg));
        state += static_cast<std::int64_t>(mine);
      }
    }
    for (auto& h : pending) h.wait();
  }

  // Σ g² over the whole model's (reduced) gradients, the same on every rank.
  double grad_sum_of_squares() {
    if (opt_.zero_stage == 0)
      return kernels::sum_of_squares(device{}, params_->grads_data(), params_->size());
    double local = kernels::sum_of_squares(device{}, reduced_.data(), layout_.owned_elements());
    group_->all_reduce(std::span<double>(&local, 1), reduce_op::sum);
    return local;
  }

  // Reduced gradients indexed like the optimizer state (ZeRO-1), or null (read the flat buffer).
  const T* state_gradients() const { return opt_.zero_stage == 1 ? reduced_.data() : nullptr; }

  // After the optimizer step: ZeRO-1 ranks share their updated pieces.
  void share_weights() {
    if (opt_.zero_stage == 0) return;
    T* w = params_->weights_data();
    std::vector<comm_handle> pending;
    for (const auto& b : layout_.buckets()) {
      const flat_range mine = b.owned(layout_.rank());
      std::span<const T> in(w + mine.begin, static_cast<std::size_t>(mine.size()));
      std::span<T> out(w + b.range.begin, static_cast<std::size_t>(b.range.size()));
      pending.push_back(group_->all_gather_async(in, out, std::span<const std::size_t>(b.counts)));
    }
    for (auto& h : pending) h.wait();
  }

  // The mean of a per-rank value (the loss) over the group.
  double mean(double value) {
    group_->all_reduce(std::span<double>(&value, 1), reduce_op::avg);
    return value;
  }

 private:
  using device = typename P::device;
  parameter_store<T>* params_;
  Comm* group_;
  data_parallel_options opt_;
  dp_layout layout_;
  buffer<T> reduced_;  // ZeRO-1: this rank's reduced gradient pieces
};

}  // namespace strata
