// strata/comm/nccl_communicator.cuh - the NCCL engine: collectives on device memory, on a stream.
//
// Compiled by nvcc only (a .cuh: include it from .cu files). One nccl_communicator is one NCCL
// communicator over the same ranks as an mpi_communicator, bootstrapped over MPI: rank 0 makes
// the ncclUniqueId and broadcasts it (mpi_communicator::bootstrap_broadcast), then every rank
// calls ncclCommInitRank. Sub-groups come from ncclCommSplit with the mesh's colors
// (make_nccl_groups), so they match the MPI groups rank for rank.
//
//   cudaSetDevice(world.local_rank() % device_count);
//   strata::nccl_groups g = strata::make_nccl_groups(mesh, stream);
//   g.dp.all_reduce(std::span(d_grads, n), strata::reduce_op::avg);     // device pointers
//
// Every call is enqueued on the communicator's stream, followed by a CUDA event; the handle
// polls that event (and ncclCommGetAsyncError) against the deadline, and a call that does not
// finish in time prints the stall line (timeout.hpp), ncclCommAbort()s and MPI_Abort()s. The
// blocking forms wait for the event, so their results are on the device when they return; the
// async forms leave the work on the stream, ordered before anything enqueued on it later.
//
// Like the MPI engine, bf16/fp16 reductions accumulate in fp32: the input is widened into a
// stream-ordered fp32 buffer (cudaMallocAsync), NCCL reduces fp32, one kernel divides (avg) and
// rounds to 16 bits. This doubles the reduced bytes on the wire; counters count the caller's
// buffer as everywhere. Uneven reduce_scatter is a group of ncclReduce, uneven all_gather a
// group of ncclBroadcast, barrier an all-reduce of one float. NCCL has no message tags: p2p
// messages between one pair of ranks match in the order they are posted (p2p_op::tag is ignored).
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/comm/collectives.hpp"
#include "strata/comm/communicator.hpp"
#include "strata/comm/mesh.hpp"
#include "strata/comm/mpi_communicator.hpp"
#include "strata/comm/timeout.hpp"
#include "strata/core/dtype.hpp"

namespace strata {

namespace detail {

inline ncclDataType_t nccl_type(comm_dtype d) {
  switch (d) {
    case comm_dtype::f64: return ncclFloat64;
    case comm_dtype::bf16: return ncclBfloat16;
    case comm_dtype::fp16: return ncclFloat16;
    case comm_dtype::f32: break;
  }
  return ncclFloat32;
}

// Prints the line, aborts the NCCL communicator (so no kernel keeps spinning), ends the job.
[[noreturn]] inline void nccl_abort_job(const std::string& line, ncclComm_t comm) {
  print_line(line);
  if (comm != nullptr) ncclCommAbort(comm);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

// 16-bit <-> fp32 staging kernels (grid-stride; one thread per element).
template <class T>
__global__ void nccl_widen_kernel(const T* in, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = static_cast<float>(in[i]);
}
template <class T>
__global__ void nccl_narrow_kernel(const float* in, T* out, std::size_t n, float divisor) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = T(in[i] / divisor);
}
inline unsigned nccl_grid(std::size_t n) {
  const std::size_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks == 0 ? 1 : (blocks > 4096 ? 4096 : blocks));
}

// One enqueued call: the event after it on the stream.
class nccl_operation final : public comm_handle::operation {
 public:
  nccl_operation(cudaEvent_t event, ncclComm_t comm, std::string_view op, std::string_view group, std::uint64_t bytes,
                 int world_rank, double timeout_s)
      : event_(event),
        comm_(comm),
        op_(op),
        group_(group),
        bytes_(bytes),
        world_rank_(world_rank),
        timeout_s_(timeout_s) {}
  ~nccl_operation() override { cudaEventDestroy(event_); }

  bool test() override {
    if (done_) return true;
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaSuccess) {
      done_ = true;
      return true;
    }
    if (e != cudaErrorNotReady)
      nccl_abort_job(failure_line(world_rank_, op_, group_, bytes_, cudaGetErrorString(e)), comm_);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress)
      nccl_abort_job(failure_line(world_rank_, op_, group_, bytes_, ncclGetErrorString(async)), comm_);
    return false;
  }
  void wait() override {
    if (done_) return;
    if (!poll_with_deadline([this] { return test(); }, timeout_s_))
      nccl_abort_job(stall_line(world_rank_, timeout_s_, op_, group_, bytes_), comm_);
  }

 private:
  cudaEvent_t event_;
  ncclComm_t comm_;
  std::string op_, group_;
  std::uint64_t bytes_;
  int world_rank_;
  double timeout_s_;
  bool done_ = false;
};

}  // namespace detail

