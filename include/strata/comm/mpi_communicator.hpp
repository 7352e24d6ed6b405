// strata/comm/mpi_communicator.hpp - the MPI engine: collectives on host memory.
//
// One mpi_communicator is one MPI communicator (a private duplicate, so strata's traffic never
// matches a user's own MPI calls) with a name, a timeout and its counters. Every call is posted
// as nonblocking MPI (MPI_Iallreduce, MPI_Ireduce_scatter[_block], MPI_Iallgather[v],
// MPI_Ialltoall[v], MPI_Ibcast, MPI_Isend/Irecv, MPI_Ibarrier) and completed by a polling wait
// with a deadline (timeout.hpp); the blocking calls are these plus wait(). MPI errors on strata's
// communicators are returned rather than fatal, and reported like a stall: one line naming rank,
// group, operation and size, then MPI_Abort.
//
// bf16 and fp16 reductions (all_reduce, reduce_scatter) are staged in fp32: the input is widened
// into an fp32 buffer, reduced by MPI as MPI_FLOAT (so every partial sum, on every rank and in
// whatever order the MPI library chooses, is an fp32 sum), and the result is rounded to the
// 16-bit type once, on the way out (avg divides in fp32 first). The wire carries fp32, twice the
// bytes of the 16-bit buffer; the counters still count the caller's buffer (counters.hpp). A
// user-defined MPI_Op on 16-bit data would instead round every partial sum. Moves without
// arithmetic (all_gather, broadcast, send/recv) carry the 16-bit values as MPI_UINT16_T.
//
// avg is a sum followed by a division by the group size. Buffers longer than INT_MAX elements
// are split into several calls for all_reduce, broadcast and send/recv; reduce_scatter and
// all_gather take at most INT_MAX elements in all (checked).
#pragma once
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/comm/collectives.hpp"
#include "strata/comm/communicator.hpp"
#include "strata/comm/timeout.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"

namespace strata {

namespace detail {

inline bool mpi_is_initialized() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

inline int mpi_world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline std::string mpi_error_string(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return concat("MPI error ", rc);
  return std::string(buf, static_cast<std::size_t>(len));
}

// Prints the line and ends every rank of the job.
[[noreturn]] inline void mpi_abort_job(const std::string& line) {
  print_line(line);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

// The MPI type that carries d without arithmetic.
inline MPI_Datatype mpi_move_type(comm_dtype d) {
  switch (d) {
    case comm_dtype::f64: return MPI_DOUBLE;
    case comm_dtype::bf16:
    case comm_dtype::fp16: return MPI_UINT16_T;
    case comm_dtype::f32: break;
  }
  return MPI_FLOAT;
}

inline bool is_16bit(comm_dtype d) { return d == comm_dtype::bf16 || d == comm_dtype::fp16; }

// One posted MPI call (possibly several requests): what comm_handle waits on.
class mpi_operation final : public comm_handle::operation {
 public:
  mpi_operation(std::string_view op, std::string_view group, std::uint64_t bytes, int world_rank, double timeout_s)
      : op_(op), group_(group), bytes_(bytes), world_rank_(world_rank), timeout_s_(timeout_s) {}
  ~mpi_operation() override = default;

  // A slot for the next request; fill it by passing it to an MPI_I* call, then check().
  MPI_Request* next_request() {
    requests_.push_back(MPI_REQUEST_NULL);
    return &requests_.back();
  }
  void check(int rc) const {
    if (rc != MPI_SUCCESS) mpi_abort_job(failure_line(world_rank_, op_, group_, bytes_, mpi_error_string(rc)));
  }
  // An fp32 staging area of n elements, owned by the operation.
  float* stage(std::size_t n) {
    staging_.reset(new float[n > 0 ? n : 1]);
    return staging_.get();
  }
  std::vector<int>& int_args() { return args_; }  // counts/displacements: alive until completion
  void on_complete(std::function<void()> f) { finish_ = std::move(f); }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    check(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag, MPI_STATUSES_IGNORE));
    if (flag) complete();
    return done_;
  }
  void wait() override {
    if (done_) return;
    if (!poll_with_deadline([this] { return test(); }, timeout_s_)) {
      mpi_abort_job(stall_line(world_rank_, timeout_s_, op_, group_, bytes_));
    }
  }

