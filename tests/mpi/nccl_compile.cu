// tests/mpi/nccl_compile.cu - compiles the CUDA engines (no GPU needed): every typed call of the
// NCCL engine and of the MPI engine on staged device buffers, for every dtype, sync and async,
// plus the NCCL mesh groups. Built as an OBJECT library when nvcc is found.
#include <span>
#include <vector>

#include <strata/comm/mpi_device_communicator.cuh>
#include <strata/comm/nccl_communicator.cuh>

namespace strata_nccl_compile {

template <class Comm, class T>
void use_everything(Comm& c, T* d, std::size_t n) {
  std::span<T> s(d, n);
  std::span<const T> cs(d, n);
  std::vector<std::size_t> counts(static_cast<std::size_t>(c.size()), 1);
  c.all_reduce(s);
  c.all_reduce(s, strata::reduce_op::avg);
  c.all_reduce_async(s, strata::reduce_op::max).wait();
  c.reduce_scatter(cs, s.first(1));
  c.reduce_scatter_async(cs, s.first(1), counts).wait();
  c.all_gather(cs.first(1), s);
  c.all_gather_async(cs.first(1), s, counts).wait();
  c.broadcast(s, 0);
  c.broadcast_async(s, 0).wait();
  c.all_to_all(cs, s);
  c.all_to_all_async(cs, s).wait();
  c.all_to_all_v(cs, counts, s, counts);
  c.all_to_all_v_async(cs, counts, s, counts).wait();
  c.p2p({strata::send_to(0, cs), strata::recv_from(0, s)});
  c.send(cs, 0);
  c.recv(s, 0);
  c.barrier();
  (void)c.counters().json();
}

#define STRATA_USE(COMM, T) template void use_everything<COMM, T>(COMM&, T*, std::size_t);
STRATA_USE(strata::nccl_communicator, float)
STRATA_USE(strata::nccl_communicator, double)
STRATA_USE(strata::nccl_communicator, strata::bf16)
STRATA_USE(strata::nccl_communicator, strata::fp16)
STRATA_USE(strata::mpi_device_communicator, float)
STRATA_USE(strata::mpi_device_communicator, double)
STRATA_USE(strata::mpi_device_communicator, strata::bf16)
STRATA_USE(strata::mpi_device_communicator, strata::fp16)
#undef STRATA_USE

strata::nccl_groups groups(strata::process_mesh& mesh, cudaStream_t stream) {
  return strata::make_nccl_groups(mesh, stream);
}

static_assert(strata::communicator<strata::nccl_communicator>);
static_assert(strata::communicator<strata::mpi_device_communicator>);
static_assert(strata::communicator<strata::mpi_communicator>);

}  // namespace strata_nccl_compile