class nccl_communicator : public collectives<nccl_communicator> {
 public:
  nccl_communicator() = default;

  // Collective over `over`: an NCCL communicator with the same ranks (same order), named like
  // it unless `name` is given, working on `stream`. The current CUDA device is the rank's GPU.
  nccl_communicator(mpi_communicator& over, cudaStream_t stream, std::string name = {})
      : collectives(name.empty() ? std::string(over.name()) : std::move(name)),
        stream_(stream),
        world_rank_(over.world_rank()),
        options_(over.options()) {
    ncclUniqueId id{};
    if (over.rank() == 0) check("comm_init", ncclGetUniqueId(&id));
    over.bootstrap_broadcast(&id, sizeof id, 0);
    check("comm_init", ncclCommInitRank(&comm_, over.size(), id, over.rank()));
    setup();
  }

  nccl_communicator(nccl_communicator&& o) noexcept
      : collectives(std::move(o)),
        comm_(std::exchange(o.comm_, nullptr)),
        stream_(o.stream_),
        rank_(o.rank_),
        size_(o.size_),
        world_rank_(o.world_rank_),
        options_(o.options_),
        scratch_(std::exchange(o.scratch_, nullptr)) {}
  nccl_communicator& operator=(nccl_communicator&& o) noexcept {
    if (this != &o) {
      release();
      collectives::operator=(std::move(o));
      comm_ = std::exchange(o.comm_, nullptr);
      stream_ = o.stream_;
      rank_ = o.rank_;
      size_ = o.size_;
      world_rank_ = o.world_rank_;
      options_ = o.options_;
      scratch_ = std::exchange(o.scratch_, nullptr);
    }
    return *this;
  }
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  ~nccl_communicator() { release(); }

  bool valid() const { return comm_ != nullptr; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int world_rank() const { return world_rank_; }
  ncclComm_t native() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  void set_stream(cudaStream_t s) { stream_ = s; }
  const comm_options& options() const { return options_; }
  void set_timeout(double seconds) { options_.timeout_s = seconds; }

  // Collective over this group (ncclCommSplit): ranks with the same color form a group named
  // `name`, ordered by key; a negative color leaves this rank out (empty communicator).
  nccl_communicator split(int color, int key, std::string name) {
    require_valid("split");
    post_barrier_named("comm_split").wait();  // ncclCommSplit blocks: first make sure every rank is here
    nccl_communicator c;
    c.counters_ = comm_counters(std::move(name));
    check("comm_split", ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &c.comm_, nullptr));
    if (c.comm_ == nullptr) return c;
    c.stream_ = stream_;
    c.world_rank_ = world_rank_;
    c.options_ = options_;
    c.setup();
    return c;
  }

  // ---- engine interface (collectives.hpp): unchecked and uncounted; use the typed calls ------

  comm_handle post_all_reduce(void* data, std::size_t count, comm_dtype dt, reduce_op op) {
    require_valid("all_reduce");
    if (is_16bit(dt)) {
      float* s = stage(count);
      widen(dt, data, s, count);
      check("all_reduce",
            ncclAllReduce(s, s, count, ncclFloat32, op == reduce_op::max ? ncclMax : ncclSum, comm_, stream_));
      narrow(dt, s, data, count, op == reduce_op::avg);
      unstage(s);
    } else {
      check("all_reduce", ncclAllReduce(data, data, count, detail::nccl_type(dt), nccl_op(op), comm_, stream_));
    }
    return finish("all_reduce", count * dtype_bytes(dt));
  }

  comm_handle post_reduce_scatter(const void* in, void* out, std::size_t block, std::span<const std::size_t> counts,
                                  comm_dtype dt, reduce_op op) {
    require_valid("reduce_scatter");
    const bool equal = counts.empty();
    const std::size_t total = equal ? block * std::size_t(size_) : sum(counts);
    const std::size_t own = equal ? block : counts[std::size_t(rank_)];
    const bool staged = is_16bit(dt);
    const void* src = in;
    void* dst = out;
    float* s = nullptr;
    ncclDataType_t t = detail::nccl_type(dt);
    ncclRedOp_t rop = nccl_op(op);
    if (staged) {
      s = stage(total + own);
      widen(dt, in, s, total);
      src = s;
      dst = s + total;
      t = ncclFloat32;
      rop = op == reduce_op::max ? ncclMax : ncclSum;
    }
    const std::size_t esz = staged ? sizeof(float) : dtype_bytes(dt);
    if (equal) {
      check("reduce_scatter", ncclReduceScatter(src, dst, block, t, rop, comm_, stream_));
    } else {
      check("reduce_scatter", ncclGroupStart());
      std::size_t off = 0;
      for (int r = 0; r < size_; ++r) {
        const std::size_t c = counts[std::size_t(r)];
        if (c > 0)
          check("reduce_scatter",
                ncclReduce(static_cast<const char*>(src) + off * esz, dst, c, t, rop, r, comm_, stream_));
        off += c;
      }
      check("reduce_scatter", ncclGroupEnd());
    }
    if (staged) {
      narrow(dt, s + total, out, own, op == reduce_op::avg);
      unstage(s);
    }
    return finish("reduce_scatter", total * dtype_bytes(dt));
  }

