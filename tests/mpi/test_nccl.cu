// tests/mpi/test_nccl.cu - the CUDA engines on a GPU: NCCL and MPI-staged device buffers.
//
// Exits 77 (ctest: skipped) when no CUDA device is present. Otherwise checks, on device
// buffers, all_reduce (sum/avg/max), uneven reduce_scatter and all_gather, broadcast, a p2p ring,
// all_to_all (equal and uneven) and barrier for every dtype against the fp64 reference of every
// rank's deterministic input:
//   - through mpi_device_communicator (any number of ranks, sharing the GPUs);
//   - through the NCCL mesh groups, when there is a GPU per rank (NCCL needs distinct devices).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <strata/comm/mpi_device_communicator.cuh>
#include <strata/comm/nccl_communicator.cuh>

#include "mpi_test.hpp"

using namespace strata_test;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "FAIL rank %d: %s\n", world().rank(), what.c_str());
  }
}

template <class T>
struct device_vec {
  T* p = nullptr;
  std::size_t n = 0;
  explicit device_vec(const std::vector<T>& h) : n(h.size()) {
    cudaMalloc(&p, (n ? n : 1) * sizeof(T));
    cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  explicit device_vec(std::size_t count) : n(count) {
    cudaMalloc(&p, (n ? n : 1) * sizeof(T));
    cudaMemset(p, 0, (n ? n : 1) * sizeof(T));
  }
  ~device_vec() { cudaFree(p); }
  std::span<T> span() { return {p, n}; }
  std::vector<T> host() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

template <class T>
void check_reduced(const std::vector<T>& got, std::uint64_t seed, int n, std::size_t offset, strata::reduce_op op,
                   const std::string& what) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    double sum = 0, abs_sum = 0, mx = -1e300;
    for (int r = 0; r < n; ++r) {
      const double x = input_d<T>(seed, r, offset + i);
      sum += x;
      abs_sum += std::fabs(x);
      mx = std::max(mx, x);
    }
    const double g = as_double(got[i]);
    if (op == strata::reduce_op::max) {
      if (g != mx) return expect(false, what + " max element " + std::to_string(offset + i));
      continue;
    }
    const double ref = op == strata::reduce_op::avg ? sum / n : sum;
    const double tol = reduction_tolerance<T>(ref, op == strata::reduce_op::avg ? abs_sum / n : abs_sum, n);
    if (!(std::fabs(g - ref) <= tol))
      return expect(false, what + " element " + std::to_string(offset + i) + ": got " + std::to_string(g) +
                               " expected " + std::to_string(ref));
  }
}

