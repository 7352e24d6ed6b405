// strata/comm/collectives.hpp - the typed front end every engine shares: checks, counting, forms.
//
// An engine (MPI, NCCL, MPI-staged device buffers) derives from collectives<Engine> and supplies
// rank(), size() and six type-erased, unchecked, uncounted posts that start a call and return its
// comm_handle:
//
//   post_all_reduce(void* data, size_t count, comm_dtype, reduce_op)
//   post_reduce_scatter(const void* in, void* out, size_t block, span<const size_t> counts, comm_dtype, reduce_op)
//   post_all_gather(const void* in, void* out, size_t block, span<const size_t> counts, comm_dtype)
//   post_broadcast(void* data, size_t count, comm_dtype, int root)
//   post_all_to_all(const void* in, void* out, size_t block, span<const size_t> send_counts,
//                   span<const size_t> recv_counts, comm_dtype)
//   post_p2p(span<const p2p_op> ops)                 ops whose peer is no_peer are skipped
//   post_barrier()
//
// (counts empty: every rank has `block` elements; otherwise counts[r] for rank r, and block is
// unused; all_to_all: both count lists empty, or both given.) This front end turns typed ranges
// into those calls: it checks the sizes against the group (a strata::error naming the group and
// the numbers, thrown before anything is posted), records the call in the communicator's counters
// (conventions in counters.hpp), and provides the blocking form of each call as the async form
// plus wait().
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "strata/comm/communicator.hpp"
#include "strata/comm/counters.hpp"
#include "strata/core/error.hpp"

namespace strata {

namespace detail {
// True when [a, a + an) and [b, b + bn) share a byte.
inline bool bytes_overlap(const void* a, std::size_t an, const void* b, std::size_t bn) {
  if (an == 0 || bn == 0) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + bn && pb < pa + an;
}
}  // namespace detail

template <class Engine>
class collectives {
 public:
  // The group's name ("world", "dp", "tp", "pp", "embedding", or the user's).
  std::string_view name() const { return counters_.group(); }
  const comm_counters& counters() const { return counters_; }
  void reset_counters() { counters_.reset(); }

  // ---- all_reduce: in place ------------------------------------------------------------------
  template <comm_async_output_range R>
  comm_handle all_reduce_async(R&& data, reduce_op op = reduce_op::sum) {
    check_member("all_reduce");
    using T = comm_value_t<R>;
    const std::size_t count = std::ranges::size(data);
    counters_.record(op_kind::all_reduce, volume::all_reduce(count, sizeof(T), n(), me()));
    return engine().post_all_reduce(std::ranges::data(data), count, comm_dtype_of<T>, op);
  }
  template <comm_output_range R>
  void all_reduce(R&& data, reduce_op op = reduce_op::sum) {
    all_reduce_async(data, op).wait();
  }

