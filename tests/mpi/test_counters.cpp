// tests/mpi/test_counters.cpp - byte counters hold the analytic per-rank volumes.
//
// The expected figures are written here the way later issues assert them (2(n-1)/n S for an
// all-reduce, (n-1)/n S for reduce-scatter, all-gather and all-to-all, S for a broadcast and a
// message), on sizes the group divides, plus the exact rule for uneven ones.
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include <strata/comm/counters.hpp>
#include <strata/comm/mpi_communicator.hpp>

#include "mpi_test.hpp"

using namespace strata_test;
using strata::bf16;
using strata::op_kind;

namespace {

// A fresh communicator over the world, so counts start at zero.
strata::mpi_communicator fresh(const char* name) {
  strata::comm_options o;
  o.timeout_s = 60;
  return strata::mpi_communicator(MPI_COMM_WORLD, name, o);
}

}  // namespace

TEST_CASE("counters: analytic volumes per operation, per group") {
  auto c = fresh("dp");
  const std::uint64_t n = std::uint64_t(c.size());
  const int me = c.rank();
  const std::uint64_t count = 1024 * n;  // divisible by n

  std::vector<float> f(count);
  c.all_reduce(f);
  c.all_reduce(f, strata::reduce_op::avg);
  const std::uint64_t S = count * 4;
  CHECK(c.counters()[op_kind::all_reduce] ==
        strata::op_counts{2, 2 * (2 * (n - 1) * S / n), 2 * (2 * (n - 1) * S / n)});

  // bf16 counts the caller's 2-byte elements, although the MPI engine reduces them as fp32.
  std::vector<bf16> h(count);
  c.all_reduce(h);
  const std::uint64_t Sh = count * 2;
  CHECK(c.counters()[op_kind::all_reduce].bytes_sent == 2 * (2 * (n - 1) * S / n) + 2 * (n - 1) * Sh / n);

  std::vector<float> part(1024);
  c.reduce_scatter(f, part);
  CHECK(c.counters()[op_kind::reduce_scatter] == strata::op_counts{1, (n - 1) * S / n, (n - 1) * S / n});

  c.all_gather(part, f);
  CHECK(c.counters()[op_kind::all_gather] == strata::op_counts{1, (n - 1) * S / n, (n - 1) * S / n});

  std::vector<double> b(100);
  c.broadcast(b, 0);
  const std::uint64_t Sb = 800;
  if (n == 1) {
    CHECK(c.counters()[op_kind::broadcast] == strata::op_counts{1, 0, 0});
  } else if (me == 0) {
    CHECK(c.counters()[op_kind::broadcast] == strata::op_counts{1, Sb, 0});
  } else {
    CHECK(c.counters()[op_kind::broadcast] == strata::op_counts{1, 0, Sb});
  }

  // all_to_all: every block but the one a rank keeps, each way.
  std::vector<float> swapped(count);
  c.all_to_all(f, swapped);
  CHECK(c.counters()[op_kind::all_to_all] == strata::op_counts{1, (n - 1) * S / n, (n - 1) * S / n});

  // A p2p group counts one send and one receive per message.
  const int next = (me + 1) % int(n), prev = (me + int(n) - 1) % int(n);
  std::vector<bf16> act(300), grad(300);
  c.p2p({strata::send_to(next, act), strata::recv_from(prev, grad), strata::send_to(strata::no_peer, act)});
  CHECK(c.counters()[op_kind::send] == strata::op_counts{1, 600, 0});
  CHECK(c.counters()[op_kind::recv] == strata::op_counts{1, 0, 600});

  c.barrier();
  CHECK(c.counters()[op_kind::barrier] == strata::op_counts{1, 0, 0});

  const auto t = c.counters().total();
  CHECK(t.calls == 3 + 1 + 1 + 1 + 1 + 2 + 1);
  CHECK(c.counters().group() == "dp");

  c.reset_counters();
  CHECK(c.counters().total() == strata::op_counts{});
  CHECK(c.counters().json() == "{}");
}

