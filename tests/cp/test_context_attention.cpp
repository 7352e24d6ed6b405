// Context-parallel attention (layers/context_attention.hpp) under mpiexec at 1, 2 and 4 ranks,
// the world being the cp group:
//   - the positioned kernel (kernels/positioned_attention.hpp) with every position in order is
//     the serial kernel, forward and backward; with arbitrary positions it matches a float64
//     brute-force reference, split over two key blocks and merged as well; its results do not
//     depend on the thread count;
//   - group_ref::all_to_all moves block r to rank r, counted, and is the identity alone;
//   - both forms (ring, all_to_all) give every rank its rows of the serial kernels' out and
//     dqkv, multi-head, grouped-query and multi-query, fp32 and fp64; the all_to_all form refuses
//     heads that cp does not divide, naming them;
//   - the bytes each rank sends forward and backward equal context_attention_traffic (fp32, fp64
//     and bf16, where the ring's accumulators are wider than its blocks);
//   - every rank computes the same number of score entries, 1/cp of the serial kernel's.
//
// Every rank builds the same whole qkv and dout (same seed) and runs the serial kernels on them.
// Error measure: max_i |a_i - ref_i| / max_i |ref_i| over the compared array, at most 1e-5 for
// fp32 and 1e-12 for fp64.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <strata/comm/group_ref.hpp>
#include <strata/core/memory.hpp>
#include <strata/kernels/attention.hpp>
#include <strata/kernels/positioned_attention.hpp>
#include <strata/layers/context_attention.hpp>
#include <strata/layers/context_split.hpp>

#include "../mpi/mpi_test.hpp"

namespace st = strata;
namespace kn = strata::kernels;

namespace {

const char* form_name(st::context_form f) { return f == st::context_form::ring ? "ring" : "all_to_all"; }

template <class T>
double tolerance() {
  return std::is_same_v<T, double> ? 1e-12 : 1e-5;
}

template <class X>
double as_d(X x) {
  return st::convert<double>(x);
}

// max_i |a_i - ref_i| / max_i |ref_i|.
template <class X, class Y>
double error(const X* a, const Y* ref, std::size_t n) {
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(as_d(a[i]) - as_d(ref[i])));
    scale = std::max(scale, std::abs(as_d(ref[i])));
  }
  return scale > 0 ? worst / scale : worst;
}
template <class X, class Y>
double error(const std::vector<X>& a, const std::vector<Y>& ref) {
  REQUIRE(a.size() == ref.size());
  return error(a.data(), ref.data(), a.size());
}

struct geometry {
  std::int64_t batch, seq, heads, kv_heads, head_dim;
  kn::attention_shape shape() const { return {batch, seq, heads, kv_heads, head_dim, 0}; }
};

// The serial kernels over the whole sequences.
template <class T>
struct serial_run {
  std::vector<T> qkv, dout, out, dqkv;
  std::vector<st::acc_t<T>> lse;
};
template <class T>
serial_run<T> serial(const kn::attention_shape& s, std::uint64_t seed) {
  const auto rows = std::size_t(s.batch * s.seq);
  serial_run<T> r;
  r.qkv = strata_test::inputs<T>(seed, 0, rows * std::size_t(s.row_width()));
  r.dout = strata_test::inputs<T>(seed + 1, 0, rows * std::size_t(s.q_width()));
  r.out.resize(rows * std::size_t(s.q_width()));
  r.lse.resize(std::size_t(s.batch * s.heads * s.seq));
  r.dqkv.resize(r.qkv.size());
  kn::attention_forward(st::host{}, r.out.data(), r.lse.data(), r.qkv.data(), s);
  kn::attention_backward(st::host{}, r.dqkv.data(), r.dout.data(), r.qkv.data(), r.lse.data(), r.out.data(), s);
  return r;
}

// Columns [from, from + width) of every row of a [rows, ld] array.
template <class X>
std::vector<X> columns(const std::vector<X>& a, std::int64_t ld, std::int64_t from, std::int64_t width) {
  std::vector<X> out;
  for (std::size_t row = 0; row < a.size() / std::size_t(ld); ++row)
    for (std::int64_t j = 0; j < width; ++j) out.push_back(a[row * std::size_t(ld) + std::size_t(from + j)]);
  return out;
}

