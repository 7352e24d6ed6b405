// strata/parallel/data_parallel.hpp - data parallelism with ZeRO stages 0 to 3 over any
// communicator.
//
// Every data-parallel rank runs the whole model on its slice of the global batch; then:
//   stage 0  each bucket of gradients is all-reduced (averaged); every rank updates every weight.
//   stage 1  each bucket is reduce-scattered (averaged) so a rank holds the reduced gradients
//            of the piece it owns; the optimizer (fp32 master weights and moments) exists only
//            for that piece; after the update each bucket's weights are all-gathered.
//   stage 2  as stage 1, and no full gradient buffer exists: backward adds each bucket's
//            gradients into a buffer made when the bucket is first touched and freed once its
//            reduce-scatter has been added to the rank's owned gradients; at most two bucket
//            reductions are in flight, so the gradient bytes stay at 4Ψ/N plus a few buckets.
//            Each micro-batch communicates (a gradient kept across micro-batches would be a
//            full one).
//   stage 3  as stage 2, and each rank keeps only its pieces of the weights too: a bucket's
//            weights are all-gathered when a layer first asks for them (forward, then again in
//            backward) and the next bucket's gather is started at the same time (prefetch); at
//            most three buckets stay resident (least recently used go first; the bucket of a
//            tied table stays for the whole pass), and all are freed when the pass ends.
//            3Ψ(n-1)/n elements per rank per step: two gathers and one reduce-scatter.
// Both move 2Ψ(n-1)/n elements per rank per step. Buckets follow backward order (dp_layout).
// Gradient norms are global: squares summed over the owned pieces, then over the group. With
// tensor parallelism (options.tensor_group) each rank holds pieces of the sharded parameters
// and a copy of the replicated ones: the squares are summed over that group too, a replicated
// parameter's counted 1/t on each of the t ranks so that it counts once. With pipeline
// parallelism (options.pipeline_group) each stage holds its own layers: the squares are summed
// over the stages, a stage's copy of a parameter another stage owns (a tied table) counting 0.
//
// Expert parallelism (the constructor with an expert-data group): a rank holds only its share of a
// mixture's experts, having run every token of its expert group through them, so their
// gradients are reduced over the ranks holding the same experts (dp·cp/ep of them) and ZeRO cuts
// their buckets over those. The average over that group is divided by ep once more, so an
// expert's gradient is the mean over all dp·cp ranks' batches, as a dense parameter's. In the
// gradient norm each expert counts once: its pieces (or, under ZeRO-0, its copies weighted
// 1/copies) summed over the gradient group.
//
// Overlap: during the last micro-batch's backward the parameter store reports each parameter
// whose gradient is final (layers call grad_written); the bucket whose last parameter that was
// is posted at once, asynchronously, and pending buckets are nudged along each time another
// parameter finishes, so the reduction runs while backward computes the layers below. Each
// bucket's post and completion times are kept for the hidden-communication figure.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "strata/comm/communicator.hpp"
#include "strata/comm/group_ref.hpp"
#include "strata/core/extents.hpp"
#include "strata/core/memory.hpp"
#include "strata/core/profile.hpp"
#include "strata/kernels/reduce.hpp"
#include "strata/kernels/residual.hpp"
#include "strata/layers/parameters.hpp"
#include "strata/parallel/dp_layout.hpp"
#include "strata/parallel/gradient_synchronizer.hpp"

namespace strata {

struct data_parallel_options {
  static constexpr int from_policy = -1;
  int zero_stage = from_policy;         // the policy's data<N, zero<S>> unless given here (e.g. by a flag)
  std::int64_t bucket_elems = 1 << 20;  // elements per gradient bucket (4 MiB of fp32)
  group_ref tensor_group{};             // the tensor-parallel group, for global gradient norms
  group_ref pipeline_group{};           // the pipeline group, likewise
  // Context parallelism: the group spans dp × cp (cp fastest, comm/mesh_position.hpp); the cp
  // ranks of one data-parallel rank hold the same sequences' other tokens.
  int context_degree = 1;
};

template <class P, communicator Comm>
class data_parallel {
 public:
  using T = typename P::storage;