 private:
  void complete() {
    done_ = true;
    if (finish_) finish_();
  }

  std::string op_, group_;
  std::uint64_t bytes_;
  int world_rank_;
  double timeout_s_;
  bool done_ = false;
  std::vector<MPI_Request> requests_;
  std::vector<int> args_;
  std::unique_ptr<float[]> staging_;
  std::function<void()> finish_;
};

template <class T>
void widen_to_float(const T* in, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
}
// out[i] = round(in[i] * scale) in T; scale is 1 or 1/n (avg).
template <class T>
void narrow_from_float(const float* in, T* out, std::size_t n, bool divide, int by) {
  if (divide) {
    const float d = static_cast<float>(by);
    for (std::size_t i = 0; i < n; ++i) out[i] = T(in[i] / d);
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = T(in[i]);
  }
}
template <class T>
void divide_in_place(T* data, std::size_t n, int by) {
  const T d = static_cast<T>(by);
  for (std::size_t i = 0; i < n; ++i) data[i] /= d;
}

}  // namespace detail

class mpi_communicator : public collectives<mpi_communicator> {
 public:
  // An empty communicator: valid() is false (e.g. a group this rank is not in).
  mpi_communicator() = default;

  // A communicator over a private duplicate of `comm` (collective over `comm`), named `name`.
  mpi_communicator(MPI_Comm comm, std::string name, comm_options options = comm_options::from_env())
      : collectives(std::move(name)), options_(options) {
    STRATA_CHECK(detail::mpi_is_initialized(), "mpi_communicator '", this->name(),
                 "': MPI is not initialized (create a strata::world first)");
    STRATA_CHECK(comm != MPI_COMM_NULL, "mpi_communicator '", this->name(), "': MPI_COMM_NULL given");
    world_rank_ = detail::mpi_world_rank();
    detail::mpi_operation dup("comm_dup", this->name(), 0, world_rank_, options_.timeout_s);
    dup.check(MPI_Comm_idup(comm, &comm_, dup.next_request()));
    dup.wait();
    adopt_setup();
  }

  mpi_communicator(mpi_communicator&& o) noexcept
      : collectives(std::move(o)),
        comm_(std::exchange(o.comm_, MPI_COMM_NULL)),
        rank_(o.rank_),
        size_(o.size_),
        world_rank_(o.world_rank_),
        options_(o.options_) {}
  mpi_communicator& operator=(mpi_communicator&& o) noexcept {
    if (this != &o) {
      release();
      collectives::operator=(std::move(o));
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      rank_ = o.rank_;
      size_ = o.size_;
      world_rank_ = o.world_rank_;
      options_ = o.options_;
    }
    return *this;
  }
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  ~mpi_communicator() { release(); }

  bool valid() const { return comm_ != MPI_COMM_NULL; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int world_rank() const { return world_rank_; }
  MPI_Comm native() const { return comm_; }
  const comm_options& options() const { return options_; }
  void set_options(const comm_options& o) { options_ = o; }
  void set_timeout(double seconds) { options_.timeout_s = seconds; }

  // World ranks of this group's members, in group-rank order.
  std::vector<int> world_ranks() const {
    std::vector<int> mine(static_cast<std::size_t>(size_)), world(static_cast<std::size_t>(size_));
    std::iota(mine.begin(), mine.end(), 0);
    MPI_Group g, w;
    MPI_Comm_group(comm_, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &w);
    MPI_Group_translate_ranks(g, size_, mine.data(), w, world.data());
    MPI_Group_free(&g);
    MPI_Group_free(&w);
    return world;
  }

  // Collective over this group: ranks passing the same color form a new group named `name`,
  // ordered by key. A negative color leaves this rank out; it gets an empty communicator.
  // MPI_Comm_split has no nonblocking form, so a watched barrier first makes sure every rank
  // has arrived (a missing rank is reported, not waited for forever).
  mpi_communicator split(int color, int key, std::string name) {
    require_valid("split");
    post_barrier_named("comm_split").wait();
    MPI_Comm out = MPI_COMM_NULL;
    check_rc("comm_split", MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &out));
    if (out == MPI_COMM_NULL) return {};
    mpi_communicator c;
    c.counters_ = comm_counters(std::move(name));
    c.comm_ = out;
    c.world_rank_ = world_rank_;
    c.options_ = options_;
    c.adopt_setup();
    return c;
  }