// ---- the positioned kernel, every position in order, against the serial kernel -------------
template <class T>
void check_in_order(const geometry& g) {
  using A = st::acc_t<T>;
  const kn::attention_shape s = g.shape();
  const serial_run<T> ref = serial<T>(s, 21);
  const auto rows = std::size_t(s.batch * s.seq);
  std::vector<std::int64_t> pos(std::size_t(s.seq));
  std::iota(pos.begin(), pos.end(), std::int64_t{0});
  std::vector<T> kv(rows * std::size_t(2 * s.kv_width()));
  kn::attention_kv_pack(st::host{}, kv.data(), ref.qkv.data(), s);

  std::vector<A> out(rows * std::size_t(s.q_width())), lse(ref.lse.size());
  const std::int64_t work = kn::positioned_attention_forward(st::host{}, out.data(), lse.data(), ref.qkv.data(),
                                                             pos.data(), kv.data(), pos.data(), s.seq, s);
  CHECK(work == s.batch * s.heads * s.seq * (s.seq + 1) / 2);
  CHECK(error(out, ref.out) <= tolerance<T>());
  CHECK(error(lse, ref.lse) <= tolerance<T>());

  std::vector<A> D(ref.lse.size()), dq(out.size()), dkv(kv.size());
  kn::attention_delta(st::host{}, D.data(), ref.dout.data(), ref.out.data(), s);
  const std::int64_t back =
      kn::positioned_attention_backward(st::host{}, dq.data(), dkv.data(), ref.dout.data(), ref.lse.data(), D.data(),
                                        ref.qkv.data(), pos.data(), kv.data(), pos.data(), s.seq, s);
  CHECK(back == work);
  CHECK(error(dq, columns(ref.dqkv, s.row_width(), 0, s.q_width())) <= tolerance<T>());
  const auto dkv_ref = columns(ref.dqkv, s.row_width(), s.q_width(), 2 * s.kv_width());
  CHECK(error(dkv, dkv_ref) <= tolerance<T>());
}

// ---- arbitrary positions against a float64 brute force ---------------------------------------
struct reference {
  std::vector<double> out, lse, dq, dkv;
  std::int64_t visible = 0;
};
// Positions are per row; lse_in and D are what backward is given.
template <class T>
reference brute_force(const kn::attention_shape& s, std::int64_t n, const std::vector<T>& qkv, const std::vector<T>& kv,
                      const std::vector<T>& dout, const std::vector<std::int64_t>& q_pos,
                      const std::vector<std::int64_t>& k_pos, const std::vector<double>& D) {
  const std::int64_t B = s.batch, m = s.seq, H = s.heads, d = s.head_dim, W = s.row_width();
  const std::int64_t KVW = 2 * s.kv_width(), G = s.group();
  const double scale = s.softmax_scale();
  reference r;
  r.out.assign(std::size_t(B * m * H * d), 0);
  r.lse.assign(std::size_t(B * H * m), -INFINITY);
  r.dq.assign(r.out.size(), 0);
  r.dkv.assign(std::size_t(B * n * KVW), 0);
  auto q = [&](std::int64_t b, std::int64_t i, std::int64_t h, std::int64_t x) {
    return as_d(qkv[std::size_t((b * m + i) * W + h * d + x)]);
  };
  auto key = [&](std::int64_t b, std::int64_t j, std::int64_t kvh, std::int64_t x) {
    return as_d(kv[std::size_t((b * n + j) * KVW + kvh * d + x)]);
  };
  auto val = [&](std::int64_t b, std::int64_t j, std::int64_t kvh, std::int64_t x) {
    return as_d(kv[std::size_t((b * n + j) * KVW + s.kv_width() + kvh * d + x)]);
  };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < m; ++i) {
        const std::int64_t kvh = h / G;
        std::vector<double> sc(std::size_t(n), -INFINITY);
        double mx = -INFINITY;
        for (std::int64_t j = 0; j < n; ++j) {
          if (k_pos[std::size_t(j)] > q_pos[std::size_t(i)]) continue;
          double dot = 0;
          for (std::int64_t x = 0; x < d; ++x) dot += q(b, i, h, x) * key(b, j, kvh, x);
          sc[std::size_t(j)] = dot * scale;
          mx = std::max(mx, sc[std::size_t(j)]);
          ++r.visible;
        }
        if (mx == -INFINITY) continue;
        double sum = 0;
        for (std::int64_t j = 0; j < n; ++j) sum += std::exp(sc[std::size_t(j)] - mx);
        const double lse = mx + std::log(sum);
        r.lse[std::size_t((b * H + h) * m + i)] = lse;
        const std::int64_t at = (b * m + i) * H * d + h * d;
        for (std::int64_t j = 0; j < n; ++j) {
          const double p = std::exp(sc[std::size_t(j)] - lse);
          double dp = 0;
          for (std::int64_t x = 0; x < d; ++x) {
            r.out[std::size_t(at + x)] += p * val(b, j, kvh, x);
            dp += as_d(dout[std::size_t(at + x)]) * val(b, j, kvh, x);
          }
          const double ds = p * (dp - D[std::size_t((b * H + h) * m + i)]) * scale;
          for (std::int64_t x = 0; x < d; ++x) {
            r.dq[std::size_t(at + x)] += ds * key(b, j, kvh, x);
            r.dkv[std::size_t((b * n + j) * KVW + kvh * d + x)] += ds * q(b, i, h, x);
            r.dkv[std::size_t((b * n + j) * KVW + s.kv_width() + kvh * d + x)] += p * as_d(dout[std::size_t(at + x)]);
          }
        }
      }
  return r;
}