  data_parallel(parameter_store<T>& params, Comm& group, data_parallel_options o)
      : data_parallel(params, group, group, o) {}
  // With expert parallelism: `expert_group` holds the ranks of `group` with the same experts as
  // this one (the parameters marked expert); `group` itself when there is none.
  data_parallel(parameter_store<T>& params, Comm& group, Comm& expert_group, data_parallel_options o)
      : params_(&params),
        group_(&group),
        experts_(&expert_group),
        opt_(with_stage(o)),
        layout_(params.entries(), group.size(), group.rank(), o.bucket_elems, expert_group.size(),
                expert_group.rank()) {
    o = opt_;
    STRATA_CHECK(group.size() % expert_group.size() == 0, "data_parallel: an expert-data group of ",
                 expert_group.size(), " ranks does not divide the gradient group of ", group.size());
    expert_degree_ = group.size() / expert_group.size();
    for (const auto& e : params.entries())
      STRATA_CHECK(!e.expert || expert_degree_ > 1 || &expert_group == &group, "data_parallel: '", e.name,
                   "' is one of a rank's share of experts, but no expert-data group was given");
    STRATA_CHECK(o.zero_stage >= 0 && o.zero_stage <= 3, "data_parallel: ZeRO stage ", o.zero_stage,
                 " does not exist (stages 0, 1, 2 and 3 do)");
    // ZeRO-1 keeps its reduced pieces beside the full gradients (a communication buffer); under
    // ZeRO-2 they are the only gradients the rank keeps.
    if (o.zero_stage >= 1)
      reduced_ =
          buffer<T>(params.ledger(), o.zero_stage >= 2 ? memory_category::gradients : memory_category::communication,
                    static_cast<std::size_t>(layout_.owned_elements()));
    // Which bucket each parameter falls in, and each bucket's parameter count.
    const auto& buckets = layout_.buckets();
    bucket_of_.resize(params.entries().size());
    bucket_params_.assign(buckets.size(), 0);
    for (std::size_t i = 0; i < params.entries().size(); ++i) {
      const auto off = params.entries()[i].offset;
      for (std::size_t b = 0; b < buckets.size(); ++b)
        if (off >= buckets[b].range.begin && off < buckets[b].range.end) {
          bucket_of_[i] = b;
          ++bucket_params_[b];
        }
    }
    state_offset_.resize(buckets.size());
    std::int64_t state = 0;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      state_offset_[b] = state;
      state += static_cast<std::int64_t>(layout_.owned(buckets[b]).size());
    }
    params.set_grad_ready_hook([this](param_handle h) { on_grad_ready(h); });
    if (o.zero_stage >= 2) {
      staging_.resize(buckets.size());
      pieces_.resize(buckets.size());
      params.use_grad_source([this](param_handle h) { return bucket_gradient(h); });
    }
    if (o.zero_stage == 3) {
      // Keep this rank's pieces of the initial weights, then let the full buffer go.
      shard_ =
          buffer<T>(params.ledger(), memory_category::parameters, static_cast<std::size_t>(layout_.owned_elements()));
      const T* w = params.weights_data();
      for (const auto& seg : layout_.owned_segments())
        shard_.copy_within(w + seg.flat, static_cast<std::size_t>(seg.count), static_cast<std::size_t>(seg.state));
      gathered_.resize(buckets.size());
      prefetch_.resize(buckets.size());
      pinned_.assign(buckets.size(), false);
      for (std::size_t i = 0; i < params.entries().size(); ++i)
        if (params.entries()[i].writers > 1) pinned_[bucket_of_[i]] = true;
      params.use_weight_source([this](param_handle h) { return bucket_weights(h); });
    }
  }
  ~data_parallel() {
    params_->set_grad_ready_hook({});
    if (opt_.zero_stage >= 2) params_->use_grad_source({});
    if (opt_.zero_stage == 3) params_->use_weight_source({});
  }
  data_parallel(const data_parallel&) = delete;
  data_parallel& operator=(const data_parallel&) = delete;

