// strata/comm/group_ref.hpp - a process group behind one small, non-template interface.
//
// Layers are templates on the policy, not on the communicator, yet tensor-parallel layers talk
// to their group inside forward and backward. group_ref lets them: it refers to any
// communicator (MPI, NCCL, MPI-on-device) and forwards the few collectives layers use, with
// the element type as a run-time value. The communicator keeps counting what moves, under its
// own name. An empty group_ref is a group of one: every collective is the identity.
//
//   strata::group_ref tp(mesh.tp());
//   tp.all_reduce(std::span<float>(x, n));
#pragma once
#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <type_traits>

#include "strata/comm/communicator.hpp"
#include "strata/core/error.hpp"

namespace strata {

class group_ref {
 public:
  group_ref() = default;  // a group of one
  template <communicator Comm>
  explicit group_ref(Comm& c) : impl_(std::make_shared<adapter<Comm>>(c)) {}

  int size() const { return impl_ ? impl_->size() : 1; }
  int rank() const { return impl_ ? impl_->rank() : 0; }
  std::string name() const { return impl_ ? impl_->name() : std::string("self"); }

  // In place over the group.
  template <comm_scalar T>
  void all_reduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    if (impl_ && size() > 1) impl_->all_reduce(data.data(), data.size(), comm_dtype_of<T>, op);
  }
  // out = every rank's `in` (equal sizes), in rank order.
  template <comm_scalar T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    if (sized_and_alone("all_gather", "output", in, out, out.size(), in.size())) return;
    impl_->all_gather(in.data(), out.data(), in.size(), comm_dtype_of<T>);
  }
  // Block r of `in` (size() equal blocks) goes to rank r; block r of `out` came from rank r. A
  // group of one keeps its one block: `out` is `in`.
  template <comm_scalar T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    const std::size_t n = static_cast<std::size_t>(size());
    STRATA_CHECK(in.size() == out.size() && in.size() % n == 0, "group_ref::all_to_all on ", name(),
                 ": the input holds ", in.size(), " elements and the output ", out.size(), "; both must be ", n,
                 " x one block size");
    if (impl_ && n > 1) {
      impl_->all_to_all(in.data(), out.data(), in.size() / n, comm_dtype_of<T>);
    } else if (out.data() != in.data()) {
      std::copy(in.begin(), in.end(), out.begin());
    }
  }
  // Uneven blocks: send_counts[r] elements of `in` (in rank order) go to rank r; recv_counts[r]
  // elements of `out` came from rank r. A group of one keeps its one block.
  template <comm_scalar T>
  void all_to_all_v(std::span<const T> in, std::span<const std::size_t> send_counts, std::span<T> out,
                    std::span<const std::size_t> recv_counts) {
    const std::size_t n = static_cast<std::size_t>(size());
    STRATA_CHECK(send_counts.size() == n && recv_counts.size() == n, "group_ref::all_to_all_v on ", name(), ": ",
                 send_counts.size(), " send and ", recv_counts.size(), " receive counts for ", n, " ranks");
    if (impl_ && n > 1) {
      impl_->all_to_all_v(in.data(), in.size(), send_counts, out.data(), out.size(), recv_counts, comm_dtype_of<T>);
    } else {
      STRATA_CHECK(in.size() == out.size(), "group_ref::all_to_all_v on ", name(), ": a group of one keeps its ",
                   in.size(), " elements, the output holds ", out.size());
      if (out.data() != in.data()) std::copy(in.begin(), in.end(), out.begin());
    }
  }
  // From `root` to every rank, in place.
  template <comm_scalar T>
  void broadcast(std::span<T> data, int root) {
    if (impl_ && size() > 1) impl_->broadcast(data.data(), data.size(), comm_dtype_of<T>, root);
  }
  // Point to point within the group; the buffers belong to the call until its handle is waited on.
  template <comm_scalar T>
  comm_handle send_async(std::span<const T> data, int peer, int tag) {
    STRATA_CHECK(impl_, "group_ref::send_async: a group of one has no peer ", peer);
    return impl_->send(data.data(), data.size(), comm_dtype_of<T>, peer, tag);
  }
  template <comm_scalar T>
  comm_handle recv_async(std::span<T> data, int peer, int tag) {
    STRATA_CHECK(impl_, "group_ref::recv_async: a group of one has no peer ", peer);
    return impl_->recv(data.data(), data.size(), comm_dtype_of<T>, peer, tag);
  }
  // Several sends and receives posted together (communicator.hpp's p2p): the way to exchange with
  // neighbours on an engine whose messages match in posting order (NCCL has no tags).
  comm_handle p2p_async(std::span<const p2p_op> ops) {
    STRATA_CHECK(impl_, "group_ref::p2p_async: a group of one has no peers");
    return impl_->p2p(ops);
  }
  // out = the sum over ranks of this rank's part of `in` (size() equal parts).
  template <comm_scalar T>
  void reduce_scatter(std::span<const T> in, std::span<T> out) {
    if (sized_and_alone("reduce_scatter", "input", in, out, in.size(), out.size())) return;
    impl_->reduce_scatter(in.data(), out.data(), out.size(), comm_dtype_of<T>);
  }

 private:
  // A gather or scatter's sizes: its `whole` side holds size() parts of `part` elements. A group of
  // one has only its own part, so `out` is `in` (copied unless in place) and the call is done.
  template <comm_scalar T>
  bool sized_and_alone(const char* op, const char* whole_side, std::span<const T> in, std::span<T> out,
                       std::size_t whole, std::size_t part) const {
    STRATA_CHECK(whole == part * static_cast<std::size_t>(size()), "group_ref::", op, " on ", name(), ": the ",
                 whole_side, " holds ", whole, " elements, expected ", part, " x ", size());
    if (impl_ && size() > 1) return false;
    if (out.data() != in.data()) std::copy(in.begin(), in.end(), out.begin());
    return true;
  }

  struct erased {
    virtual ~erased() = default;
    virtual int size() const = 0;
    virtual int rank() const = 0;
    virtual std::string name() const = 0;
    virtual void all_reduce(void* data, std::size_t n, comm_dtype d, reduce_op op) = 0;
    virtual void all_gather(const void* in, void* out, std::size_t n_each, comm_dtype d) = 0;
    virtual void reduce_scatter(const void* in, void* out, std::size_t n_each, comm_dtype d) = 0;
    virtual void all_to_all(const void* in, void* out, std::size_t n_each, comm_dtype d) = 0;
    virtual void all_to_all_v(const void* in, std::size_t in_n, std::span<const std::size_t> send_counts, void* out,
                              std::size_t out_n, std::span<const std::size_t> recv_counts, comm_dtype d) = 0;
    virtual void broadcast(void* data, std::size_t n, comm_dtype d, int root) = 0;
    virtual comm_handle send(const void* data, std::size_t n, comm_dtype d, int peer, int tag) = 0;
    virtual comm_handle recv(void* data, std::size_t n, comm_dtype d, int peer, int tag) = 0;
    virtual comm_handle p2p(std::span<const p2p_op> ops) = 0;
  };
  template <class Comm>
  struct adapter final : erased {
    explicit adapter(Comm& c) : comm(&c) {}
    int size() const override { return comm->size(); }
    int rank() const override { return comm->rank(); }
    std::string name() const override { return std::string(comm->name()); }
    void all_reduce(void* data, std::size_t n, comm_dtype d, reduce_op op) override {
      visit_dtype(d, [&](auto id) {
        using T = typename decltype(id)::type;
        comm->all_reduce(std::span<T>(static_cast<T*>(data), n), op);
      });
    }
    void all_gather(const void* in, void* out, std::size_t n_each, comm_dtype d) override {
      visit_dtype(d, [&](auto id) {
        using T = typename decltype(id)::type;
        comm->all_gather(std::span<const T>(static_cast<const T*>(in), n_each),
                         std::span<T>(static_cast<T*>(out), n_each * static_cast<std::size_t>(comm->size())));
      });
    }
    void reduce_scatter(const void* in, void* out, std::size_t n_each, comm_dtype d) override {
      visit_dtype(d, [&](auto id) {
        using T = typename decltype(id)::type;
        comm->reduce_scatter(
            std::span<const T>(static_cast<const T*>(in), n_each * static_cast<std::size_t>(comm->size())),
            std::span<T>(static_cast<T*>(out), n_each), reduce_op::sum);
      });
    }
    void all_to_all(const void* in, void* out, std::size_t n_each, comm_dtype d) override {
      visit_dtype(d, [&](auto id) {
        using T = typename decltype(id)::type;
        const std::size_t n = n_each * static_cast<std::size_t>(comm->size());
        comm->all_to_all(std::span<const T>(static_cast<const T*>(in), n), std::span<T>(static_cast<T*>(out), n));
      });
    }
    void all_to_all_v(const void* in, std::size_t in_n, std::span<const std::size_t> send_counts, void* out,
                      std::size_t out_n, std::span<const std::size_t> recv_counts, comm_dtype d) override {
      visit_dtype(d, [&](auto id) {
        using T = typename decltype(id)::type;
        comm->all_to_all_v(std::span<const T>(static_cast<const T*>(in), in_n), send_counts,
                           std::span<T>(static_cast<T*>(out), out_n), recv_counts);
      });
    }
    void broadcast(void* data, std::size_t n, comm_dtype d, int root) override {
      visit_dtype(d, [&](auto id) {
        using T = typename decltype(id)::type;
        comm->broadcast(std::span<T>(static_cast<T*>(data), n), root);
      });
    }
    comm_handle send(const void* data, std::size_t n, comm_dtype d, int peer, int tag) override {
      return visit_dtype(d, [&](auto id) {
        using T = typename decltype(id)::type;
        return comm->send_async(std::span<const T>(static_cast<const T*>(data), n), peer, tag);
      });
    }
    comm_handle recv(void* data, std::size_t n, comm_dtype d, int peer, int tag) override {
      return visit_dtype(d, [&](auto id) {
        using T = typename decltype(id)::type;
        return comm->recv_async(std::span<T>(static_cast<T*>(data), n), peer, tag);
      });
    }
    comm_handle p2p(std::span<const p2p_op> ops) override { return comm->p2p_async(ops); }
    Comm* comm;
  };
  std::shared_ptr<erased> impl_;
};

}  // namespace strata