// Keys [from, to) of a packed kv [B, n, KVW].
template <class T>
std::vector<T> key_rows(const std::vector<T>& kv, std::int64_t B, std::int64_t n, std::int64_t KVW, std::int64_t from,
                        std::int64_t to) {
  std::vector<T> out;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t j = from; j < to; ++j)
      for (std::int64_t x = 0; x < KVW; ++x) out.push_back(kv[std::size_t((b * n + j) * KVW + x)]);
  return out;
}

// 12 query rows, 10 keys; rows at positions 0 and 1 see no key (the first is at 2), duplicates.
const std::vector<std::int64_t> few_q_pos = {7, 1, 15, 3, 3, 12, 0, 9, 19, 5, 11, 2};
const std::vector<std::int64_t> few_k_pos = {4, 2, 9, 9, 14, 3, 17, 6, 11, 2};

template <class T>
void check_brute_force(std::int64_t heads, std::int64_t kv_heads, const std::vector<std::int64_t>& q_pos = few_q_pos,
                       const std::vector<std::int64_t>& k_pos = few_k_pos, std::int64_t head_dim = 8) {
  using A = st::acc_t<T>;
  const std::int64_t m = std::int64_t(q_pos.size()), n = std::int64_t(k_pos.size());
  const kn::attention_shape s{2, m, heads, kv_heads, head_dim, 0};
  const std::int64_t KVW = 2 * s.kv_width();
  const auto qkv = strata_test::inputs<T>(31, 0, std::size_t(s.batch * m * s.row_width()));
  const auto kv = strata_test::inputs<T>(32, 0, std::size_t(s.batch * n * KVW));
  const auto dout = strata_test::inputs<T>(33, 0, std::size_t(s.batch * m * s.q_width()));
  std::vector<double> D(std::size_t(s.batch * s.heads * m));
  for (std::size_t i = 0; i < D.size(); ++i) D[i] = 0.5 * strata_test::raw_value(34, 0, i);
  const reference ref = brute_force(s, n, qkv, kv, dout, q_pos, k_pos, D);

  std::vector<A> out(ref.out.size()), lse(ref.lse.size());
  const std::int64_t work = kn::positioned_attention_forward(st::host{}, out.data(), lse.data(), qkv.data(),
                                                             q_pos.data(), kv.data(), k_pos.data(), n, s);
  CHECK(work == ref.visible);
  if (&q_pos == &few_q_pos && &k_pos == &few_k_pos)
    CHECK(work == s.batch * s.heads * 59);  // visible (row, key) pairs of the positions above: 59
  CHECK(error(out, ref.out) <= tolerance<T>());
  auto check_lse = [&](const std::vector<A>& got) {
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (std::isinf(ref.lse[i])) {
        CHECK(got[i] == -INFINITY);
      } else {
        CHECK(std::abs(double(got[i]) - ref.lse[i]) <= tolerance<T>() * std::max(1.0, std::abs(ref.lse[i])));
      }
    }
  };
  check_lse(lse);

  // The same keys as two blocks, merged by logsumexp from out 0, lse -inf.
  std::vector<A> sum(out.size(), A(0)), run_lse(lse.size(), A(-INFINITY)), part(out.size()), part_lse(lse.size());
  for (auto [from, to] : {std::pair<std::int64_t, std::int64_t>{0, 4}, {4, n}}) {
    const auto block = key_rows(kv, s.batch, n, KVW, from, to);
    kn::positioned_attention_forward(st::host{}, part.data(), part_lse.data(), qkv.data(), q_pos.data(), block.data(),
                                     k_pos.data() + from, to - from, s);
    kn::attention_merge(st::host{}, sum.data(), run_lse.data(), part.data(), part_lse.data(), s);
  }
  CHECK(error(sum, ref.out) <= tolerance<T>());
  check_lse(run_lse);

  // Backward with the reference's lse and the given D, in acc_t.
  std::vector<A> lse_in(lse.size()), D_in(D.size()), dq(out.size(), A(0)), dkv(kv.size(), A(0));
  for (std::size_t i = 0; i < lse.size(); ++i) lse_in[i] = A(ref.lse[i]), D_in[i] = A(D[i]);
  const std::int64_t back =
      kn::positioned_attention_backward(st::host{}, dq.data(), dkv.data(), dout.data(), lse_in.data(), D_in.data(),
                                        qkv.data(), q_pos.data(), kv.data(), k_pos.data(), n, s);
  CHECK(back == ref.visible);
  CHECK(error(dq, ref.dq) <= tolerance<T>());
  CHECK(error(dkv, ref.dkv) <= tolerance<T>());
}

}  // namespace