  // ---- reduce_scatter: out = this rank's part of the reduction of every rank's in -----------
  template <comm_async_range In, comm_async_output_for<In> Out>
  comm_handle reduce_scatter_async(In&& in, Out&& out, reduce_op op = reduce_op::sum) {
    check_member("reduce_scatter");
    using T = comm_value_t<In>;
    const std::size_t in_n = std::ranges::size(in), out_n = std::ranges::size(out);
    STRATA_CHECK(in_n == out_n * std::size_t(n()), "reduce_scatter on group ", name(), ": the input has ", in_n,
                 " elements but ", n(), " ranks x ", out_n, " output elements = ", out_n * std::size_t(n()));
    check_apart("reduce_scatter", std::ranges::data(in), in_n * sizeof(T), std::ranges::data(out), out_n * sizeof(T));
    counters_.record(op_kind::reduce_scatter, volume::reduce_scatter(in_n * sizeof(T), out_n * sizeof(T), n()));
    return engine().post_reduce_scatter(std::ranges::data(in), std::ranges::data(out), out_n, {}, comm_dtype_of<T>, op);
  }
  template <comm_async_range In, comm_async_output_for<In> Out>
  comm_handle reduce_scatter_async(In&& in, Out&& out, std::span<const std::size_t> counts,
                                   reduce_op op = reduce_op::sum) {
    check_member("reduce_scatter");
    using T = comm_value_t<In>;
    const std::size_t in_n = std::ranges::size(in), out_n = std::ranges::size(out);
    check_counts("reduce_scatter", counts, out_n, "output", in_n, "input");
    check_apart("reduce_scatter", std::ranges::data(in), in_n * sizeof(T), std::ranges::data(out), out_n * sizeof(T));
    counters_.record(op_kind::reduce_scatter, volume::reduce_scatter(in_n * sizeof(T), out_n * sizeof(T), n()));
    return engine().post_reduce_scatter(std::ranges::data(in), std::ranges::data(out), out_n, counts, comm_dtype_of<T>,
                                        op);
  }
  template <comm_range In, comm_output_range Out>
  void reduce_scatter(In&& in, Out&& out, reduce_op op = reduce_op::sum) {
    reduce_scatter_async(in, out, op).wait();
  }
  template <comm_range In, comm_output_range Out>
  void reduce_scatter(In&& in, Out&& out, std::span<const std::size_t> counts, reduce_op op = reduce_op::sum) {
    reduce_scatter_async(in, out, counts, op).wait();
  }

  // ---- all_gather: out = every rank's in, in rank order ---------------------------------------
  // `in` may be this rank's own slot of `out` (in place); otherwise they must not overlap.
  template <comm_async_range In, comm_async_output_for<In> Out>
  comm_handle all_gather_async(In&& in, Out&& out) {
    check_member("all_gather");
    using T = comm_value_t<In>;
    const std::size_t in_n = std::ranges::size(in), out_n = std::ranges::size(out);
    STRATA_CHECK(out_n == in_n * std::size_t(n()), "all_gather on group ", name(), ": the output has ", out_n,
                 " elements but ", n(), " ranks x ", in_n, " input elements = ", in_n * std::size_t(n()));
    check_gather_aliasing(std::ranges::data(in), in_n, std::ranges::data(out), out_n, in_n * std::size_t(me()));
    counters_.record(op_kind::all_gather, volume::all_gather(out_n * sizeof(T), in_n * sizeof(T), n()));
    return engine().post_all_gather(std::ranges::data(in), std::ranges::data(out), in_n, {}, comm_dtype_of<T>);
  }
  template <comm_async_range In, comm_async_output_for<In> Out>
  comm_handle all_gather_async(In&& in, Out&& out, std::span<const std::size_t> counts) {
    check_member("all_gather");
    using T = comm_value_t<In>;
    const std::size_t in_n = std::ranges::size(in), out_n = std::ranges::size(out);
    check_counts("all_gather", counts, in_n, "input", out_n, "output");
    const std::size_t offset = std::accumulate(counts.begin(), counts.begin() + me(), std::size_t{0});
    check_gather_aliasing(std::ranges::data(in), in_n, std::ranges::data(out), out_n, offset);
    counters_.record(op_kind::all_gather, volume::all_gather(out_n * sizeof(T), in_n * sizeof(T), n()));
    return engine().post_all_gather(std::ranges::data(in), std::ranges::data(out), in_n, counts, comm_dtype_of<T>);
  }
  template <comm_range In, comm_output_range Out>
  void all_gather(In&& in, Out&& out) {
    all_gather_async(in, out).wait();
  }
  template <comm_range In, comm_output_range Out>
  void all_gather(In&& in, Out&& out, std::span<const std::size_t> counts) {
    all_gather_async(in, out, counts).wait();
  }

  // ---- broadcast: every rank's data = root's data ---------------------------------------------
  template <comm_async_output_range R>
  comm_handle broadcast_async(R&& data, int root) {
    check_member("broadcast");
    using T = comm_value_t<R>;
    STRATA_CHECK(root >= 0 && root < n(), "broadcast on group ", name(), ": root ", root, " is not a rank of ", n());
    const std::size_t count = std::ranges::size(data);
    counters_.record(op_kind::broadcast, volume::broadcast(count * sizeof(T), n(), me() == root));
    return engine().post_broadcast(std::ranges::data(data), count, comm_dtype_of<T>, root);
  }
  template <comm_output_range R>
  void broadcast(R&& data, int root) {
    broadcast_async(data, root).wait();
  }

