// tests/mpi/test_collectives.cpp - every collective of the MPI engine against an fp64 reference.
//
// Each rank builds every rank's deterministic input itself, so the expected result of any
// collective is computed locally in fp64 (all_to_all, which only moves data: bit for bit). Every
// dtype (fp32, fp64, bf16, fp16), sync and async, equal and uneven sizes (including ranks with
// nothing), sub-groups and chunked messages.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <vector>

#include <strata/comm/mpi_communicator.hpp>

#include "mpi_test.hpp"

using namespace strata_test;
using strata::bf16;
using strata::fp16;
using strata::reduce_op;

namespace {

strata::mpi_communicator& world_comm() { return world().comm(); }

// Uneven parts: (r * 5 + 2) % 7 elements for rank r: 2, 0, 5, 3, 1, 6, 4, 2, ... (rank 1 has none).
std::vector<std::size_t> uneven_counts(int n, std::size_t scale = 1, std::size_t base = 0) {
  std::vector<std::size_t> c(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) c[std::size_t(r)] = base + scale * std::size_t((r * 5 + 2) % 7);
  return c;
}

template <class T>
void check_reduced(std::span<const T> got, std::uint64_t seed, int n, std::size_t offset, reduce_op op,
                   const char* what) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    double sum = 0, abs_sum = 0, mx = -1e300;
    for (int r = 0; r < n; ++r) {
      const double x = input_d<T>(seed, r, offset + i);
      sum += x;
      abs_sum += std::fabs(x);
      mx = std::max(mx, x);
    }
    const double g = as_double(got[i]);
    if (op == reduce_op::max) {
      if (g != mx) FAIL_CHECK(what, " max element ", offset + i, ": got ", g, " expected ", mx);
      continue;
    }
    double ref = sum, abs_ref = abs_sum;
    if (op == reduce_op::avg) {
      ref /= n;
      abs_ref /= n;
    }
    const double tol = reduction_tolerance<T>(ref, abs_ref, n);
    if (!(std::fabs(g - ref) <= tol)) {
      FAIL_CHECK(what, " element ", offset + i, ": got ", g, " expected ", ref, " (tolerance ", tol, ")");
      return;
    }
  }
}

template <class T>
void run_all_reduce(strata::mpi_communicator& c, std::size_t count, reduce_op op, bool async, std::uint64_t seed) {
  auto data = inputs<T>(seed, c.rank(), count);
  if (async) {
    strata::comm_handle h = c.all_reduce_async(data, op);
    h.wait();
    CHECK_FALSE(h.pending());
  } else {
    c.all_reduce(data, op);
  }
  check_reduced<T>(data, seed, c.size(), 0, op, "all_reduce");
}

}  // namespace

TEST_CASE_TEMPLATE("all_reduce: sum, avg and max match the fp64 reference, sync and async", T, float, double, bf16,
                   fp16) {
  auto& c = world_comm();
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{4099}}) {
    for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::max}) {
      for (bool async : {false, true}) {
        CAPTURE(count);
        CAPTURE(async);
        run_all_reduce<T>(c, count, op, async, 100 + count);
      }
    }
  }
}

TEST_CASE_TEMPLATE("16-bit all_reduce accumulates in fp32 and rounds once", T, bf16, fp16) {
  // Values +-(1 + k ulp) in [1, 2) with T's full mantissa: every partial sum of up to 8 of them
  // is exact in fp32, so an fp32-accumulating reduction gives exactly T(exact sum) in any order
  // -- bit for bit, for every element. Accumulating in T instead rounds a partial sum whenever
  // it needs one more bit, and misses that value for many elements (checked below on a
  // left-to-right T sum, so the test is known to tell the two apart when n >= 3).
  auto& c = world_comm();
  const int n = c.size();
  const int mantissa = std::is_same_v<T, bf16> ? 128 : 1024;
  auto value = [&](int r, std::size_t i) {
    const double u = raw_value(900, r, i);  // [-1, 1)
    const int k = int((u + 1.0) * 0.5 * mantissa) % mantissa;
    return T(float((u < 0 ? -1.0 : 1.0) * (1.0 + double(k) / mantissa)));
  };
  const std::size_t count = 1000;
  std::vector<T> data(count);
  for (std::size_t i = 0; i < count; ++i) data[i] = value(c.rank(), i);
  c.all_reduce(data);
  int wrong = 0, narrow_differs = 0;
  for (std::size_t i = 0; i < count; ++i) {
    double exact = 0;
    T narrow_acc = value(0, i);
    for (int r = 0; r < n; ++r) exact += static_cast<float>(value(r, i));
    for (int r = 1; r < n; ++r) narrow_acc = T(static_cast<float>(narrow_acc) + static_cast<float>(value(r, i)));
    const T expected(static_cast<float>(exact));
    wrong += data[i].bits != expected.bits;
    narrow_differs += narrow_acc.bits != expected.bits;
  }
  CHECK(wrong == 0);
  if (n >= 3) CHECK(narrow_differs > 50);
  MESSAGE("ranks ", n, ": fp32 accumulation off in ", wrong, " of ", count,
          " elements; 16-bit accumulation would be off in ", narrow_differs);
}