TEST_CASE("positioned attention with every position in order is the serial kernel, forward and backward") {
  for (const geometry g : {geometry{2, 16, 4, 4, 8}, geometry{2, 32, 4, 2, 8}, geometry{2, 16, 4, 1, 8}}) {
    INFO("heads ", g.heads, ", kv_heads ", g.kv_heads, ", seq ", g.seq);
    check_in_order<float>(g);
    check_in_order<double>(g);
  }
}

TEST_CASE("positioned attention with arbitrary positions matches a float64 brute force, whole and in two blocks") {
  for (auto [h, kv] : {std::pair<std::int64_t, std::int64_t>{4, 4}, {4, 2}}) {
    INFO("heads ", h, ", kv_heads ", kv);
    check_brute_force<float>(h, kv);
    check_brute_force<double>(h, kv);
  }
  // Several of the kernels' 64-row blocks each way, ragged, positions in no order (a row that sees
  // no key), a head size that is not a whole vector.
  std::vector<std::int64_t> q_pos(150), k_pos(135);
  for (std::size_t i = 0; i < q_pos.size(); ++i) q_pos[i] = std::int64_t((37 * i + 11) % 211);
  for (std::size_t j = 0; j < k_pos.size(); ++j) k_pos[j] = std::int64_t((53 * j + 29) % 197);
  check_brute_force<float>(4, 2, q_pos, k_pos, 24);
  check_brute_force<double>(4, 1, q_pos, k_pos, 24);
}