  int zero_stage() const { return opt_.zero_stage; }
  const dp_layout& layout() const { return layout_; }
  Comm& group() { return *group_; }
  parameter_store<T>& parameters() const { return *params_; }
  // For messages: "data_parallel ZeRO-1 over dp=2 (this rank updates 1234 of 5000 elements)"
  // ("over dp=2 x cp=2" under context parallelism).
  std::string description() const {
    const std::string cp = opt_.context_degree > 1 ? " x cp=" + std::to_string(opt_.context_degree) : "";
    const std::string ep = expert_degree_ > 1 ? ", experts over ep=" + std::to_string(expert_degree_) : "";
    return detail::concat("data_parallel ZeRO-", opt_.zero_stage, " over dp=", group_->size() / opt_.context_degree, cp,
                          ep, " (this rank updates ", optimizer_elements(), " of ", params_->size(), " elements)");
  }

  // The rows of a global batch of `batch` sequences this rank trains on: the context ranks of
  // one data-parallel rank (consecutive in the group) take the same rows.
  std::pair<std::int64_t, std::int64_t> local_rows(std::int64_t batch) const {
    STRATA_CHECK(group_->size() % opt_.context_degree == 0, "data parallelism: a group of ", group_->size(),
                 " ranks is not dp x cp with cp = ", opt_.context_degree);
    const int n = group_->size() / opt_.context_degree;
    STRATA_CHECK(batch % n == 0, "data parallelism: global batch ", batch, " does not divide over dp = ", n, " ranks");
    return {group_->rank() / opt_.context_degree * (batch / n), batch / n};
  }

  // What the optimizer updates on this rank, and the size of its state.
  std::vector<owned_segment> optimizer_segments() const {
    if (opt_.zero_stage == 0) return whole_model_segments(*params_);
    return layout_.owned_segments();
  }
  std::int64_t optimizer_elements() const { return opt_.zero_stage == 0 ? params_->size() : layout_.owned_elements(); }

  // At the start of a step: ZeRO 2/3 sum the micro-batches' reduced pieces from zero.
  void begin_step() {
    if (opt_.zero_stage >= 2) reduced_.zero();
  }
  // After a forward: ZeRO-3 lets every gathered bucket go (backward gathers what it needs).
  void after_forward() {
    release_gathered();
    backward_pass_ = true;
  }

  // Before a backward: post each bucket as soon as its gradients are final, when this backward
  // communicates (the last micro-batch's, or every one under ZeRO-2).
  void before_backward(bool last) {
    if (!last && opt_.zero_stage < 2) return;  // ZeRO 0/1: earlier micro-batches only accumulate
    pending_.clear();
    pending_.resize(layout_.buckets().size());
    posted_.assign(layout_.buckets().size(), false);
    left_ = bucket_params_;
    timing_.assign(layout_.buckets().size(), {});
    params_->arm_grad_ready_hook();
  }

  // After a backward that communicates: post what is left, wait for all of it.
  void after_backward(bool last) {
    if (!last && opt_.zero_stage < 2) return;
    in_flight_.clear();
    backward_end_ = clock::now();
    params_->disarm_grad_ready_hook();
    for (std::size_t b = 0; b < layout_.buckets().size(); ++b)
      if (!posted_[b]) post(b);
    for (std::size_t b = 0; b < pending_.size(); ++b) {
      pending_[b].wait();
      complete(b);
    }
    release_gathered();
    backward_pass_ = false;
  }

  // ZeRO-3: gathers found already posted (prefetched) when a layer first asked, since construction.
  long prefetch_hits() const { return prefetch_hits_; }

  // Every weight of the model, in host memory, gathered (ZeRO-3), or copied from the flat buffer:
  // for checks, exports and checkpoints. Collective under ZeRO-3.
  std::vector<T> full_weights() {
    std::vector<T> out(static_cast<std::size_t>(params_->size()));
    if (opt_.zero_stage < 3) {
      if (!out.empty())
        params_->ledger().space().copy(out.data(), params_->weights_data(), out.size() * sizeof(T),
                                       copy_direction::space_to_host);
      return out;
    }
    for (std::size_t b = 0; b < layout_.buckets().size(); ++b) {
      const auto& bucket = layout_.buckets()[b];
      const flat_range mine = layout_.owned(bucket);
      shard_.download(out.data() + mine.begin, static_cast<std::size_t>(mine.size()),
                      static_cast<std::size_t>(state_offset_[b]));
      group_of(bucket).all_gather(
          std::span<const T>(out.data() + mine.begin, static_cast<std::size_t>(mine.size())),
          std::span<T>(out.data() + bucket.range.begin, static_cast<std::size_t>(bucket.range.size())),
          std::span<const std::size_t>(bucket.counts));
    }
    return out;
  }