TEST_CASE_TEMPLATE("reduce_scatter: equal parts", T, float, double, bf16, fp16) {
  auto& c = world_comm();
  const int n = c.size();
  for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{300}}) {
    for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::max}) {
      for (bool async : {false, true}) {
        CAPTURE(block);
        const std::uint64_t seed = 200 + block;
        auto in = inputs<T>(seed, c.rank(), block * std::size_t(n));
        std::vector<T> out(block);
        if (async) {
          auto h = c.reduce_scatter_async(in, out, op);
          while (!h.test()) {}
        } else {
          c.reduce_scatter(in, out, op);
        }
        check_reduced<T>(out, seed, n, block * std::size_t(c.rank()), op, "reduce_scatter");
      }
    }
  }
}

TEST_CASE_TEMPLATE("reduce_scatter: uneven parts, some empty", T, float, double, bf16, fp16) {
  auto& c = world_comm();
  const int n = c.size();
  for (std::size_t scale : {std::size_t{1}, std::size_t{150}}) {
    for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::max}) {
      for (bool async : {false, true}) {
        const auto counts = uneven_counts(n, scale);
        const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
        const std::size_t offset = std::accumulate(counts.begin(), counts.begin() + c.rank(), std::size_t{0});
        const std::uint64_t seed = 300 + scale;
        auto in = inputs<T>(seed, c.rank(), total);
        std::vector<T> out(counts[std::size_t(c.rank())]);
        if (async) {
          c.reduce_scatter_async(in, out, counts, op).wait();
        } else {
          c.reduce_scatter(in, out, counts, op);
        }
        check_reduced<T>(out, seed, n, offset, op, "reduce_scatter (uneven)");
      }
    }
  }
}

TEST_CASE_TEMPLATE("all_gather: equal, uneven and in place", T, float, double, bf16, fp16) {
  auto& c = world_comm();
  const int n = c.size();
  const std::uint64_t seed = 400;
  for (bool async : {false, true}) {
    // Equal parts.
    for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{77}}) {
      auto in = inputs<T>(seed, c.rank(), block);
      std::vector<T> out(block * std::size_t(n));
      if (async) {
        c.all_gather_async(in, out).wait();
      } else {
        c.all_gather(in, out);
      }
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < block; ++i) CHECK(same_bits(out[std::size_t(r) * block + i], input<T>(seed, r, i)));
    }
    // Uneven parts.
    const auto counts = uneven_counts(n, 3);
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    auto in = inputs<T>(seed + 1, c.rank(), counts[std::size_t(c.rank())]);
    std::vector<T> out(total);
    if (async) {
      c.all_gather_async(in, out, counts).wait();
    } else {
      c.all_gather(in, out, counts);
    }
    std::size_t at = 0;
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < counts[std::size_t(r)]; ++i) CHECK(same_bits(out[at++], input<T>(seed + 1, r, i)));
    // In place: this rank's part is already in its slot of the output.
    std::vector<T> buf(total, T(-7.0f));
    const std::size_t mine = std::accumulate(counts.begin(), counts.begin() + c.rank(), std::size_t{0});
    for (std::size_t i = 0; i < counts[std::size_t(c.rank())]; ++i) buf[mine + i] = input<T>(seed + 2, c.rank(), i);
    std::span<T> slot(buf.data() + mine, counts[std::size_t(c.rank())]);
    c.all_gather(slot, buf, counts);
    at = 0;
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < counts[std::size_t(r)]; ++i) CHECK(same_bits(buf[at++], input<T>(seed + 2, r, i)));
  }
}