  // Broadcasts raw bytes from root, uncounted: for bootstrapping (e.g. NCCL's unique id).
  void bootstrap_broadcast(void* data, std::size_t bytes, int root) {
    require_valid("bootstrap_broadcast");
    auto o = make_op("bootstrap_broadcast", bytes);
    o->check(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_, o->next_request()));
    o->wait();
  }

  // ---- engine interface (collectives.hpp): unchecked and uncounted; use the typed calls ------

  comm_handle post_all_reduce(void* data, std::size_t count, comm_dtype dt, reduce_op op) {
    require_valid("all_reduce");
    auto o = make_op("all_reduce", count * dtype_bytes(dt));
    const MPI_Op mop = op == reduce_op::max ? MPI_MAX : MPI_SUM;
    const bool avg = op == reduce_op::avg;
    const int n = size_;
    if (detail::is_16bit(dt)) {
      float* s = o->stage(count);
      visit_dtype(dt, [&]<class T>(std::type_identity<T>) {
        T* d = static_cast<T*>(data);
        detail::widen_to_float(d, s, count);
        o->on_complete([s, d, count, avg, n] { detail::narrow_from_float(s, d, count, avg, n); });
      });
      for_chunks(count, [&](std::size_t off, int c) {
        o->check(MPI_Iallreduce(MPI_IN_PLACE, s + off, c, MPI_FLOAT, mop, comm_, o->next_request()));
      });
    } else {
      const MPI_Datatype t = detail::mpi_move_type(dt);
      char* bytes = static_cast<char*>(data);
      const std::size_t esz = dtype_bytes(dt);
      for_chunks(count, [&](std::size_t off, int c) {
        o->check(MPI_Iallreduce(MPI_IN_PLACE, bytes + off * esz, c, t, mop, comm_, o->next_request()));
      });
      if (avg) {
        visit_dtype(dt, [&]<class T>(std::type_identity<T>) {
          if constexpr (std::is_floating_point_v<T>) {
            T* d = static_cast<T*>(data);
            o->on_complete([d, count, n] { detail::divide_in_place(d, count, n); });
          }
        });
      }
    }
    return comm_handle(std::move(o));
  }

  comm_handle post_reduce_scatter(const void* in, void* out, std::size_t block, std::span<const std::size_t> counts,
                                  comm_dtype dt, reduce_op op) {
    require_valid("reduce_scatter");
    const bool equal = counts.empty();
    const std::size_t total = equal ? block * std::size_t(size_) : sum(counts);
    const std::size_t own = equal ? block : counts[std::size_t(rank_)];
    check_int_count("reduce_scatter", total);
    auto o = make_op("reduce_scatter", total * dtype_bytes(dt));
    const MPI_Op mop = op == reduce_op::max ? MPI_MAX : MPI_SUM;
    const bool avg = op == reduce_op::avg;
    const int n = size_;
    if (!equal) to_ints(counts, o->int_args());

    const void* send = in;
    void* recv = out;
    MPI_Datatype t = detail::mpi_move_type(dt);
    if (detail::is_16bit(dt)) {
      // Input and output staged side by side: [0, total) in, [total, total + own) out.
      float* s = o->stage(total + own);
      visit_dtype(dt, [&]<class T>(std::type_identity<T>) {
        detail::widen_to_float(static_cast<const T*>(in), s, total);
        T* d = static_cast<T*>(out);
        o->on_complete([s, total, d, own, avg, n] { detail::narrow_from_float(s + total, d, own, avg, n); });
      });
      send = s;
      recv = s + total;
      t = MPI_FLOAT;
    } else if (avg) {
      visit_dtype(dt, [&]<class T>(std::type_identity<T>) {
        if constexpr (std::is_floating_point_v<T>) {
          T* d = static_cast<T*>(out);
          o->on_complete([d, own, n] { detail::divide_in_place(d, own, n); });
        }
      });
    }
    if (equal) {
      o->check(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(block), t, mop, comm_, o->next_request()));
    } else {
      o->check(MPI_Ireduce_scatter(send, recv, o->int_args().data(), t, mop, comm_, o->next_request()));
    }
    return comm_handle(std::move(o));
  }

  comm_handle post_all_gather(const void* in, void* out, std::size_t block, std::span<const std::size_t> counts,
                              comm_dtype dt) {
    require_valid("all_gather");
    const bool equal = counts.empty();
    const std::size_t total = equal ? block * std::size_t(size_) : sum(counts);
    const std::size_t own = equal ? block : counts[std::size_t(rank_)];
    const std::size_t offset =
        equal ? block * std::size_t(rank_) : std::accumulate(counts.begin(), counts.begin() + rank_, std::size_t{0});
    check_int_count("all_gather", total);
    const std::size_t esz = dtype_bytes(dt);
    auto o = make_op("all_gather", total * esz);
    const MPI_Datatype t = detail::mpi_move_type(dt);
    const void* send = (in == static_cast<const char*>(out) + offset * esz) ? MPI_IN_PLACE : in;
    if (equal) {
      const int b = static_cast<int>(block);
      o->check(MPI_Iallgather(send, b, t, out, b, t, comm_, o->next_request()));
    } else {
      std::vector<int>& a = o->int_args();
      to_ints(counts, a);
      a.resize(2 * std::size_t(size_));
      for (int r = 0, d = 0; r < size_; ++r) {
        a[std::size_t(size_ + r)] = d;
        d += a[std::size_t(r)];
      }
      o->check(MPI_Iallgatherv(send, static_cast<int>(own), t, out, a.data(), a.data() + size_, t, comm_,
                               o->next_request()));
    }
    return comm_handle(std::move(o));
  }

  comm_handle post_broadcast(void* data, std::size_t count, comm_dtype dt, int root) {
    require_valid("broadcast");
    auto o = make_op("broadcast", count * dtype_bytes(dt));
    const MPI_Datatype t = detail::mpi_move_type(dt);
    char* bytes = static_cast<char*>(data);
    const std::size_t esz = dtype_bytes(dt);
    for_chunks(count, [&](std::size_t off, int c) {
      o->check(MPI_Ibcast(bytes + off * esz, c, t, root, comm_, o->next_request()));
    });
    return comm_handle(std::move(o));
  }

  comm_handle post_all_to_all(const void* in, void* out, std::size_t block, std::span<const std::size_t> send_counts,
                              std::span<const std::size_t> recv_counts, comm_dtype dt) {
    require_valid("all_to_all");
    const bool equal = send_counts.empty();
    const std::size_t in_total = equal ? block * std::size_t(size_) : sum(send_counts);
    const std::size_t out_total = equal ? in_total : sum(recv_counts);
    check_int_count("all_to_all", std::max(in_total, out_total));
    auto o = make_op("all_to_all", in_total * dtype_bytes(dt));
    const MPI_Datatype t = detail::mpi_move_type(dt);
    if (equal) {
      const int b = static_cast<int>(block);
      o->check(MPI_Ialltoall(in, b, t, out, b, t, comm_, o->next_request()));
    } else {
      // [send counts | send offsets | receive counts | receive offsets], alive until completion.
      std::vector<int>& a = o->int_args();
      const std::size_t n = std::size_t(size_);
      a.assign(4 * n, 0);
      for (std::size_t r = 0, sd = 0, rd = 0; r < n; ++r) {
        a[r] = static_cast<int>(send_counts[r]);
        a[n + r] = static_cast<int>(sd);
        a[2 * n + r] = static_cast<int>(recv_counts[r]);
        a[3 * n + r] = static_cast<int>(rd);
        sd += send_counts[r];
        rd += recv_counts[r];
      }
      o->check(MPI_Ialltoallv(in, a.data(), a.data() + n, t, out, a.data() + 2 * n, a.data() + 3 * n, t, comm_,
                              o->next_request()));
    }
    return comm_handle(std::move(o));
  }

  comm_handle post_p2p(std::span<const p2p_op> ops) {
    require_valid("p2p");
    std::uint64_t bytes = 0;
    bool sends = false, recvs = false;
    for (const p2p_op& p : ops) {
      if (p.peer == no_peer) continue;
      bytes += p.bytes();
      (p.dir == p2p_op::direction::send ? sends : recvs) = true;
    }
    auto o = make_op(sends && recvs ? "send/recv" : (sends ? "send" : "recv"), bytes);
    for (const p2p_op& p : ops) {
      if (p.peer == no_peer) continue;
      const MPI_Datatype t = detail::mpi_move_type(p.dtype);
      char* base = static_cast<char*>(p.data);
      const std::size_t esz = dtype_bytes(p.dtype);
      for_chunks(p.count, [&](std::size_t off, int c) {
        if (p.dir == p2p_op::direction::send) {
          o->check(MPI_Isend(base + off * esz, c, t, p.peer, p.tag, comm_, o->next_request()));
        } else {
          o->check(MPI_Irecv(base + off * esz, c, t, p.peer, p.tag, comm_, o->next_request()));
        }
      });
    }
    return comm_handle(std::move(o));
  }

  comm_handle post_barrier() { return post_barrier_named("barrier"); }

  // A barrier that calls itself `op` in a stall report (e.g. "finalize"); uncounted.
  comm_handle post_barrier_named(std::string_view op) {
    require_valid("barrier");
    auto o = make_op(op, 0);
    o->check(MPI_Ibarrier(comm_, o->next_request()));
    return comm_handle(std::move(o));
  }

 private:
  void adopt_setup() {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }

  void release() noexcept {
    if (comm_ != MPI_COMM_NULL && detail::mpi_is_initialized()) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  void require_valid(const char* op) const {
    STRATA_CHECK(valid(), op, " on group '", name(), "': this rank is not a member (empty communicator)");
  }

  void check_rc(const char* op, int rc) const {
    if (rc != MPI_SUCCESS)
      detail::mpi_abort_job(detail::failure_line(world_rank_, op, name(), 0, detail::mpi_error_string(rc)));
  }

  void check_int_count(const char* op, std::size_t total) const {
    STRATA_CHECK(total <= static_cast<std::size_t>(INT_MAX), op, " on group ", name(), ": ", total,
                 " elements in all; the MPI engine takes at most ", INT_MAX);
  }

  std::unique_ptr<detail::mpi_operation> make_op(std::string_view op, std::uint64_t bytes) const {
    return std::make_unique<detail::mpi_operation>(op, name(), bytes, world_rank_, options_.timeout_s);
  }

  // Calls f(offset, count) for consecutive pieces of at most options_.chunk_elements elements.
  template <class F>
  void for_chunks(std::size_t count, F&& f) const {
    const std::size_t chunk = std::clamp<std::size_t>(options_.chunk_elements, 1, static_cast<std::size_t>(INT_MAX));
    for (std::size_t off = 0; off < count; off += chunk) f(off, static_cast<int>(std::min(chunk, count - off)));
  }

  static std::size_t sum(std::span<const std::size_t> c) { return std::accumulate(c.begin(), c.end(), std::size_t{0}); }
  static void to_ints(std::span<const std::size_t> c, std::vector<int>& out) {
    out.resize(c.size());
    for (std::size_t i = 0; i < c.size(); ++i) out[i] = static_cast<int>(c[i]);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 0, world_rank_ = 0;
  comm_options options_{};
};

static_assert(communicator<mpi_communicator>);

}  // namespace strata
