// strata/layers/context_parallel.hpp - what a layer needs to run on a context-parallel rank.
//
// Under context parallelism over cp ranks the model sees T/cp tokens of every sequence: the
// chunks layers/context_split.hpp assigns to this rank. Token-by-token layers (norms, MLPs,
// projections, the loss) need nothing more. Layers that care where a token sits - a position
// table, the rotary embedding, attention's causal mask - ask split() for each local row's
// absolute position, and attention reaches the other ranks' keys and values over group() in the
// form() the layout chose. Default: a group of one (the whole sequence, in order).
#pragma once
#include <algorithm>
#include <cstdint>
#include <utility>

#include "strata/comm/group_ref.hpp"
#include "strata/core/error.hpp"
#include "strata/layers/context_split.hpp"

namespace strata {

class context_parallel {
 public:
  context_parallel() = default;
  context_parallel(group_ref group, context_form form) : group_(std::move(group)), form_(form) {}

  int degree() const { return group_.size(); }
  int rank() const { return group_.rank(); }
  context_form form() const { return form_; }
  group_ref& group() { return group_; }

  // The split of whole sequences of `seq` tokens (fails, naming the numbers, when 2·cp does not
  // divide them).
  context_split split_whole(std::int64_t seq) const { return context_split::checked(seq, degree(), rank()); }
  // The split behind `local_seq` rows of each sequence on this rank.
  context_split split_local(std::int64_t local_seq) const { return split_whole(local_seq * degree()); }

  // Calls f(offset, rows, first_position) for each run of consecutive positions among `count`
  // rows of the flattened local tokens [B · local_seq] starting at row `first_row` (offset counts
  // from first_row): each chunk of each sequence is one run.
  template <class F>
  void for_each_run(std::int64_t local_seq, std::int64_t first_row, std::int64_t count, F&& f) const {
    const context_split s = split_local(local_seq);
    const std::int64_t run = s.degree == 1 ? local_seq : s.chunk();
    for (std::int64_t i = first_row; i < first_row + count;) {
      const std::int64_t row = i % local_seq, len = std::min(run - row % run, first_row + count - i);
      f(i - first_row, len, s.position(row));
      i += len;
    }
  }

 private:
  group_ref group_;
  context_form form_ = context_form::ring;
};

}  // namespace strata