#ifdef _OPENMP
TEST_CASE("positioned attention gives the same bits at 1 and 3 threads") {
  using A = float;
  // Large enough to cross the kernels' parallel threshold.
  const kn::attention_shape s{2, 64, 4, 2, 8, 0};
  const std::int64_t n = 64, KVW = 2 * s.kv_width();
  const auto qkv = strata_test::inputs<float>(41, 0, std::size_t(s.batch * s.seq * s.row_width()));
  const auto kv = strata_test::inputs<float>(42, 0, std::size_t(s.batch * n * KVW));
  const auto dout = strata_test::inputs<float>(43, 0, std::size_t(s.batch * s.seq * s.q_width()));
  std::vector<std::int64_t> q_pos(std::size_t(s.seq));
  std::vector<std::int64_t> k_pos(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < q_pos.size(); ++i) q_pos[i] = std::int64_t(3 * i % 97);
  for (std::size_t j = 0; j < k_pos.size(); ++j) k_pos[j] = std::int64_t(5 * j % 89);
  struct result {
    std::vector<A> out, lse, dq, dkv;
  };
  auto run = [&](int threads) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    result r{std::vector<A>(std::size_t(s.batch * s.seq * s.q_width())),
             std::vector<A>(std::size_t(s.batch * s.heads * s.seq)),
             {},
             std::vector<A>(kv.size(), 0.f)};
    r.dq.assign(r.out.size(), 0.f);
    kn::positioned_attention_forward(st::host{}, r.out.data(), r.lse.data(), qkv.data(), q_pos.data(), kv.data(),
                                     k_pos.data(), n, s);
    std::vector<A> D(r.lse.size(), 0.25f);
    kn::positioned_attention_backward(st::host{}, r.dq.data(), r.dkv.data(), dout.data(), r.lse.data(), D.data(),
                                      qkv.data(), q_pos.data(), kv.data(), k_pos.data(), n, s);
    omp_set_num_threads(before);
    return r;
  };
  const result one = run(1), three = run(3);
  auto same = [](const std::vector<A>& a, const std::vector<A>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(A)) == 0;
  };
  CHECK(same(one.out, three.out));
  CHECK(same(one.lse, three.lse));
  CHECK(same(one.dq, three.dq));
  CHECK(same(one.dkv, three.dkv));
}
#endif

TEST_CASE("group_ref::all_to_all sends block r to rank r, counted, and is the identity alone") {
  auto& comm = strata_test::world().comm();
  st::group_ref g(comm);
  const int P = g.size(), r = g.rank();
  constexpr std::size_t block = 3;
  std::vector<double> in(block * std::size_t(P)), out(in.size());
  for (int j = 0; j < P; ++j)
    for (std::size_t x = 0; x < block; ++x) in[std::size_t(j) * block + x] = 1000.0 * r + 10.0 * j + double(x);
  comm.reset_counters();
  g.all_to_all(std::span<const double>(in), std::span<double>(out));
  for (int i = 0; i < P; ++i)
    for (std::size_t x = 0; x < block; ++x) CHECK(out[std::size_t(i) * block + x] == 1000.0 * i + 10.0 * r + double(x));
  const auto c = comm.counters().of(st::op_kind::all_to_all);
  CHECK(c.bytes_sent == (P > 1 ? (std::size_t(P) - 1) * block * sizeof(double) : 0));

  st::group_ref alone;
  std::vector<float> a = {1, 2, 3}, b(3);
  alone.all_to_all(std::span<const float>(a), std::span<float>(b));
  CHECK(b == a);
  CHECK_THROWS_WITH_AS(g.all_to_all(std::span<const float>(a), std::span<float>(b.data(), 2)),
                       doctest::Contains("both must be"), st::error);
}