  comm_handle post_all_gather(const void* in, void* out, std::size_t block, std::span<const std::size_t> counts,
                              comm_dtype dt) {
    require_valid("all_gather");
    const std::size_t esz = dtype_bytes(dt);
    const ncclDataType_t t = detail::nccl_type(dt);
    const bool equal = counts.empty();
    const std::size_t total = equal ? block * std::size_t(size_) : sum(counts);
    if (equal) {
      check("all_gather", ncclAllGather(in, out, block, t, comm_, stream_));
    } else {
      check("all_gather", ncclGroupStart());
      std::size_t off = 0;
      for (int r = 0; r < size_; ++r) {
        const std::size_t c = counts[std::size_t(r)];
        if (c > 0) check("all_gather", ncclBroadcast(in, static_cast<char*>(out) + off * esz, c, t, r, comm_, stream_));
        off += c;
      }
      check("all_gather", ncclGroupEnd());
    }
    return finish("all_gather", total * esz);
  }

  comm_handle post_broadcast(void* data, std::size_t count, comm_dtype dt, int root) {
    require_valid("broadcast");
    check("broadcast", ncclBroadcast(data, data, count, detail::nccl_type(dt), root, comm_, stream_));
    return finish("broadcast", count * dtype_bytes(dt));
  }

  // NCCL has no all-to-all call: one send and one receive per peer, grouped, is how it is done.
  comm_handle post_all_to_all(const void* in, void* out, std::size_t block, std::span<const std::size_t> send_counts,
                              std::span<const std::size_t> recv_counts, comm_dtype dt) {
    require_valid("all_to_all");
    const std::size_t esz = dtype_bytes(dt);
    const ncclDataType_t t = detail::nccl_type(dt);
    const bool equal = send_counts.empty();
    std::size_t send_off = 0, recv_off = 0;
    check("all_to_all", ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      const std::size_t sc = equal ? block : send_counts[std::size_t(r)];
      const std::size_t rc = equal ? block : recv_counts[std::size_t(r)];
      if (sc > 0)
        check("all_to_all", ncclSend(static_cast<const char*>(in) + send_off * esz, sc, t, r, comm_, stream_));
      if (rc > 0) check("all_to_all", ncclRecv(static_cast<char*>(out) + recv_off * esz, rc, t, r, comm_, stream_));
      send_off += sc;
      recv_off += rc;
    }
    check("all_to_all", ncclGroupEnd());
    return finish("all_to_all", send_off * esz);
  }

  comm_handle post_p2p(std::span<const p2p_op> ops) {
    require_valid("p2p");
    std::uint64_t bytes = 0;
    bool sends = false, recvs = false;
    check("p2p", ncclGroupStart());
    for (const p2p_op& p : ops) {
      if (p.peer == no_peer) continue;
      bytes += p.bytes();
      if (p.dir == p2p_op::direction::send) {
        sends = true;
        check("send", ncclSend(p.data, p.count, detail::nccl_type(p.dtype), p.peer, comm_, stream_));
      } else {
        recvs = true;
        check("recv", ncclRecv(p.data, p.count, detail::nccl_type(p.dtype), p.peer, comm_, stream_));
      }
    }
    check("p2p", ncclGroupEnd());
    return finish(sends && recvs ? "send/recv" : (sends ? "send" : "recv"), bytes);
  }

  comm_handle post_barrier() { return post_barrier_named("barrier"); }

