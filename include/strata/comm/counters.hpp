// strata/comm/counters.hpp - what a communicator has moved: calls and bytes per operation.
//
// Every communicator (one per process group: "world", "dp", "tp", "pp", "embedding") keeps a
// comm_counters. Each call adds one to its operation's `calls` and its per-rank volume to
// `bytes_sent` and `bytes_received`. Tests hold these to the analytic volumes (DP all-reduce of
// the gradients: 2Ψ(n-1)/n per rank; ZeRO-3: 3Ψ(n-1)/n; PP: b·s·h per hop); the trainer's
// metrics print them as the `comm` object:
//
//   "comm":{"dp":{"all_reduce":{"calls":2,"bytes_sent":6291456,"bytes_received":6291456}},"tp":{}}
//
// Byte conventions. The count is the volume of the ring algorithm, per rank, the figure nccl-tests
// reports as bus bandwidth, not what the engine's own algorithm happened to move (an MPI library
// may pick recursive doubling, a tree or shared memory; NCCL picks rings or trees). S is the
// call's buffer in the caller's element type (a bf16 all-reduce of 1000 elements is S = 2000
// bytes, even though the MPI engine reduces it as fp32 on the wire), n the group size, c_r the
// elements this rank owns in the ring split:
//
//   all_reduce       sent = received = 2 (count - c_r) · elem      (= 2 (n-1)/n · S when n | count)
//                    where c_r = count/n, plus one for the first count%n ranks
//   reduce_scatter   sent = received = S_in  - own part of it      (= (n-1)/n · S_in for equal parts)
//   all_gather       sent = received = S_out - own part of it      (= (n-1)/n · S_out)
//   broadcast        the root sends S, every other rank receives S (nothing when n = 1)
//   all_to_all       sent = S_in - the block it keeps, received = S_out - that block
//                    (= (n-1)/n · S for equal blocks; all_to_all_v counts the same way)
//   send / recv      the message's size, on the sending / receiving side (one call per message)
//   barrier          calls only
//
// All volumes are 0 in a group of one. Counting happens when a call is posted (an async call is
// counted before it completes). Counters are per communicator object, not thread-safe, and
// never global: whoever holds the communicator reads them.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

namespace strata {

// The kinds of operation a communicator counts.
enum class op_kind : int { all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, send, recv, barrier };
inline constexpr int op_kind_count = 8;

constexpr std::string_view op_name(op_kind k) {
  switch (k) {
    case op_kind::all_reduce: return "all_reduce";
    case op_kind::reduce_scatter: return "reduce_scatter";
    case op_kind::all_gather: return "all_gather";
    case op_kind::broadcast: return "broadcast";
    case op_kind::all_to_all: return "all_to_all";
    case op_kind::send: return "send";
    case op_kind::recv: return "recv";
    case op_kind::barrier: return "barrier";
  }
  return "unknown";
}

// One operation's totals.
struct op_counts {
  std::uint64_t calls = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  bool operator==(const op_counts&) const = default;
};

// One call's per-rank volume.
struct comm_volume {
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
  bool operator==(const comm_volume&) const = default;
};

// The analytic per-rank volumes of the conventions above. Pure functions, so tests (and the
// planner) can compute the figure a counter must show.
namespace volume {

// Elements rank `rank` owns when `count` elements are split over n ranks as evenly as possible.
constexpr std::uint64_t ring_share(std::uint64_t count, int n, int rank) {
  const auto un = static_cast<std::uint64_t>(n);
  return count / un + (static_cast<std::uint64_t>(rank) < count % un ? 1 : 0);
}

constexpr comm_volume all_reduce(std::uint64_t count, std::size_t elem_bytes, int n, int rank) {
  if (n <= 1) return {};
  const std::uint64_t b = 2 * (count - ring_share(count, n, rank)) * elem_bytes;
  return {b, b};
}

// total_bytes: the whole input (reduce_scatter) or output (all_gather); own_bytes: this rank's part.
constexpr comm_volume reduce_scatter(std::uint64_t total_bytes, std::uint64_t own_bytes, int n) {
  if (n <= 1) return {};
  return {total_bytes - own_bytes, total_bytes - own_bytes};
}

constexpr comm_volume all_gather(std::uint64_t total_bytes, std::uint64_t own_bytes, int n) {
  if (n <= 1) return {};
  return {total_bytes - own_bytes, total_bytes - own_bytes};
}

constexpr comm_volume broadcast(std::uint64_t bytes, int n, bool is_root) {
  if (n <= 1) return {};
  return is_root ? comm_volume{bytes, 0} : comm_volume{0, bytes};
}

// in_bytes / out_bytes: the whole input and output; kept_bytes: the block a rank sends itself.
constexpr comm_volume all_to_all(std::uint64_t in_bytes, std::uint64_t out_bytes, std::uint64_t kept_bytes, int n) {
  if (n <= 1) return {};
  return {in_bytes - kept_bytes, out_bytes - kept_bytes};
}

}  // namespace volume

// Per-communicator counts, by operation kind. The group name is the communicator's.
class comm_counters {
 public:
  comm_counters() = default;
  explicit comm_counters(std::string group) : group_(std::move(group)) {}

  const std::string& group() const { return group_; }

  void record(op_kind k, comm_volume v) {
    op_counts& c = by_op_[index(k)];
    c.calls += 1;
    c.bytes_sent += v.sent;
    c.bytes_received += v.received;
  }

  const op_counts& operator[](op_kind k) const { return by_op_[index(k)]; }
  const op_counts& of(op_kind k) const { return by_op_[index(k)]; }

  // All operations together.
  op_counts total() const {
    op_counts t;
    for (const auto& c : by_op_) {
      t.calls += c.calls;
      t.bytes_sent += c.bytes_sent;
      t.bytes_received += c.bytes_received;
    }
    return t;
  }

  void reset() { by_op_ = {}; }

  // {"all_reduce":{"calls":1,"bytes_sent":8,"bytes_received":8},...}: operations never called
  // are left out, so an idle group is {}.
  nlohmann::ordered_json to_json() const {
    nlohmann::ordered_json ops = nlohmann::ordered_json::object();
    for (int i = 0; i < op_kind_count; ++i) {
      const op_counts& c = by_op_[static_cast<std::size_t>(i)];
      if (c.calls == 0) continue;
      ops[std::string(op_name(static_cast<op_kind>(i)))] = {
          {"calls", c.calls}, {"bytes_sent", c.bytes_sent}, {"bytes_received", c.bytes_received}};
    }
    return ops;
  }
  std::string json() const { return to_json().dump(); }

 private:
  static std::size_t index(op_kind k) { return static_cast<std::size_t>(k); }
  std::string group_;
  std::array<op_counts, op_kind_count> by_op_{};
};

// The `comm` object of the metrics: {"dp":{...},"tp":{...}} in the order given. Null pointers
// (a group this rank is not in) are skipped.
inline std::string comm_json(std::initializer_list<const comm_counters*> groups) {
  nlohmann::ordered_json by_group = nlohmann::ordered_json::object();
  for (const comm_counters* g : groups)
    if (g) by_group[g->group()] = g->to_json();
  return by_group.dump();
}

}  // namespace strata
