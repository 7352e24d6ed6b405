// strata/parallel/dp_layout.hpp - how data parallelism cuts the flat parameter buffer.
//
// Gradients are reduced bucket by bucket, in backward order (the last parameters' gradients
// are complete first), so a bucket's reduction can start while backward goes on. A bucket
// holds whole parameters and at least `bucket_elems` elements (the last one may be smaller).
// Under ZeRO each bucket is cut into one piece per data-parallel rank: rank r owns elements
// [r·s, (r+1)·s) of the bucket, s = ceil(bucket / ranks), clipped to the bucket. Uneven pieces
// instead of padding: the reduce-scatter and all-gather take per-rank counts, and no padding
// element is ever stored, computed or sent.
//
// Under expert parallelism a rank's experts are reduced over another group than the rest (the
// ranks that hold the same experts): a bucket holds parameters of one kind only, and an expert
// bucket is cut over the expert-data group's ranks.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/layers/parameters.hpp"

namespace strata {

struct flat_range {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
  friend bool operator==(const flat_range&, const flat_range&) = default;
};

// One optimizer segment: `count` elements at `flat` in the flat buffers and at `state` in
// this rank's optimizer state, all from one parameter (so one weight-decay setting).
struct owned_segment {
  std::int64_t flat = 0, state = 0, count = 0;
  bool decay = false;
  bool operator==(const owned_segment&) const = default;
};

// Every parameter of a store as one segment each, state indexed like the flat buffer: what an
// optimizer updates when nothing is sharded.
template <class T>
std::vector<owned_segment> whole_model_segments(const parameter_store<T>& params) {
  std::vector<owned_segment> out;
  for (const auto& e : params.entries()) out.push_back({e.offset, e.offset, e.numel, e.weight_decay});
  return out;
}

struct dp_bucket {
  flat_range range;                 // in the flat buffers
  std::vector<std::size_t> counts;  // elements each rank owns of it
  std::int64_t piece = 0;           // s: the nominal piece size
  bool expert = false;              // holds experts: reduced and cut over the expert-data group
  flat_range owned(int rank) const {
    const std::int64_t b = std::min(range.end, range.begin + rank * piece);
    return {b, std::min(range.end, b + piece)};
  }
};

class dp_layout {
 public:
  // `expert_ranks`/`expert_rank`: the expert-data group, for parameters marked expert (the
  // data-parallel group itself when there are none).
  dp_layout(const std::vector<param_info>& params, int ranks, int rank, std::int64_t bucket_elems, int expert_ranks = 0,
            int expert_rank = 0)
      : ranks_(ranks),
        rank_(rank),
        expert_ranks_(expert_ranks > 0 ? expert_ranks : ranks),
        expert_rank_(expert_ranks > 0 ? expert_rank : rank) {
    STRATA_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "dp_layout: rank ", rank, " of ", ranks, " ranks");
    STRATA_CHECK(expert_rank_ >= 0 && expert_rank_ < expert_ranks_, "dp_layout: expert-data rank ", expert_rank_,
                 " of ", expert_ranks_, " ranks");
    STRATA_CHECK(bucket_elems >= 1, "dp_layout: bucket size ", bucket_elems, " must be >= 1 element");
    // Walk parameters last to first; close a bucket once it holds bucket_elems elements, or
    // before a parameter of the other kind.
    std::int64_t end = -1, begin = -1;
    bool kind = false;
    for (auto it = params.rbegin(); it != params.rend(); ++it) {
      if (end >= 0 && it->expert != kind) {
        add_bucket({begin, end}, kind);
        end = -1;
      }
      if (end < 0) {
        end = it->offset + it->numel;
        kind = it->expert;
      }
      begin = it->offset;
      if (end - begin >= bucket_elems) {
        add_bucket({begin, end}, kind);
        end = -1;
      }
    }
    if (end >= 0) add_bucket({begin, end}, kind);
    // This rank's pieces, split at parameter boundaries into optimizer segments.
    for (const auto& b : buckets_) {
      const flat_range mine = owned(b);
      for (const auto& p : params) {
        const std::int64_t lo = std::max(mine.begin, p.offset), hi = std::min(mine.end, p.offset + p.numel);
        if (lo < hi) {
          segments_.push_back({lo, owned_, hi - lo, p.weight_decay});
          owned_ += hi - lo;
        }
      }
    }
  }

  int ranks() const { return ranks_; }
  int rank() const { return rank_; }
  // This rank's place in the group that reduces bucket b, and its piece of it.
  int rank_for(const dp_bucket& b) const { return b.expert ? expert_rank_ : rank_; }
  flat_range owned(const dp_bucket& b) const { return b.owned(rank_for(b)); }
  const std::vector<dp_bucket>& buckets() const { return buckets_; }
  // Elements this rank owns under ZeRO (Ψ/N up to the rounding of each bucket).
  std::int64_t owned_elements() const { return owned_; }
  const std::vector<owned_segment>& owned_segments() const { return segments_; }

 private:
  void add_bucket(flat_range r, bool expert) {
    dp_bucket b;
    b.range = r;
    b.expert = expert;
    const int n = expert ? expert_ranks_ : ranks_;
    b.piece = (r.size() + n - 1) / n;
    for (int q = 0; q < n; ++q) b.counts.push_back(static_cast<std::size_t>(b.owned(q).size()));
    buckets_.push_back(std::move(b));
  }

  int ranks_, rank_, expert_ranks_, expert_rank_;
  std::vector<dp_bucket> buckets_;
  std::vector<owned_segment> segments_;
  std::int64_t owned_ = 0;
};

}  // namespace strata