  // ZeRO-3: this rank's pieces of the weights, indexed like the optimizer state (else null).
  T* state_weights() { return opt_.zero_stage == 3 ? shard_.data() : nullptr; }

  // Largest number of gradient bytes held at once during the last steps' backwards (ZeRO-2:
  // the owned pieces plus the bucket buffers alive together).
  std::size_t peak_gradient_bytes() const { return params_->ledger().peak(memory_category::gradients); }

  // Of the time the gradient reductions were in flight, the share that passed while backward
  // was still running (from the last step's per-bucket post and completion times).
  double hidden_share() const {
    double total = 0, hidden = 0;
    for (const auto& t : timing_) {
      const double span = std::chrono::duration<double>(t.done - t.posted).count();
      const auto overlap_end = std::min(t.done, backward_end_);
      total += span;
      if (overlap_end > t.posted) hidden += std::chrono::duration<double>(overlap_end - t.posted).count();
    }
    return total > 0 ? hidden / total : 0.0;
  }
  // Buckets posted before backward ended in the last step.
  int buckets_posted_during_backward() const {
    int n = 0;
    for (const auto& t : timing_) n += t.posted != clock::time_point{} && t.posted < backward_end_;
    return n;
  }

  // *out = Σ g² over the whole model's (reduced) gradients, the same on every rank. out is in the
  // model's memory space; the sums and the group reductions happen there (on a GPU: kernels, and
  // collectives the host waits for as for any other), and the host never reads the value.
  void grad_sum_of_squares_into(double* out) {
    STRATA_PROFILE("grad_norm");
    auto& tp = opt_.tensor_group;
    auto& pp = opt_.pipeline_group;
    const std::span<double> sum(out, 1);
    if (tp.size() == 1 && pp.size() == 1 && expert_degree_ == 1) {
      if (opt_.zero_stage == 0) {
        kernels::sum_of_squares_into(device{}, params_->grads_data(), params_->size(), out);
        return;
      }
      // ZeRO 1 and 2: the owned pieces, then summed over the group.
      kernels::sum_of_squares_into(device{}, reduced_.data(), layout_.owned_elements(), out);
      group_->all_reduce(sum, reduce_op::sum);
      return;
    }
    // Parameter by parameter (segment by segment), each weighted by how often it is counted,
    // added to a sum that starts at 0 (an empty sum writes it).
    kernels::sum_of_squares_into(device{}, static_cast<const T*>(nullptr), 0, out);
    if (opt_.zero_stage == 0) {
      // Every rank holds whole copies: under expert parallelism each counts 1/copies, summed over
      // the gradient group (without it, the copies are alike and one rank's sum is the sum).
      const T* g = params_->grads_data();
      for (const auto& e : params_->entries()) {
        const double copies = expert_degree_ == 1 ? 1.0 : double(e.expert ? experts_->size() : group_->size());
        add_weighted_squares(e, g + e.offset, 0, e.numel, out, 1.0 / copies);
      }
      if (expert_degree_ > 1) group_->all_reduce(sum, reduce_op::sum);
    } else {
      for (const auto& seg : layout_.owned_segments()) {
        const param_info& e = entry_at(seg.flat);
        add_weighted_squares(e, reduced_.data() + seg.state, seg.flat - e.offset, seg.count, out);
      }
      group_->all_reduce(sum, reduce_op::sum);
    }
    tp.all_reduce(sum, reduce_op::sum);
    pp.all_reduce(sum, reduce_op::sum);
  }

  // Reduced gradients indexed like the optimizer state (ZeRO-1), or null (read the flat buffer).
  const T* state_gradients() const { return opt_.zero_stage >= 1 ? reduced_.data() : nullptr; }