 private:
  void setup() {
    check("comm_init", ncclCommUserRank(comm_, &rank_));
    check("comm_init", ncclCommCount(comm_, &size_));
    check_cuda("comm_init", cudaMalloc(&scratch_, sizeof(float)));
    check_cuda("comm_init", cudaMemset(scratch_, 0, sizeof(float)));
  }
  void release() noexcept {
    if (scratch_ != nullptr) cudaFree(scratch_);
    scratch_ = nullptr;
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    comm_ = nullptr;
  }
  void require_valid(const char* op) const {
    STRATA_CHECK(valid(), op, " on group '", name(), "': this rank is not a member (empty communicator)");
  }
  void check(std::string_view op, ncclResult_t r) const {
    if (r != ncclSuccess && r != ncclInProgress)
      detail::nccl_abort_job(detail::failure_line(world_rank_, op, name(), 0, ncclGetErrorString(r)), comm_);
  }
  void check_cuda(std::string_view op, cudaError_t e) const {
    if (e != cudaSuccess)
      detail::nccl_abort_job(detail::failure_line(world_rank_, op, name(), 0, cudaGetErrorString(e)), comm_);
  }
  static bool is_16bit(comm_dtype d) { return d == comm_dtype::bf16 || d == comm_dtype::fp16; }
  static ncclRedOp_t nccl_op(reduce_op op) {
    return op == reduce_op::max ? ncclMax : (op == reduce_op::avg ? ncclAvg : ncclSum);
  }
  static std::size_t sum(std::span<const std::size_t> c) { return std::accumulate(c.begin(), c.end(), std::size_t{0}); }

  float* stage(std::size_t n) {
    void* p = nullptr;
    check_cuda("stage", cudaMallocAsync(&p, (n > 0 ? n : 1) * sizeof(float), stream_));
    return static_cast<float*>(p);
  }
  void unstage(float* p) { check_cuda("stage", cudaFreeAsync(p, stream_)); }
  void widen(comm_dtype dt, const void* in, float* out, std::size_t n) {
    if (n == 0) return;
    if (dt == comm_dtype::bf16) {
      detail::nccl_widen_kernel<<<detail::nccl_grid(n), 256, 0, stream_>>>(static_cast<const bf16*>(in), out, n);
    } else {
      detail::nccl_widen_kernel<<<detail::nccl_grid(n), 256, 0, stream_>>>(static_cast<const fp16*>(in), out, n);
    }
    check_cuda("widen", cudaGetLastError());
  }
  void narrow(comm_dtype dt, const float* in, void* out, std::size_t n, bool avg) {
    if (n == 0) return;
    const float d = avg ? static_cast<float>(size_) : 1.0f;
    if (dt == comm_dtype::bf16) {
      detail::nccl_narrow_kernel<<<detail::nccl_grid(n), 256, 0, stream_>>>(in, static_cast<bf16*>(out), n, d);
    } else {
      detail::nccl_narrow_kernel<<<detail::nccl_grid(n), 256, 0, stream_>>>(in, static_cast<fp16*>(out), n, d);
    }
    check_cuda("narrow", cudaGetLastError());
  }

  comm_handle post_barrier_named(std::string_view op) {
    require_valid("barrier");
    check(op, ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
    return finish(op, 0);
  }

  comm_handle finish(std::string_view op, std::uint64_t bytes) {
    cudaEvent_t e = nullptr;
    check_cuda(op, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    check_cuda(op, cudaEventRecord(e, stream_));
    return comm_handle(
        std::make_unique<detail::nccl_operation>(e, comm_, op, name(), bytes, world_rank_, options_.timeout_s));
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_ = 0, size_ = 0, world_rank_ = 0;
  comm_options options_{};
  float* scratch_ = nullptr;
};

static_assert(communicator<nccl_communicator>);

// The mesh's groups as NCCL communicators on one stream: the world bootstrapped over MPI, the
// others split from it with the mesh's colors, so group ranks match the MPI groups'.
struct nccl_groups {
  nccl_communicator world, tp, cp, dp, pp;
  std::optional<nccl_communicator> embedding;  // empty on middle pipeline stages
};

inline nccl_groups make_nccl_groups(process_mesh& mesh, cudaStream_t stream) {
  const mesh_position& m = mesh.position();
  nccl_groups g;
  g.world = nccl_communicator(mesh.world(), stream, "world");
  g.tp = g.world.split(m.tp_color, m.tp_rank, "tp");
  g.cp = g.world.split(m.cp_color, m.cp_rank, "cp");
  g.dp = g.world.split(m.dp_color, m.dp_rank, "dp");
  g.pp = g.world.split(m.pp_color, m.pp_rank, "pp");
  nccl_communicator emb = g.world.split(m.embedding_color, m.pp_rank, "embedding");
  if (emb.valid()) g.embedding.emplace(std::move(emb));
  return g;
}

}  // namespace strata