TEST_CASE("counters: uneven sizes count everything but this rank's own part") {
  auto c = fresh("tp");
  const int n = c.size(), me = c.rank();
  // all_reduce of 5 elements: the ring gives rank r count/n (+1 for r < count % n) elements.
  std::vector<double> v(5);
  c.all_reduce(v);
  const std::uint64_t own = 5 / std::uint64_t(n) + (std::uint64_t(me) < 5 % std::uint64_t(n) ? 1 : 0);
  const std::uint64_t expect = n == 1 ? 0 : 2 * (5 - own) * 8;
  CHECK(c.counters()[op_kind::all_reduce].bytes_sent == expect);
  CHECK(c.counters()[op_kind::all_reduce].bytes_received == expect);

  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) counts[std::size_t(r)] = std::size_t(3 * r + 1);
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  std::vector<float> in(total), out(counts[std::size_t(me)]);
  c.reduce_scatter(in, out, counts);
  c.all_gather(out, in, counts);
  const std::uint64_t others = n == 1 ? 0 : (total - counts[std::size_t(me)]) * 4;
  CHECK(c.counters()[op_kind::reduce_scatter] == strata::op_counts{1, others, others});
  CHECK(c.counters()[op_kind::all_gather] == strata::op_counts{1, others, others});

  // all_to_all_v: rank s sends s + 2r + 1 elements to rank r; sent and received differ.
  std::vector<std::size_t> send_counts(static_cast<std::size_t>(n)), recv_counts(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    send_counts[std::size_t(r)] = std::size_t(me + 2 * r + 1);
    recv_counts[std::size_t(r)] = std::size_t(r + 2 * me + 1);
  }
  const auto sum = [](const std::vector<std::size_t>& v) {
    return std::accumulate(v.begin(), v.end(), std::size_t{0});
  };
  std::vector<double> a2a_in(sum(send_counts)), a2a_out(sum(recv_counts));
  c.all_to_all_v(a2a_in, send_counts, a2a_out, recv_counts);
  const std::uint64_t kept = std::uint64_t(3 * me + 1) * 8;
  const strata::op_counts a2a = n == 1 ? strata::op_counts{1, 0, 0}
                                       : strata::op_counts{1, sum(send_counts) * 8 - kept, sum(recv_counts) * 8 - kept};
  CHECK(c.counters()[op_kind::all_to_all] == a2a);
}

TEST_CASE("counters: JSON for the metrics' comm object") {
  strata::comm_counters dp("dp"), tp("tp");
  dp.record(op_kind::all_reduce, {12, 12});
  dp.record(op_kind::all_reduce, {12, 12});
  dp.record(op_kind::barrier, {});
  tp.record(op_kind::send, {5, 0});
  CHECK(
      dp.json() ==
      R"({"all_reduce":{"calls":2,"bytes_sent":24,"bytes_received":24},"barrier":{"calls":1,"bytes_sent":0,"bytes_received":0}})");
  CHECK(
      strata::comm_json({&dp, nullptr, &tp}) ==
      R"({"dp":{"all_reduce":{"calls":2,"bytes_sent":24,"bytes_received":24},"barrier":{"calls":1,"bytes_sent":0,"bytes_received":0}},"tp":{"send":{"calls":1,"bytes_sent":5,"bytes_received":0}}})");
  // The analytic helpers, on their own.
  CHECK(strata::volume::all_reduce(1000, 4, 4, 0) == strata::comm_volume{6000, 6000});  // 2 * 3/4 * 4000
  CHECK(strata::volume::all_reduce(1000, 4, 1, 0) == strata::comm_volume{0, 0});
  CHECK(strata::volume::reduce_scatter(4000, 1000, 4) == strata::comm_volume{3000, 3000});
  CHECK(strata::volume::broadcast(10, 3, true) == strata::comm_volume{10, 0});
  CHECK(strata::volume::broadcast(10, 3, false) == strata::comm_volume{0, 10});
  CHECK(strata::volume::all_to_all(4000, 4000, 1000, 4) == strata::comm_volume{3000, 3000});
  CHECK(strata::volume::all_to_all(4000, 4000, 4000, 1) == strata::comm_volume{0, 0});
}

TEST_CASE("STRATA_COMM_TIMEOUT parsing") {
  CHECK(strata::parse_comm_timeout("2") == 2.0);
  CHECK(strata::parse_comm_timeout("0.5") == 0.5);
  CHECK(strata::parse_comm_timeout("0") == 0.0);
  CHECK_THROWS_WITH_AS(strata::parse_comm_timeout("soon"),
                       "STRATA_COMM_TIMEOUT='soon' is not a number of seconds >= 0 (0 waits forever)", strata::error);
  CHECK_THROWS_AS(strata::parse_comm_timeout("-1"), strata::error);
  CHECK_THROWS_AS(strata::parse_comm_timeout(""), strata::error);
  CHECK(strata::detail::stall_line(3, 2.0, "all_reduce", "dp", 4096) ==
        "strata: rank 3 timed out after 2.0 s in all_reduce on group dp (4096 bytes); aborting the job");
}