  // After the optimizer step: ZeRO 1/2 ranks share their updated pieces (ZeRO-3 gathers them
  // when the next forward asks).
  void share_weights() {
    if (opt_.zero_stage == 0 || opt_.zero_stage == 3) return;
    T* w = params_->weights_data();
    std::vector<comm_handle> pending;
    for (const auto& b : layout_.buckets()) {
      const flat_range mine = layout_.owned(b);
      std::span<const T> in(w + mine.begin, static_cast<std::size_t>(mine.size()));
      std::span<T> out(w + b.range.begin, static_cast<std::size_t>(b.range.size()));
      pending.push_back(group_of(b).all_gather_async(in, out, std::span<const std::size_t>(b.counts)));
    }
    for (auto& h : pending) h.wait();
  }

  // The parameter at flat offset `flat`, and its weight in the global gradient norm.
  const param_info& entry_at(std::int64_t flat) const {
    for (const auto& e : params_->entries())
      if (flat >= e.offset && flat < e.offset + e.numel) return e;
    fail("data_parallel: no parameter at flat offset ", flat);
  }
  double norm_weight(const param_info& e) const {
    if (e.replica) return 0.0;
    return e.shard.sharded() ? 1.0 : 1.0 / opt_.tensor_group.size();
  }
  // *out += the weighted squares of e's gradient elements [first, first + count), held at `g`: an
  // element that several ranks of the tensor group hold alike (a shared key/value head) counts
  // 1/holders on each of them.
  void add_weighted_squares(const param_info& e, const T* g, std::int64_t first, std::int64_t count, double* out,
                            double factor = 1.0) const {
    if (!e.shard.has_shared_pieces()) {
      kernels::sum_of_squares_into(device{}, g, count, out, true, factor * norm_weight(e));
      return;
    }
    for (const auto& run : e.shard.holder_runs()) {
      const std::int64_t begin = std::max(run.begin, first), end = std::min(run.end, first + count);
      if (begin < end)
        kernels::sum_of_squares_into(device{}, g + (begin - first), end - begin, out, true, factor / run.holders);
    }
  }

  // The mean of a per-rank value (the loss) over the group.
  double mean(double value) {
    group_->all_reduce(std::span<double>(&value, 1), reduce_op::avg);
    return value;
  }
  // Per-rank values (a router's statistics) averaged, or summed, over the group, in place.
  void mean_each(std::span<double> values) { group_->all_reduce(values, reduce_op::avg); }
  void sum_each(std::span<double> values) { group_->all_reduce(values, reduce_op::sum); }

 private:
  using device = typename P::device;
  using clock = std::chrono::steady_clock;

  static data_parallel_options with_stage(data_parallel_options o) {
    if (o.zero_stage == data_parallel_options::from_policy) {
      STRATA_CHECK(!is_dynamic(P::layout::zero_stage),
                   "data_parallel: the policy leaves the ZeRO stage as "
                   "strata::dynamic; give options.zero_stage");
      o.zero_stage = P::layout::zero_stage;
    }
    STRATA_CHECK(o.context_degree >= 1, "data_parallel: context_degree ", o.context_degree, " must be >= 1");
    return o;
  }
  struct bucket_timing {
    clock::time_point posted, done;
  };

  // The group that reduces bucket b's gradients and gathers its weights.
  Comm& group_of(const dp_bucket& b) { return b.expert ? *experts_ : *group_; }

  void on_grad_ready(param_handle h) {
    const std::size_t b = bucket_of_[static_cast<std::size_t>(h.index)];
    if (--left_[b] == 0) post(b);
    // Nudge the reductions in flight: nonblocking MPI progresses only inside MPI calls.
    for (std::size_t q = 0; q < pending_.size(); ++q)
      if (posted_[q] && pending_[q].pending() && pending_[q].test()) complete(q);
  }

  // ZeRO-2: h's gradient lives in its bucket's buffer, made (zeroed) on first touch.
  T* bucket_gradient(param_handle h) {
    const std::size_t b = bucket_of_[static_cast<std::size_t>(h.index)];
    const auto& bucket = layout_.buckets()[b];
    if (staging_[b].empty())
      staging_[b] =
          buffer<T>(params_->ledger(), memory_category::gradients, static_cast<std::size_t>(bucket.range.size()));
    return staging_[b].data() + (params_->info(h).offset - bucket.range.begin);
  }