  // ---- all_to_all: block r of in goes to rank r; block r of out came from rank r --------------
  template <comm_async_range In, comm_async_output_for<In> Out>
  comm_handle all_to_all_async(In&& in, Out&& out) {
    check_member("all_to_all");
    using T = comm_value_t<In>;
    const std::size_t in_n = std::ranges::size(in), out_n = std::ranges::size(out), un = std::size_t(n());
    STRATA_CHECK(in_n == out_n && in_n % un == 0, "all_to_all on group ", name(), ": the input has ", in_n,
                 " elements and the output ", out_n, "; both must be ", n(), " ranks x one block size");
    check_apart("all_to_all", std::ranges::data(in), in_n * sizeof(T), std::ranges::data(out), out_n * sizeof(T));
    const std::size_t block = in_n / un;
    counters_.record(op_kind::all_to_all,
                     volume::all_to_all(in_n * sizeof(T), out_n * sizeof(T), block * sizeof(T), n()));
    return engine().post_all_to_all(std::ranges::data(in), std::ranges::data(out), block, {}, {}, comm_dtype_of<T>);
  }
  template <comm_async_range In, comm_async_output_for<In> Out>
  comm_handle all_to_all_v_async(In&& in, std::span<const std::size_t> send_counts, Out&& out,
                                 std::span<const std::size_t> recv_counts) {
    check_member("all_to_all_v");
    using T = comm_value_t<In>;
    const std::size_t in_n = std::ranges::size(in), out_n = std::ranges::size(out);
    check_total("all_to_all_v", send_counts, "send", in_n, "input");
    check_total("all_to_all_v", recv_counts, "receive", out_n, "output");
    const std::size_t kept = send_counts[std::size_t(me())];
    STRATA_CHECK(kept == recv_counts[std::size_t(me())], "all_to_all_v on group ", name(), ": rank ", me(), " sends ",
                 kept, " elements to itself but expects ", recv_counts[std::size_t(me())], " from itself");
    check_apart("all_to_all_v", std::ranges::data(in), in_n * sizeof(T), std::ranges::data(out), out_n * sizeof(T));
    counters_.record(op_kind::all_to_all,
                     volume::all_to_all(in_n * sizeof(T), out_n * sizeof(T), kept * sizeof(T), n()));
    return engine().post_all_to_all(std::ranges::data(in), std::ranges::data(out), 0, send_counts, recv_counts,
                                    comm_dtype_of<T>);
  }
  template <comm_range In, comm_output_range Out>
  void all_to_all(In&& in, Out&& out) {
    all_to_all_async(in, out).wait();
  }
  template <comm_range In, comm_output_range Out>
  void all_to_all_v(In&& in, std::span<const std::size_t> send_counts, Out&& out,
                    std::span<const std::size_t> recv_counts) {
    all_to_all_v_async(in, send_counts, out, recv_counts).wait();
  }

  // ---- point to point: several sends and receives posted together ----------------------------
  comm_handle p2p_async(std::span<const p2p_op> ops) {
    check_member("p2p");
    for (const p2p_op& o : ops) {
      if (o.peer == no_peer) continue;
      STRATA_CHECK(o.peer >= 0 && o.peer < n(), "p2p on group ", name(), ": peer ", o.peer, " is not a rank of ", n());
      STRATA_CHECK(o.tag >= 0, "p2p on group ", name(), ": tag ", o.tag, " must be >= 0");
      if (o.dir == p2p_op::direction::send) {
        counters_.record(op_kind::send, {o.bytes(), 0});
      } else {
        counters_.record(op_kind::recv, {0, o.bytes()});
      }
    }
    return engine().post_p2p(ops);
  }
  comm_handle p2p_async(std::initializer_list<p2p_op> ops) {
    return p2p_async(std::span<const p2p_op>(ops.begin(), ops.size()));
  }
  void p2p(std::span<const p2p_op> ops) { p2p_async(ops).wait(); }
  void p2p(std::initializer_list<p2p_op> ops) { p2p_async(ops).wait(); }