namespace {

// This rank's rows of every form, against the serial kernels; the bytes against the formulas.
template <class T>
void check_forms(const geometry& g) {
  using A = st::acc_t<T>;
  auto& comm = strata_test::world().comm();
  st::group_ref cp(comm);
  const int P = cp.size(), r = cp.rank();
  const st::context_split split = st::context_split::checked(g.seq, P, r);
  const kn::attention_shape whole = g.shape();
  kn::attention_shape local = whole;
  local.seq = split.local_seq();
  const serial_run<T> ref = serial<T>(whole, 7);
  const auto rows = std::size_t(local.batch * local.seq), W = std::size_t(whole.row_width());
  const auto Hd = std::size_t(whole.q_width());
  std::vector<T> qkv(rows * W), dout(rows * Hd), out_ref(rows * Hd), dqkv_ref(rows * W);
  split.take(ref.qkv.data(), qkv.data(), g.batch, whole.row_width());
  split.take(ref.dout.data(), dout.data(), g.batch, whole.q_width());
  split.take(ref.out.data(), out_ref.data(), g.batch, whole.q_width());
  split.take(ref.dqkv.data(), dqkv_ref.data(), g.batch, whole.row_width());

  for (st::context_form form : {st::context_form::ring, st::context_form::all_to_all}) {
    INFO(std::string(form_name(form)), ": cp ", P, ", heads ", g.heads, ", kv_heads ", g.kv_heads, ", seq ", g.seq);
    st::memory_ledger ledger;
    st::context_attention<T> core(cp, split, form, ledger);
    std::vector<T> out(rows * Hd), dqkv(rows * W);
    if (form == st::context_form::all_to_all && !core.heads_divide(local, P)) {
      const std::string refusal = "over cp = " + std::to_string(P) +
                                  " ranks and needs cp to divide both heads = " + std::to_string(g.heads) +
                                  " and kv_heads = " + std::to_string(g.kv_heads);
      CHECK_THROWS_WITH_AS(core.forward(out.data(), qkv.data(), local), doctest::Contains(refusal.c_str()), st::error);
      continue;
    }
    const st::context_traffic expect = core.traffic(form, local, P);

    comm.reset_counters();
    core.forward(out.data(), qkv.data(), local);
    const st::op_counts fwd = comm.counters().total();
    CHECK(error(out, out_ref) <= tolerance<T>());
    CHECK(fwd.bytes_sent == expect.forward);
    CHECK(fwd.bytes_received == expect.forward);
    // What forward keeps, and nothing else held between calls: the logsumexps, and all-to-all's
    // gathered qkv (as many bytes as the local qkv, which its backward does not read).
    const std::size_t kept = form == st::context_form::ring
                                 ? rows * std::size_t(g.heads) * sizeof(A)
                                 : std::size_t(g.batch * g.seq) * ((std::size_t(g.heads) / P) * sizeof(A) +
                                                                   std::size_t(whole.row_width()) / P * sizeof(T));
    CHECK(ledger.current(st::memory_category::activations) == kept);
    CHECK(ledger.current(st::memory_category::workspace) == 0);
    CHECK(ledger.current(st::memory_category::communication) == 0);

    comm.reset_counters();
    CHECK(core.reads_local_qkv() == (form == st::context_form::ring));
    core.backward(dqkv.data(), dout.data(), core.reads_local_qkv() ? qkv.data() : nullptr, out.data(), local);
    const st::op_counts bwd = comm.counters().total();
    CHECK(error(dqkv, dqkv_ref) <= tolerance<T>());
    // Each part on its own scale too: q, k, v.
    for (auto [from, width] : {std::pair<std::int64_t, std::int64_t>{0, whole.q_width()},
                               {whole.q_width(), whole.kv_width()},
                               {whole.q_width() + whole.kv_width(), whole.kv_width()}})
      CHECK(error(columns(dqkv, whole.row_width(), from, width), columns(dqkv_ref, whole.row_width(), from, width)) <=
            tolerance<T>());
    CHECK(bwd.bytes_sent == expect.backward);
    CHECK(bwd.bytes_received == expect.backward);

    core.release();
    CHECK(ledger.current(st::memory_category::activations) == 0);
    CHECK_THROWS_WITH_AS(core.backward(dqkv.data(), dout.data(), qkv.data(), out.data(), local),
                         doctest::Contains("no forward of this shape is kept"), st::error);
  }
}

}  // namespace