  void post(std::size_t b) {
    const auto& bucket = layout_.buckets()[b];
    timing_[b].posted = clock::now();
    const auto mine = static_cast<std::size_t>(layout_.owned(bucket).size());
    Comm& group = group_of(bucket);
    if (opt_.zero_stage >= 2) {
      if (staging_[b].empty()) bucket_gradient(param_handle{first_param_of(b)});  // untouched: zeros
      pieces_[b] = buffer<T>(params_->ledger(), memory_category::communication, mine);
      pending_[b] = group.reduce_scatter_async(std::span<const T>(staging_[b].data(), staging_[b].size()),
                                               std::span<T>(pieces_[b].data(), mine),
                                               std::span<const std::size_t>(bucket.counts), reduce_op::avg);
      // Bound the buckets alive at once: with more than max_in_flight reductions outstanding,
      // finish the oldest before backward goes on.
      in_flight_.push_back(b);
      while (in_flight_.size() > max_in_flight) {
        const std::size_t oldest = in_flight_.front();
        in_flight_.pop_front();
        pending_[oldest].wait();
        complete(oldest);
      }
    } else {
      T* g = params_->grads_data();
      std::span<T> grads(g + bucket.range.begin, static_cast<std::size_t>(bucket.range.size()));
      if (opt_.zero_stage == 0) {
        pending_[b] = group.all_reduce_async(grads, reduce_op::avg);
      } else {
        std::span<T> out(reduced_.data() + state_offset_[b], mine);
        pending_[b] = group.reduce_scatter_async(std::span<const T>(grads), out,
                                                 std::span<const std::size_t>(bucket.counts), reduce_op::avg);
      }
    }
    posted_[b] = true;
  }

  // A bucket's reduction finished (once per post): note the time; an expert bucket's average
  // divided by ep; ZeRO-2 adds its piece and frees the buffers.
  void complete(std::size_t b) {
    if (timing_[b].done != clock::time_point{}) return;
    timing_[b].done = clock::now();
    const auto& bucket = layout_.buckets()[b];
    if (bucket.expert && expert_degree_ > 1) {
      const double f = 1.0 / expert_degree_;
      if (opt_.zero_stage >= 2) {
        kernels::scale_in_place(device{}, pieces_[b].data(), std::int64_t(pieces_[b].size()), f);
      } else if (opt_.zero_stage == 1) {
        kernels::scale_in_place(device{}, reduced_.data() + state_offset_[b], layout_.owned(bucket).size(), f);
      } else {
        kernels::scale_in_place(device{}, params_->grads_data() + bucket.range.begin, bucket.range.size(), f);
      }
    }
    if (opt_.zero_stage < 2 || staging_[b].empty()) return;
    kernels::residual_forward(device{}, reduced_.data() + state_offset_[b], reduced_.data() + state_offset_[b],
                              pieces_[b].data(), static_cast<std::int64_t>(pieces_[b].size()));
    staging_[b] = buffer<T>();
    pieces_[b] = buffer<T>();
  }

  // ZeRO-3: h's weights, from its bucket, all-gathered when not resident. Asking for bucket b
  // also starts the gather of the bucket the pass needs next (b-1 in forward, b+1 in backward:
  // buckets run in backward order), so it arrives while this layer computes.
  T* bucket_weights(param_handle h) {
    const std::size_t b = bucket_of_[static_cast<std::size_t>(h.index)];
    // Only the first use of a bucket in a pass looks ahead: a later one (the LM head reading the
    // tied table the embedding already gathered) is not where the pass is going.
    const bool first_use = gathered_[b].empty() || prefetch_[b].pending();
    const bool prefetched = !gathered_[b].empty() && prefetch_[b].pending();
    if (gathered_[b].empty()) start_gather(b);
    prefetch_[b].wait();
    prefetch_hits_ += prefetched;
    touch(b);
    const std::ptrdiff_t next = backward_pass_ ? std::ptrdiff_t(b) + 1 : std::ptrdiff_t(b) - 1;
    if (first_use && next >= 0 && next < std::ptrdiff_t(gathered_.size()) && gathered_[std::size_t(next)].empty())
      start_gather(std::size_t(next));
    return gathered_[b].data() + (params_->info(h).offset - layout_.buckets()[b].range.begin);
  }