template <class T, class Comm>
void exercise(Comm& c, const std::string& engine) {
  const int n = c.size(), r = c.rank();
  const std::string tag = engine + " " + strata::dtype_name<T>();
  for (auto op : {strata::reduce_op::sum, strata::reduce_op::avg, strata::reduce_op::max}) {
    device_vec<T> d(inputs<T>(11, r, 1001));
    c.all_reduce(d.span(), op);
    check_reduced<T>(d.host(), 11, n, 0, op, tag + " all_reduce " + std::string(strata::reduce_op_name(op)));
  }
  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) counts[std::size_t(q)] = std::size_t((q * 5 + 2) % 7) * 10;
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  const std::size_t offset = std::accumulate(counts.begin(), counts.begin() + r, std::size_t{0});
  {
    device_vec<T> in(inputs<T>(12, r, total)), out(counts[std::size_t(r)]);
    c.reduce_scatter(in.span(), out.span(), counts);
    check_reduced<T>(out.host(), 12, n, offset, strata::reduce_op::sum, tag + " reduce_scatter (uneven)");
  }
  {
    device_vec<T> in(inputs<T>(13, r, counts[std::size_t(r)])), out(total);
    c.all_gather(in.span(), out.span(), counts);
    auto h = out.host();
    std::size_t at = 0;
    bool ok = true;
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < counts[std::size_t(q)]; ++i) ok = ok && same_bits(h[at++], input<T>(13, q, i));
    expect(ok, tag + " all_gather (uneven)");
  }
  {
    device_vec<T> d(inputs<T>(14, r, 77));
    c.broadcast(d.span(), n - 1);
    auto h = d.host();
    bool ok = true;
    for (std::size_t i = 0; i < h.size(); ++i) ok = ok && same_bits(h[i], input<T>(14, n - 1, i));
    expect(ok, tag + " broadcast");
  }
  {
    device_vec<T> out(inputs<T>(15, r, 500)), in(500);
    c.p2p({strata::send_to((r + 1) % n, out.span()), strata::recv_from((r + n - 1) % n, in.span())});
    auto h = in.host();
    bool ok = true;
    for (std::size_t i = 0; i < h.size(); ++i) ok = ok && same_bits(h[i], input<T>(15, (r + n - 1) % n, i));
    expect(ok, tag + " p2p ring");
  }
  {
    // all_to_all_v: rank s sends (s + 2q) % 5 * 7 elements to rank q (some none); then equal blocks.
    const auto pair = [](int from, int to) { return std::size_t((from + 2 * to) % 5) * 7; };
    std::vector<std::size_t> send(static_cast<std::size_t>(n)), recv(static_cast<std::size_t>(n));
    for (int q = 0; q < n; ++q) {
      send[std::size_t(q)] = pair(r, q);
      recv[std::size_t(q)] = pair(q, r);
    }
    device_vec<T> in(inputs<T>(16, r, std::accumulate(send.begin(), send.end(), std::size_t{0})));
    device_vec<T> out(std::accumulate(recv.begin(), recv.end(), std::size_t{0}));
    c.all_to_all_v(in.span(), send, out.span(), recv);
    auto h = out.host();
    bool ok = true;
    std::size_t at = 0;
    for (int q = 0; q < n; ++q) {
      std::size_t from = 0;
      for (int k = 0; k < r; ++k) from += pair(q, k);
      for (std::size_t i = 0; i < pair(q, r); ++i) ok = ok && same_bits(h[at++], input<T>(16, q, from + i));
    }
    expect(ok, tag + " all_to_all_v");
    device_vec<T> eq_in(inputs<T>(17, r, 9 * std::size_t(n))), eq_out(9 * std::size_t(n));
    c.all_to_all(eq_in.span(), eq_out.span());
    h = eq_out.host();
    ok = true;
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < 9; ++i)
        ok = ok && same_bits(h[std::size_t(q) * 9 + i], input<T>(17, q, std::size_t(r) * 9 + i));
    expect(ok, tag + " all_to_all");
  }
  c.barrier();
}

template <class Comm>
void exercise_all(Comm& c, const std::string& engine) {
  exercise<float>(c, engine);
  exercise<double>(c, engine);
  exercise<strata::bf16>(c, engine);
  exercise<strata::fp16>(c, engine);
}

strata::world* the_world = nullptr;

}  // namespace

strata::world& strata_test::world() { return *the_world; }

int main(int argc, char** argv) {
  auto w = strata::launch(argc, argv);
  the_world = &w;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    if (w.rank() == 0) std::printf("test_nccl: no CUDA device: skipped\n");
    return 77;
  }
  cudaSetDevice(w.local_rank() % devices);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  {
    strata::mpi_device_communicator staged(w.comm(), stream);
    exercise_all(staged, "mpi_device");
    if (w.local_size() <= devices) {
      strata::layout_config cfg;
      cfg.dp = w.size();
      strata::process_mesh mesh(w, cfg);
      strata::nccl_groups g = strata::make_nccl_groups(mesh, stream);
      exercise_all(g.world, "nccl world");
      exercise_all(g.dp, "nccl dp");
      expect(g.dp.counters()[strata::op_kind::all_reduce].calls == 12, "nccl dp counters");
    } else if (w.rank() == 0) {
      std::printf("test_nccl: %d ranks on %d devices: NCCL part skipped (needs a GPU per rank)\n", w.local_size(),
                  devices);
    }
  }
  cudaStreamDestroy(stream);
  int worst = 0;
  MPI_Allreduce(&failures, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (w.rank() == 0) std::printf("test_nccl: %s\n", worst == 0 ? "PASS" : "FAIL");
  return worst == 0 ? 0 : 1;
}