  template <comm_async_range R>
  comm_handle send_async(R&& data, int peer, int tag = 0) {
    const p2p_op op = send_to(peer, data, tag);
    return p2p_async(std::span<const p2p_op>(&op, 1));
  }
  template <comm_async_output_range R>
  comm_handle recv_async(R&& data, int peer, int tag = 0) {
    const p2p_op op = recv_from(peer, data, tag);
    return p2p_async(std::span<const p2p_op>(&op, 1));
  }
  template <comm_range R>
  void send(R&& data, int peer, int tag = 0) {
    send_async(data, peer, tag).wait();
  }
  template <comm_output_range R>
  void recv(R&& data, int peer, int tag = 0) {
    recv_async(data, peer, tag).wait();
  }

  // ---- barrier ---------------------------------------------------------------------------------
  comm_handle barrier_async() {
    check_member("barrier");
    counters_.record(op_kind::barrier, {});
    return engine().post_barrier();
  }
  void barrier() { barrier_async().wait(); }

 protected:
  collectives() = default;
  explicit collectives(std::string name) : counters_(std::move(name)) {}
  ~collectives() = default;
  collectives(collectives&&) noexcept = default;
  collectives& operator=(collectives&&) noexcept = default;

  comm_counters counters_;

 private:
  Engine& engine() { return static_cast<Engine&>(*this); }
  const Engine& engine() const { return static_cast<const Engine&>(*this); }
  int n() const { return engine().size(); }
  int me() const { return engine().rank(); }

  // An empty communicator (a group this rank is not in) refuses every call.
  void check_member(const char* op) const {
    STRATA_CHECK(n() > 0, op, " on group '", name(), "': this rank is not a member (empty communicator)");
  }

  // counts must have one entry per rank, this rank's equal to the size of its part (`mine`, the
  // `part` side), and add up to the size of the `whole` side (`all`).
  void check_counts(const char* op, std::span<const std::size_t> counts, std::size_t mine, const char* part,
                    std::size_t all, const char* whole) const {
    check_total(op, counts, "", all, whole);
    STRATA_CHECK(counts[std::size_t(me())] == mine, op, " on group ", name(), ": rank ", me(), "'s count is ",
                 counts[std::size_t(me())], " but its ", part, " has ", mine, " elements");
  }
  // counts (the `kind` counts) must have one entry per rank and add up to the size of `whole`.
  void check_total(const char* op, std::span<const std::size_t> counts, std::string_view kind, std::size_t all,
                   const char* whole) const {
    const std::string_view space = kind.empty() ? "" : " ";
    STRATA_CHECK(counts.size() == std::size_t(n()), op, " on group ", name(), ": ", counts.size(), space, kind,
                 " counts given for ", n(), " ranks");
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    STRATA_CHECK(all == total, op, " on group ", name(), ": the ", whole, " has ", all, " elements but the", space,
                 kind, " counts add up to ", total);
  }

  void check_apart(const char* op, const void* in, std::size_t in_bytes, const void* out, std::size_t out_bytes) const {
    STRATA_CHECK(!detail::bytes_overlap(in, in_bytes, out, out_bytes), op, " on group ", name(),
                 ": the input and output buffers overlap");
  }

  template <class T>
  void check_gather_aliasing(const T* in, std::size_t in_n, const T* out, std::size_t out_n,
                             std::size_t own_offset) const {
    if (in_n == 0 || in == out + own_offset) return;  // in place: in is this rank's slot of out
    check_apart("all_gather", in, in_n * sizeof(T), out, out_n * sizeof(T));
  }
};

}  // namespace strata
