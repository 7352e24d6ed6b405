// strata/comm/communicator.hpp - the communicator concept and the types every engine shares.
//
// A communicator is one process group (world, dp, tp, pp, ...) behind one engine: MPI on host
// memory (mpi_communicator.hpp), NCCL on device memory and a CUDA stream (nccl_communicator.cuh),
// or MPI on device memory staged through pinned host buffers (mpi_device_communicator.cuh).
// Parallel code is written once against the concept:
//
//   template <strata::communicator Comm>
//   void reduce_gradients(Comm& dp, std::span<float> grads) { dp.all_reduce(grads, strata::reduce_op::avg); }
//
// Operations, on contiguous ranges (std::span, std::vector, ...) of float, double, bf16 or fp16:
//   all_reduce(data, op)                        in place; op = sum (default), avg or max
//   reduce_scatter(in, out, op)                 in = n equal parts; out = this rank's part, reduced
//   reduce_scatter(in, out, counts, op)         uneven parts: counts[r] elements for rank r
//   all_gather(in, out) / (in, out, counts)     out = every rank's in, in rank order; in may be
//                                               this rank's own slot of out (in place)
//   broadcast(data, root)
//   all_to_all(in, out)                         in = n equal blocks, block r goes to rank r; out =
//                                               n blocks, block r came from rank r
//   all_to_all_v(in, send_counts, out, recv_counts)   uneven blocks: send_counts[r] elements
//                                               of in go to rank r, recv_counts[r] of out come
//                                               from it (each rank's pairs must agree)
//   send(data, peer) / recv(data, peer)         point to point, peers are ranks in this group
//   p2p({send_to(next, acts), recv_from(next, grads)})   several at once: all posted, then all
//                                               waited for, so a pipeline stage never deadlocks
//                                               on the order of its sends and receives
//   barrier()
// Each has an _async form returning a comm_handle; the blocking form is the async one plus
// wait(). A blocking call returns when the buffers hold the result (for device engines: the
// host has seen the stream finish it). An async call's buffers belong to the communicator until
// its handle is waited on; a handle waits in its destructor.
//
// Reductions of bf16 and fp16 accumulate in fp32 and round once: the engines' contract, tested
// on the host against an fp64 reference (see mpi_communicator.hpp for how the MPI engine does it).
#pragma once
#include <concepts>
#include <cstddef>
#include <memory>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

#include "strata/comm/counters.hpp"
#include "strata/core/dtype.hpp"

namespace strata {

enum class reduce_op { sum, avg, max };

constexpr std::string_view reduce_op_name(reduce_op op) {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::avg: return "avg";
    case reduce_op::max: return "max";
  }
  return "unknown";
}

// The element types a communicator moves.
template <class T>
concept comm_scalar = is_scalar_v<T>;

// The element type as a run-time value, for engines and type-erased buffers.
enum class comm_dtype { f32, f64, bf16, fp16 };

template <comm_scalar T>
inline constexpr comm_dtype comm_dtype_of = std::is_same_v<T, float>    ? comm_dtype::f32
                                            : std::is_same_v<T, double> ? comm_dtype::f64
                                            : std::is_same_v<T, bf16>   ? comm_dtype::bf16
                                                                        : comm_dtype::fp16;

constexpr std::size_t dtype_bytes(comm_dtype d) {
  switch (d) {
    case comm_dtype::f32: return 4;
    case comm_dtype::f64: return 8;
    case comm_dtype::bf16: return 2;
    case comm_dtype::fp16: return 2;
  }
  return 0;
}

constexpr std::string_view comm_dtype_name(comm_dtype d) {
  switch (d) {
    case comm_dtype::f32: return "fp32";
    case comm_dtype::f64: return "fp64";
    case comm_dtype::bf16: return "bf16";
    case comm_dtype::fp16: return "fp16";
  }
  return "unknown";
}

// Calls f(std::type_identity<T>{}) with the C++ type of d.
template <class F>
decltype(auto) visit_dtype(comm_dtype d, F&& f) {
  switch (d) {
    case comm_dtype::f64: return std::forward<F>(f)(std::type_identity<double>{});
    case comm_dtype::bf16: return std::forward<F>(f)(std::type_identity<bf16>{});
    case comm_dtype::fp16: return std::forward<F>(f)(std::type_identity<fp16>{});
    case comm_dtype::f32: break;
  }
  return std::forward<F>(f)(std::type_identity<float>{});
}

// A contiguous range of a communicable scalar, and one that may be written.
template <class R>
using comm_value_t = std::remove_cvref_t<std::ranges::range_reference_t<R>>;

template <class R>
concept comm_range = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> && comm_scalar<comm_value_t<R>>;

template <class R>
concept comm_output_range =
    comm_range<R> && !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>;

// What an asynchronous collective may keep using after it returns, until its handle is waited
// on: ranges that do not own their elements (a span, a pointer range, an lvalue container).
template <class R>
concept comm_async_range = comm_range<R> && std::ranges::borrowed_range<R>;
template <class R>
concept comm_async_output_range = comm_output_range<R> && std::ranges::borrowed_range<R>;
// The output of an asynchronous collective whose input is `In`: the same scalar.
template <class Out, class In>
concept comm_async_output_for = comm_async_output_range<Out> && std::same_as<comm_value_t<In>, comm_value_t<Out>>;