TEST_CASE_TEMPLATE("broadcast from every root", T, float, double, bf16, fp16) {
  auto& c = world_comm();
  for (int root = 0; root < c.size(); ++root) {
    for (bool async : {false, true}) {
      const std::uint64_t seed = 500 + std::uint64_t(root);
      auto data = inputs<T>(seed, c.rank(), 123);
      if (async) {
        c.broadcast_async(data, root).wait();
      } else {
        c.broadcast(data, root);
      }
      bool ok = true;
      for (std::size_t i = 0; i < data.size(); ++i) ok = ok && same_bits(data[i], input<T>(seed, root, i));
      CHECK(ok);
    }
  }
}

namespace {
// Elements rank `from` sends rank `to` in the uneven all_to_all_v: 0-3, zero for some pairs.
std::size_t pair_count(int from, int to) { return std::size_t((from * 3 + to * 5 + 1) % 4); }
}  // namespace

TEST_CASE_TEMPLATE("all_to_all: equal blocks and uneven (all_to_all_v), sync and async", T, float, double, bf16, fp16) {
  auto& c = world_comm();
  const int n = c.size(), me = c.rank();
  const std::uint64_t seed = 450;
  for (bool async : {false, true}) {
    // Equal blocks: block r of rank s's input arrives as block s of rank r's output.
    for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{33}}) {
      auto in = inputs<T>(seed, me, block * std::size_t(n));
      std::vector<T> out(in.size(), T(-7.0f));
      if (async) {
        c.all_to_all_async(in, out).wait();
      } else {
        c.all_to_all(in, out);
      }
      bool ok = true;
      for (int s = 0; s < n; ++s)
        for (std::size_t i = 0; i < block; ++i)
          ok = ok && same_bits(out[std::size_t(s) * block + i], input<T>(seed, s, std::size_t(me) * block + i));
      CHECK(ok);
    }
    // Uneven blocks, some empty: rank s sends pair_count(s, r) elements to rank r.
    std::vector<std::size_t> send_counts(static_cast<std::size_t>(n)), recv_counts(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      send_counts[std::size_t(r)] = pair_count(me, r);
      recv_counts[std::size_t(r)] = pair_count(r, me);
    }
    const auto total = [](const std::vector<std::size_t>& v) {
      return std::accumulate(v.begin(), v.end(), std::size_t{0});
    };
    auto in = inputs<T>(seed + 1, me, total(send_counts));
    std::vector<T> out(total(recv_counts), T(-7.0f));
    if (async) {
      c.all_to_all_v_async(in, send_counts, out, recv_counts).wait();
    } else {
      c.all_to_all_v(in, send_counts, out, recv_counts);
    }
    bool ok = true;
    std::size_t at = 0;
    for (int s = 0; s < n; ++s) {
      std::size_t from = 0;  // where rank s's block for this rank starts in its input
      for (int q = 0; q < me; ++q) from += pair_count(s, q);
      for (std::size_t i = 0; i < pair_count(s, me); ++i)
        ok = ok && same_bits(out[at++], input<T>(seed + 1, s, from + i));
    }
    CHECK(ok);
    CHECK(at == out.size());
  }
}