  // Posts bucket b's all-gather into a fresh buffer. Room is made first: of max_resident
  // unpinned buckets the least recently used goes (a layer reads at most two buckets at once,
  // and the one being prefetched is the third), so no more are held even transiently.
  void start_gather(std::size_t b) {
    const auto& bucket = layout_.buckets()[b];
    if (!pinned_[b] && resident_.size() >= max_resident) {
      const std::size_t victim = resident_.front();
      resident_.pop_front();
      prefetch_[victim].wait();
      gathered_[victim] = buffer<T>();
    }
    gathered_[b] =
        buffer<T>(params_->ledger(), memory_category::parameters, static_cast<std::size_t>(bucket.range.size()));
    const flat_range mine = layout_.owned(bucket);
    T* slot = gathered_[b].data() + (mine.begin - bucket.range.begin);
    gathered_[b].copy_within(shard_.data() + state_offset_[b], static_cast<std::size_t>(mine.size()),
                             static_cast<std::size_t>(mine.begin - bucket.range.begin));
    prefetch_[b] = group_of(bucket).all_gather_async(std::span<const T>(slot, static_cast<std::size_t>(mine.size())),
                                                     std::span<T>(gathered_[b].data(), gathered_[b].size()),
                                                     std::span<const std::size_t>(bucket.counts));
    if (!pinned_[b]) resident_.push_back(b);
  }

  // Most recently used goes to the back of the eviction order.
  void touch(std::size_t b) {
    if (pinned_[b]) return;
    auto it = std::find(resident_.begin(), resident_.end(), b);
    if (it != resident_.end() && std::next(it) != resident_.end()) {
      resident_.erase(it);
      resident_.push_back(b);
    }
  }

  void release_gathered() {
    if (opt_.zero_stage != 3) return;
    for (std::size_t b = 0; b < gathered_.size(); ++b) {
      prefetch_[b].wait();  // an unused prefetch still owns its buffer until it completes
      gathered_[b] = buffer<T>();
    }
    resident_.clear();
  }

  int first_param_of(std::size_t b) const {
    for (std::size_t i = 0; i < bucket_of_.size(); ++i)
      if (bucket_of_[i] == b) return static_cast<int>(i);
    return 0;
  }

  parameter_store<T>* params_;
  Comm* group_;
  Comm* experts_;          // the expert-data group (group_ without expert parallelism)
  int expert_degree_ = 1;  // ep: group_'s ranks per expert-data rank
  data_parallel_options opt_;
  dp_layout layout_;
  buffer<T> reduced_;                        // ZeRO-1: this rank's reduced gradient pieces
  std::vector<std::size_t> bucket_of_;       // per parameter
  std::vector<int> bucket_params_, left_;    // parameters per bucket; not yet final this step
  std::vector<std::int64_t> state_offset_;   // where each bucket's owned piece sits in reduced_
  std::vector<buffer<T>> staging_, pieces_;  // ZeRO-2: each bucket's gradients, its reduced piece
  std::deque<std::size_t> in_flight_;        // ZeRO-2: posted buckets, oldest first
  static constexpr std::size_t max_in_flight = 2;
  buffer<T> shard_;                    // ZeRO-3: this rank's pieces of the weights
  std::vector<buffer<T>> gathered_;    // ZeRO-3: resident gathered buckets
  std::vector<bool> pinned_;           // ZeRO-3: buckets kept for a whole pass (tied tables)
  std::deque<std::size_t> resident_;   // ZeRO-3: unpinned resident buckets, least recent first
  std::vector<comm_handle> prefetch_;  // ZeRO-3: each bucket's gather while in flight
  bool backward_pass_ = false;         // ZeRO-3: which way the next bucket lies
  long prefetch_hits_ = 0;
  static constexpr std::size_t max_resident = 3;
  std::vector<comm_handle> pending_;
  std::vector<bool> posted_;
  std::vector<bucket_timing> timing_;
  clock::time_point backward_end_;
};

}  // namespace strata