// No neighbour: a p2p operation with this peer is skipped, so the first and last pipeline stages
// can post the same list as the others.
inline constexpr int no_peer = -1;

// One message of a grouped send/recv. Peers are ranks in the communicator's group.
struct p2p_op {
  enum class direction { send, recv };
  direction dir = direction::send;
  void* data = nullptr;  // read for a send, written for a receive
  std::size_t count = 0;
  comm_dtype dtype = comm_dtype::f32;
  int peer = no_peer;
  int tag = 0;

  std::size_t bytes() const { return count * dtype_bytes(dtype); }
};

template <comm_range R>
p2p_op send_to(int peer, R&& data, int tag = 0) {
  using T = comm_value_t<R>;
  return {p2p_op::direction::send,
          const_cast<T*>(std::ranges::data(data)),
          std::ranges::size(data),
          comm_dtype_of<T>,
          peer,
          tag};
}

template <comm_output_range R>
p2p_op recv_from(int peer, R&& data, int tag = 0) {
  using T = comm_value_t<R>;
  return {p2p_op::direction::recv, std::ranges::data(data), std::ranges::size(data), comm_dtype_of<T>, peer, tag};
}

// The completion of an async call. wait() returns once the call's buffers hold the result; a
// call that cannot complete within the communicator's timeout ends the job there (timeout.hpp).
// Move-only; the destructor waits, so buffers are never released under a running call.
class comm_handle {
 public:
  // What an engine puts behind a handle.
  class operation {
   public:
    virtual ~operation() = default;
    virtual bool test() = 0;  // makes progress; true once complete
    virtual void wait() = 0;  // returns complete, or reports the stall and ends the job
  };

  comm_handle() noexcept = default;  // an already complete call
  explicit comm_handle(std::unique_ptr<operation> op) noexcept : op_(std::move(op)) {}
  comm_handle(comm_handle&&) noexcept = default;
  comm_handle& operator=(comm_handle&& o) noexcept {
    if (this != &o) {
      wait();
      op_ = std::move(o.op_);
    }
    return *this;
  }
  comm_handle(const comm_handle&) = delete;
  comm_handle& operator=(const comm_handle&) = delete;
  ~comm_handle() { wait(); }

  void wait() {
    if (op_) {
      op_->wait();
      op_.reset();
    }
  }
  // Non-blocking: true once the call is complete (and then the handle is empty).
  bool test() {
    if (!op_) return true;
    if (!op_->test()) return false;
    op_.reset();
    return true;
  }
  bool pending() const noexcept { return op_ != nullptr; }

 private:
  std::unique_ptr<operation> op_;
};

// Waits for several handles, in order.
template <class... Handles>
void wait_all(Handles&... hs) {
  (hs.wait(), ...);
}

// The concept, per element type.
template <class C, class T>
concept communicator_for = requires(C& c, std::span<T> buf, std::span<const T> in, std::span<const std::size_t> counts,
                                    reduce_op op, int r) {
  c.all_reduce(buf, op);
  { c.all_reduce_async(buf, op) } -> std::same_as<comm_handle>;
  c.reduce_scatter(in, buf, op);
  { c.reduce_scatter_async(in, buf, op) } -> std::same_as<comm_handle>;
  c.reduce_scatter(in, buf, counts, op);
  { c.reduce_scatter_async(in, buf, counts, op) } -> std::same_as<comm_handle>;
  c.all_gather(in, buf);
  { c.all_gather_async(in, buf) } -> std::same_as<comm_handle>;
  c.all_gather(in, buf, counts);
  { c.all_gather_async(in, buf, counts) } -> std::same_as<comm_handle>;
  c.broadcast(buf, r);
  { c.broadcast_async(buf, r) } -> std::same_as<comm_handle>;
  c.all_to_all(in, buf);
  { c.all_to_all_async(in, buf) } -> std::same_as<comm_handle>;
  c.all_to_all_v(in, counts, buf, counts);
  { c.all_to_all_v_async(in, counts, buf, counts) } -> std::same_as<comm_handle>;
  c.send(in, r);
  c.recv(buf, r);
};

// A process group that can run every operation above on every strata scalar type, count what
// it moves, and say who it is.
template <class C>
concept communicator = requires(C& c, const C& cc, std::span<const p2p_op> ops) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  { cc.name() } -> std::convertible_to<std::string_view>;
  { cc.counters() } -> std::same_as<const comm_counters&>;
  c.reset_counters();
  c.p2p(ops);
  { c.p2p_async(ops) } -> std::same_as<comm_handle>;
  c.barrier();
  { c.barrier_async() } -> std::same_as<comm_handle>;
}
&&communicator_for<C, float>&& communicator_for<C, double>&& communicator_for<C, bf16>&& communicator_for<C, fp16>;

}  // namespace strata