TEST_CASE_TEMPLATE("p2p: a ring exchange posted as one group, and send/recv", T, float, double, bf16, fp16) {
  auto& c = world_comm();
  const int n = c.size(), r = c.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const std::uint64_t seed = 600;
  // Forward to next and backward to prev at once: every rank sends before it receives, which
  // deadlocks with blocking sends of large messages but not as one group.
  auto fwd = inputs<T>(seed, r, 5000), bwd = inputs<T>(seed + 1, r, 3000);
  std::vector<T> from_prev(5000), from_next(3000);
  c.p2p({strata::send_to(next, fwd), strata::send_to(prev, bwd), strata::recv_from(prev, from_prev),
         strata::recv_from(next, from_next)});
  bool ok = true;
  for (std::size_t i = 0; i < from_prev.size(); ++i) ok = ok && same_bits(from_prev[i], input<T>(seed, prev, i));
  for (std::size_t i = 0; i < from_next.size(); ++i) ok = ok && same_bits(from_next[i], input<T>(seed + 1, next, i));
  CHECK(ok);

  // Two messages to the same peer, told apart by tag, received in the other order.
  std::vector<T> a = inputs<T>(seed + 2, r, 10), b = inputs<T>(seed + 3, r, 20);
  std::vector<T> ra(10), rb(20);
  auto h = c.p2p_async({strata::recv_from(prev, rb, 2), strata::recv_from(prev, ra, 1), strata::send_to(next, a, 1),
                        strata::send_to(next, b, 2)});
  h.wait();
  ok = true;
  for (std::size_t i = 0; i < 10; ++i) ok = ok && same_bits(ra[i], input<T>(seed + 2, prev, i));
  for (std::size_t i = 0; i < 20; ++i) ok = ok && same_bits(rb[i], input<T>(seed + 3, prev, i));
  CHECK(ok);

  // no_peer entries are skipped: an open chain 0 -> 1 -> ... -> n-1.
  const int chain_next = r + 1 < n ? r + 1 : strata::no_peer, chain_prev = r > 0 ? r - 1 : strata::no_peer;
  std::vector<T> mine = inputs<T>(seed + 4, r, 8), got(8, T(0.0f));
  c.p2p({strata::send_to(chain_next, mine), strata::recv_from(chain_prev, got)});
  if (r > 0) {
    ok = true;
    for (std::size_t i = 0; i < 8; ++i) ok = ok && same_bits(got[i], input<T>(seed + 4, r - 1, i));
    CHECK(ok);
  }

  // Plain send/recv between even and odd neighbours.
  if (n >= 2 && !(n % 2 == 1 && r == n - 1)) {
    const int peer = r % 2 == 0 ? r + 1 : r - 1;
    std::vector<T> out = inputs<T>(seed + 5, r, 100), in(100);
    if (r % 2 == 0) {
      c.send(out, peer);
      c.recv(in, peer);
    } else {
      c.recv(in, peer);
      c.send(out, peer);
    }
    ok = true;
    for (std::size_t i = 0; i < 100; ++i) ok = ok && same_bits(in[i], input<T>(seed + 5, peer, i));
    CHECK(ok);
  }
}

TEST_CASE("several async calls in flight, waited on in another order") {
  auto& c = world_comm();
  const int n = c.size();
  auto a = inputs<float>(700, c.rank(), 500);
  auto b = inputs<bf16>(701, c.rank(), 300);
  auto g_in = inputs<double>(702, c.rank(), 40);
  std::vector<double> g_out(40 * std::size_t(n));
  auto ha = c.all_reduce_async(a);
  auto hb = c.all_reduce_async(b, reduce_op::avg);
  auto hg = c.all_gather_async(g_in, g_out);
  auto hbar = c.barrier_async();
  hbar.wait();
  hg.wait();
  hb.wait();
  ha.wait();
  check_reduced<float>(a, 700, n, 0, reduce_op::sum, "async a");
  check_reduced<bf16>(b, 701, n, 0, reduce_op::avg, "async b");
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < 40; ++i) CHECK(g_out[std::size_t(r) * 40 + i] == input<double>(702, r, i));
  {
    // A handle left alone waits in its destructor.
    auto d = inputs<double>(703, c.rank(), 64);
    { auto h = c.all_reduce_async(d); }
    check_reduced<double>(d, 703, n, 0, reduce_op::sum, "destructor wait");
  }
  // Move-assigning a pending handle waits for the one it replaces.
  auto x = inputs<float>(704, c.rank(), 64), y = inputs<float>(705, c.rank(), 64);
  auto h = c.all_reduce_async(x);
  h = c.all_reduce_async(y);
  check_reduced<float>(x, 704, n, 0, reduce_op::sum, "replaced handle");
  h.wait();
  check_reduced<float>(y, 705, n, 0, reduce_op::sum, "replacing handle");
  c.barrier();
}

TEST_CASE("sub-groups from split: even and odd world ranks") {
  auto& w = world_comm();
  const int color = w.rank() % 2;
  strata::mpi_communicator half = w.split(color, w.rank(), color ? "odd" : "even");
  REQUIRE(half.valid());
  CHECK(half.name() == (color ? "odd" : "even"));
  CHECK(half.size() == (w.size() + 1 - color) / 2);
  CHECK(half.rank() == w.rank() / 2);
  std::vector<int> expected;
  for (int r = color; r < w.size(); r += 2) expected.push_back(r);
  CHECK(half.world_ranks() == expected);
  std::vector<double> v{double(w.rank())};
  half.all_reduce(v);
  double sum = 0;
  for (int r : expected) sum += r;
  CHECK(v[0] == sum);

  // A negative color leaves a rank out; it gets an empty communicator.
  strata::mpi_communicator only0 = w.split(w.rank() == 0 ? 0 : -1, 0, "only0");
  CHECK(only0.valid() == (w.rank() == 0));
  if (!only0.valid()) {
    std::vector<float> f(1);
    CHECK_THROWS_WITH_AS(only0.all_reduce(f), doctest::Contains("not a member"), strata::error);
  }
}