TEST_CASE("context attention, ring and all_to_all, gives each rank its rows of serial attention") {
  // Multi-head, grouped-query, multi-query, heads that 4 (and kv_heads that 2) do not divide, and
  // sequences longer than the serial kernel's blocks of 64 rows.
  for (const geometry g : {geometry{2, 32, 4, 4, 8}, geometry{2, 32, 4, 2, 8}, geometry{2, 16, 4, 1, 8},
                           geometry{2, 16, 6, 3, 8}, geometry{1, 256, 4, 2, 16}}) {
    check_forms<float>(g);
    check_forms<double>(g);
  }
}

TEST_CASE("context attention sends the bytes of its traffic formulas in bf16") {
  // bf16 blocks with fp32 accumulators on the ring's way back.
  auto& comm = strata_test::world().comm();
  st::group_ref cp(comm);
  const int P = cp.size();
  const st::context_split split = st::context_split::checked(32, P, cp.rank());
  const kn::attention_shape local{2, split.local_seq(), 4, 4, 8, 0};
  const auto rows = std::size_t(local.batch * local.seq);
  const auto qkv = strata_test::inputs<st::bf16>(5, cp.rank(), rows * std::size_t(local.row_width()));
  const auto dout = strata_test::inputs<st::bf16>(6, cp.rank(), rows * std::size_t(local.q_width()));
  for (st::context_form form : {st::context_form::ring, st::context_form::all_to_all}) {
    INFO(std::string(form_name(form)), ": cp ", P);
    st::memory_ledger ledger;
    st::context_attention<st::bf16> core(cp, split, form, ledger);
    std::vector<st::bf16> out(rows * std::size_t(local.q_width())), dqkv(qkv.size());
    const st::context_traffic expect = core.traffic(form, local, P);
    if (P > 1 && form == st::context_form::ring)  // the accumulators: twice a block's bytes, one hop more
      CHECK(expect.backward == expect.forward + 2 * std::uint64_t(P) * (expect.forward / std::uint64_t(P - 1)));
    comm.reset_counters();
    core.forward(out.data(), qkv.data(), local);
    CHECK(comm.counters().total().bytes_sent == expect.forward);
    comm.reset_counters();
    core.backward(dqkv.data(), dout.data(), qkv.data(), out.data(), local);
    CHECK(comm.counters().total().bytes_sent == expect.backward);
  }
}

TEST_CASE("every rank computes the same attention work under the causal split, 1/cp of the serial kernel's") {
  auto& comm = strata_test::world().comm();
  st::group_ref cp(comm);
  const int P = cp.size();
  const geometry g{2, 32, 4, 4, 8};
  const st::context_split split = st::context_split::checked(g.seq, P, cp.rank());
  kn::attention_shape local = g.shape();
  local.seq = split.local_seq();
  const auto rows = std::size_t(local.batch * local.seq);
  const auto qkv = strata_test::inputs<float>(8, cp.rank(), rows * std::size_t(local.row_width()));
  const auto dout = strata_test::inputs<float>(9, cp.rank(), rows * std::size_t(local.q_width()));
  const std::int64_t serial_work = g.batch * g.heads * g.seq * (g.seq + 1) / 2;
  for (st::context_form form : {st::context_form::ring, st::context_form::all_to_all}) {
    INFO(std::string(form_name(form)), ": cp ", P);
    st::memory_ledger ledger;
    st::context_attention<float> core(cp, split, form, ledger);
    std::vector<float> out(rows * std::size_t(local.q_width())), dqkv(qkv.size());
    core.forward(out.data(), qkv.data(), local);
    const std::int64_t fwd = core.work();
    core.reset_work();
    core.backward(dqkv.data(), dout.data(), qkv.data(), out.data(), local);
    const std::int64_t bwd = core.work();
    // Largest and smallest over the ranks: equal (the causal split pairs chunk i with 2cp-1-i).
    double w[2] = {double(fwd), -double(fwd)};
    comm.all_reduce(std::span<double>(w, 2), st::reduce_op::max);
    CHECK(w[0] == -w[1]);
    CHECK(fwd * P == serial_work);
    CHECK(bwd == fwd);
  }
}