TEST_CASE_TEMPLATE("messages longer than the chunk size go as several calls", T, float, bf16) {
  strata::comm_options o;
  o.chunk_elements = 7;
  o.timeout_s = 60;
  strata::mpi_communicator c(MPI_COMM_WORLD, "chunked", o);
  const int n = c.size(), r = c.rank();
  auto data = inputs<T>(800, r, 100);
  c.all_reduce(data);
  check_reduced<T>(data, 800, n, 0, reduce_op::sum, "chunked all_reduce");
  auto b = inputs<T>(801, r, 50);
  c.broadcast(b, n - 1);
  bool ok = true;
  for (std::size_t i = 0; i < 50; ++i) ok = ok && same_bits(b[i], input<T>(801, n - 1, i));
  CHECK(ok);
  auto s = inputs<T>(802, r, 30);
  std::vector<T> got(30);
  c.p2p({strata::send_to((r + 1) % n, s), strata::recv_from((r + n - 1) % n, got)});
  ok = true;
  for (std::size_t i = 0; i < 30; ++i) ok = ok && same_bits(got[i], input<T>(802, (r + n - 1) % n, i));
  CHECK(ok);
}

TEST_CASE("wrong sizes are a strata::error naming the group and the numbers, before anything is posted") {
  auto& c = world_comm();
  const int n = c.size();
  std::vector<float> in(5 * std::size_t(n) + 1), out(5), big(5 * std::size_t(n));
  CHECK_THROWS_WITH_AS(c.reduce_scatter(in, out), doctest::Contains("reduce_scatter on group world: the input has"),
                       strata::error);
  std::vector<float> gather_out(5 * std::size_t(n) + 2);
  CHECK_THROWS_WITH_AS(c.all_gather(out, gather_out), doctest::Contains("all_gather on group world"), strata::error);
  std::vector<std::size_t> bad_counts(std::size_t(n) + 1, 1);
  CHECK_THROWS_WITH_AS(c.all_gather(out, big, bad_counts), doctest::Contains("counts given for"), strata::error);
  CHECK_THROWS_WITH_AS(c.reduce_scatter(in, out, std::vector<std::size_t>(std::size_t(n), 5)),
                       doctest::Contains("the counts add up to"), strata::error);
  CHECK_THROWS_WITH_AS(c.all_gather(out, gather_out, std::vector<std::size_t>(std::size_t(n), 5)),
                       doctest::Contains("the output has"), strata::error);
  CHECK_THROWS_WITH_AS(c.all_to_all(big, gather_out), doctest::Contains("all_to_all on group world: the input has"),
                       strata::error);
  if (n > 1) {
    std::vector<float> odd(5 * std::size_t(n) + 1);
    CHECK_THROWS_WITH_AS(c.all_to_all(odd, std::vector<float>(odd.size())), doctest::Contains("ranks x one block size"),
                         strata::error);
  }
  const std::vector<std::size_t> fives(std::size_t(n), 5);
  std::vector<float> big_out(big.size());
  CHECK_THROWS_WITH_AS(c.all_to_all_v(big, bad_counts, big_out, fives), doctest::Contains("send counts given for"),
                       strata::error);
  std::vector<float> short_out(big.size() - 1);
  CHECK_THROWS_WITH_AS(c.all_to_all_v(big, fives, short_out, fives),
                       doctest::Contains("elements but the receive counts add up to"), strata::error);
  std::vector<std::size_t> keeps_more = fives;
  keeps_more[std::size_t(c.rank())] = 6;
  keeps_more[std::size_t((c.rank() + 1) % n)] = n > 1 ? 4 : 6;
  if (n > 1) {
    CHECK_THROWS_WITH_AS(c.all_to_all_v(big, fives, big_out, keeps_more), doctest::Contains("to itself but expects 6"),
                         strata::error);
  }
  CHECK_THROWS_WITH_AS(c.broadcast(out, n), doctest::Contains("root"), strata::error);
  CHECK_THROWS_WITH_AS(c.send(out, n + 3), doctest::Contains("peer"), strata::error);
  // Overlapping input and output of a reduce_scatter.
  std::span<float> whole(big), first(big.data(), 5);
  CHECK_THROWS_WITH_AS(c.reduce_scatter(whole, first), doctest::Contains("overlap"), strata::error);
  c.barrier();  // nothing was posted by any of the above
}
