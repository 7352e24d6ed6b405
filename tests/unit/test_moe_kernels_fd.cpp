// The mixture-of-experts host kernels: router, sequence statistics, dispatch plan, permute,
// combine and the grouped linear layer.
//
// Each backward against float64 fourth-order finite differences (finite_difference.hpp: max
// relative error <= 1e-6 with a 1e-3 floor). The router's objective is the one a layer builds:
// L = sum(gw * weights) + sum over sequences s and experts e of c[s, e] · sum_{t in s} p[t, e]
// + (z/2) · sum lse², with logits far enough apart that no step of the differences changes the
// top-k selection (checked). Input gradients must come out the same from a NaN-filled buffer
// (written, never read); the grouped linear layer's weight gradients must double on a second
// call (accumulated). Exact checks: softmax, logsumexp, the top-k order and its ties, the
// renormalisation, the sequence statistics and hand-worked dispatch plans, dropless and with
// capacity. Float against double for combine and the grouped linear layer.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "strata/core/memory.hpp"
#include "strata/kernels/all.hpp"
#include "finite_difference.hpp"

namespace {

namespace k = strata::kernels;
using strata::convert;
using strata::host;
using namespace finite_difference;
using ivec = std::vector<std::int32_t>;
using lvec = std::vector<std::int64_t>;

constexpr std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }
constexpr double qnan = std::numeric_limits<double>::quiet_NaN();

// max |a - b| / max |b|: the tensor-relative error against a reference b.
template <class X>
double tensor_relative_error(const std::vector<X>& a, const vec& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(convert<double>(a[i]) - b[i]));
    ref = std::max(ref, std::fabs(b[i]));
  }
  return diff / ref;
}

// The k experts of each row by a stable sort on descending probability: ties to the lower index.
ivec reference_topk(const vec& probs, std::int64_t N, std::int64_t E, std::int64_t K) {
  ivec out;
  for (std::int64_t n = 0; n < N; ++n) {
    ivec idx(sz(E));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(),
                     [&](std::int32_t a, std::int32_t b) { return probs[sz(n * E + a)] > probs[sz(n * E + b)]; });
    out.insert(out.end(), idx.begin(), idx.begin() + K);
  }
  return out;
}

struct plan {
  lvec offsets, dropped;
  ivec slot_row, row_token;
  std::int64_t rows() const { return offsets.back(); }
};

plan make_plan(const ivec& experts, std::int64_t N, std::int64_t K, std::int64_t E, std::int64_t group,
               std::int64_t capacity) {
  plan p{lvec(sz(E + 1)), lvec(sz(E)), ivec(sz(N * K)), ivec(sz(N * K))};
  k::moe_dispatch_plan(host{}, p.offsets.data(), p.slot_row.data(), p.row_token.data(), p.dropped.data(),
                       experts.data(), N, K, E, group, capacity);
  return p;
}

}  // namespace

// --- router ----------------------------------------------------------------------------------

TEST_CASE("moe_route_forward: softmax, logsumexp, top-k order with ties to the lower index, renormalisation") {
  const std::int64_t N = 5, E = 4;
  const vec logits = {1.0,  2.0,  2.0, 0.5,   // a tie for first: experts 1 then 2
                      0.3,  0.3,  0.3, 0.3,   // all equal: 0, 1, 2, ...
                      -1.,  0.7,  3.0, 0.7,   // a tie for second: 1 before 3
                      0.2,  -0.4, 0.9, 1.9,   // no ties
                      qnan, 0.1,  0.2, 0.3};  // a NaN: its row is NaN, the ids still distinct and in range
  const ivec expected_k2 = {1, 2, 0, 1, 2, 1, 3, 2, 0, 1};
  const ivec expected_k3 = {1, 2, 0, 0, 1, 2, 2, 1, 3, 3, 2, 0, 0, 1, 2};
  for (std::int64_t K : {std::int64_t(2), std::int64_t(3), E}) {
    for (bool renormalize : {false, true}) {
      CAPTURE(K);
      CAPTURE(renormalize);
      vec probs(sz(N * E)), lse(sz(N)), weights(sz(N * K));
      ivec experts(sz(N * K), -7);
      k::moe_route_forward(host{}, probs.data(), lse.data(), experts.data(), weights.data(), logits.data(), N, E, K,
                           renormalize);
      for (std::int64_t n = 0; n < N; ++n) {
        const ivec ids(experts.begin() + n * K, experts.begin() + (n + 1) * K);
        ivec sorted = ids;
        std::sort(sorted.begin(), sorted.end());
        CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());  // distinct
        CHECK(sorted.front() >= 0);
        CHECK(sorted.back() < E);
        if (n == N - 1) {
          CHECK(std::isnan(lse[sz(n)]));
          continue;
        }
        double sum = 0, direct = 0;
        for (std::int64_t j = 0; j < E; ++j) sum += probs[sz(n * E + j)], direct += std::exp(logits[sz(n * E + j)]);
        CHECK(sum == doctest::Approx(1.0).epsilon(1e-14));
        CHECK(lse[sz(n)] == doctest::Approx(std::log(direct)).epsilon(1e-14));
        for (std::int64_t j = 0; j < E; ++j)
          CHECK(probs[sz(n * E + j)] == doctest::Approx(std::exp(logits[sz(n * E + j)] - lse[sz(n)])).epsilon(1e-14));
        double picked = 0;
        for (std::int64_t s = 0; s < K; ++s) picked += probs[sz(n * E + ids[sz(s)])];
        for (std::int64_t s = 0; s < K; ++s) {
          const double p = probs[sz(n * E + ids[sz(s)])];
          CHECK(weights[sz(n * K + s)] == (renormalize ? p / picked : p));
        }
      }
      const vec p_rows(probs.begin(), probs.end() - E);
      const ivec ref = reference_topk(p_rows, N - 1, E, K);
      CHECK(ivec(experts.begin(), experts.end() - K) == ref);
      if (K == 2) CHECK(experts == expected_k2);
      if (K == 3) CHECK(experts == expected_k3);
      if (renormalize)
        for (std::int64_t n = 0; n + 1 < N; ++n) {
          double s = 0;
          for (std::int64_t j = 0; j < K; ++j) s += weights[sz(n * K + j)];
          CHECK(s == doctest::Approx(1.0).epsilon(1e-15));
        }
    }
  }
  vec probs(sz(N * E)), lse(sz(N)), weights(sz(N * E));
  ivec experts(sz(N * E));
  CHECK_THROWS_WITH_AS(k::moe_route_forward(host{}, probs.data(), lse.data(), experts.data(), weights.data(),
                                            logits.data(), N, E, 5, true),
                       "moe_route_forward: k = 5 experts per token is not between 1 and E = 4", strata::error);
  CHECK_THROWS_AS(k::moe_route_forward(host{}, probs.data(), lse.data(), experts.data(), weights.data(), logits.data(),
                                       N, E, 0, true),
                  strata::error);
}

namespace {
// Logits whose sorted values in each row are about 0.6 apart: the top-k never changes under the
// differences' steps of at most 2e-4.
vec separated_logits(std::int64_t N, std::int64_t E, std::uint64_t stream) {
  vec x = randn(sz(N * E), stream, 0.05);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t j = 0; j < E; ++j) x[sz(n * E + j)] += 0.6 * double((3 * j + n) % E);
  return x;
}
}  // namespace

TEST_CASE("moe_route_backward: dlogits match finite differences of weights, per-sequence probability and z terms") {
  const std::int64_t N = 12, E = 4, seq = 4, B = N / seq;
  const double z = 0.3;
  vec logits = separated_logits(N, E, 101);
  const vec c = randn(sz(B * E), 102);  // the per-sequence probability coefficients
  struct route_case {
    std::int64_t k;
    bool renormalize, aux;
  };
  const route_case cases[] = {{2, true, true}, {2, false, true}, {2, true, false},
                              {1, true, true}, {3, false, true}, {3, true, false}};
  for (const route_case& rc : cases) {
    const std::int64_t K = rc.k;
    const std::string what =
        "moe_route dlogits k " + std::to_string(K) + (rc.renormalize ? " renorm" : " plain") + (rc.aux ? " + aux" : "");
    CAPTURE(what);
    const vec gw = randn(sz(N * K), 103 + std::uint64_t(K));
    vec probs(sz(N * E)), lse(sz(N)), weights(sz(N * K));
    ivec experts(sz(N * K));
    auto forward = [&] {
      k::moe_route_forward(host{}, probs.data(), lse.data(), experts.data(), weights.data(), logits.data(), N, E, K,
                           rc.renormalize);
    };
    forward();
    const ivec chosen = experts;
    bool selection_changed = false;
    auto loss = [&] {
      forward();
      selection_changed = selection_changed || experts != chosen;
      long double L = weighted_sum(gw, weights);
      if (rc.aux) {
        for (std::int64_t n = 0; n < N; ++n) {
          for (std::int64_t j = 0; j < E; ++j) L += (long double)c[sz((n / seq) * E + j)] * probs[sz(n * E + j)];
          L += 0.5L * z * (long double)lse[sz(n)] * lse[sz(n)];
        }
      }
      return double(L);
    };
    auto backward = [&](vec& dlogits) {
      k::moe_route_backward(host{}, dlogits.data(), gw.data(), rc.aux ? c.data() : nullptr, seq, rc.aux ? z : 0.0,
                            probs.data(), lse.data(), experts.data(), weights.data(), N, E, K, rc.renormalize);
    };
    vec dlogits(sz(N * E));
    backward(dlogits);
    check_gradient(what.c_str(), dlogits, logits, loss);
    CHECK_FALSE(selection_changed);
    forward();
    vec again(dlogits.size(), qnan);
    backward(again);
    CHECK(again == dlogits);
  }
  {  // a sequence length that does not divide N, with per-sequence terms
    const std::int64_t K = 2;
    vec probs(sz(N * E)), lse(sz(N)), weights(sz(N * K)), dw(sz(N * K)), dl(sz(N * E));
    ivec experts(sz(N * K));
    k::moe_route_forward(host{}, probs.data(), lse.data(), experts.data(), weights.data(), logits.data(), N, E, K,
                         true);
    CHECK_THROWS_WITH_AS(k::moe_route_backward(host{}, dl.data(), dw.data(), c.data(), 5, 0.0, probs.data(), lse.data(),
                                               experts.data(), weights.data(), N, E, K, true),
                         "moe_route_backward: the sequence length seq = 5 does not divide N = 12", strata::error);
  }
}

TEST_CASE("moe_sequence_stats: per-sequence probability sums, expert counts and sum of lse², directly") {
  const std::int64_t N = 12, E = 4, K = 2, seq = 3, B = N / seq, W = 2 * E + 1;
  const vec logits = randn(sz(N * E), 111, 1.3);
  vec probs(sz(N * E)), lse(sz(N)), weights(sz(N * K));
  ivec experts(sz(N * K));
  k::moe_route_forward(host{}, probs.data(), lse.data(), experts.data(), weights.data(), logits.data(), N, E, K, false);
  vec stats(sz(B * W), qnan);
  k::moe_sequence_stats(host{}, stats.data(), probs.data(), lse.data(), experts.data(), N, seq, E, K);
  double total_count = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    vec p(sz(E), 0.0), count(sz(E), 0.0);
    double z = 0;
    for (std::int64_t n = b * seq; n < (b + 1) * seq; ++n) {
      for (std::int64_t j = 0; j < E; ++j) p[sz(j)] += probs[sz(n * E + j)];
      for (std::int64_t s = 0; s < K; ++s) count[sz(experts[sz(n * K + s)])] += 1;
      z += lse[sz(n)] * lse[sz(n)];
    }
    for (std::int64_t j = 0; j < E; ++j) {
      CHECK(stats[sz(b * W + j)] == doctest::Approx(p[sz(j)]).epsilon(1e-15));
      CHECK(stats[sz(b * W + E + j)] == count[sz(j)]);
      total_count += stats[sz(b * W + E + j)];
    }
    CHECK(stats[sz(b * W + 2 * E)] == doctest::Approx(z).epsilon(1e-15));
  }
  CHECK(total_count == double(N * K));
  CHECK_THROWS_AS(k::moe_sequence_stats(host{}, stats.data(), probs.data(), lse.data(), experts.data(), N, 5, E, K),
                  strata::error);
}

// --- dispatch plan ---------------------------------------------------------------------------

TEST_CASE("moe_dispatch_plan: hand-worked plans, dropless and with capacity; a bad expert id is named") {
  const std::int64_t N = 4, K = 2, E = 3;
  const ivec experts = {0, 2,  //
                        2, 0,  //
                        2, 1,  //
                        0, 2};
  SUBCASE("dropless: sorted by expert, then token, then slot") {
    const plan p = make_plan(experts, N, K, E, 1, 0);
    CHECK(p.offsets == lvec{0, 3, 4, 8});
    CHECK(p.slot_row == ivec{0, 4, 5, 1, 6, 3, 2, 7});
    CHECK(p.row_token == ivec{0, 1, 3, 2, 0, 1, 2, 3});
    CHECK(p.dropped == lvec{0, 0, 0});
  }
  SUBCASE("capacity 1 in groups of 2 tokens: each group keeps its first pair per expert") {
    const plan p = make_plan(experts, N, K, E, 2, 1);
    CHECK(p.offsets == lvec{0, 2, 3, 5});
    CHECK(p.slot_row == ivec{0, 3, -1, -1, 4, 2, 1, -1});
    CHECK(p.row_token == ivec{0, 3, 2, 0, 2, -1, -1, -1});
    CHECK(p.dropped == lvec{1, 0, 2});
  }
  SUBCASE("capacity 2 in one group of all 4 tokens") {
    const plan p = make_plan(experts, N, K, E, 4, 2);
    CHECK(p.offsets == lvec{0, 2, 3, 5});
    CHECK(p.slot_row == ivec{0, 3, 4, 1, -1, 2, -1, -1});
    CHECK(p.row_token == ivec{0, 1, 2, 0, 1, -1, -1, -1});
    CHECK(p.dropped == lvec{1, 0, 2});
  }
  SUBCASE("a capacity no expert reaches drops nothing") {
    const plan a = make_plan(experts, N, K, E, 2, 4), b = make_plan(experts, N, K, E, 1, 0);
    CHECK(a.offsets == b.offsets);
    CHECK(a.slot_row == b.slot_row);
    CHECK(a.row_token == b.row_token);
  }
  SUBCASE("bad arguments") {
    ivec bad = experts;
    bad[5] = 3;
    CHECK_THROWS_WITH_AS(make_plan(bad, N, K, E, 1, 0),
                         "moe_dispatch_plan: expert id 3 at token 2, slot 1 is not in [0, 3)", strata::error);
    bad[5] = 1;
    bad[6] = -1;
    CHECK_THROWS_WITH_AS(make_plan(bad, N, K, E, 1, 0),
                         "moe_dispatch_plan: expert id -1 at token 3, slot 0 is not in [0, 3)", strata::error);
    CHECK_THROWS_WITH_AS(make_plan(experts, N, K, E, 3, 1),
                         "moe_dispatch_plan: the capacity group of 3 tokens does not divide N = 4", strata::error);
    CHECK_THROWS_AS(make_plan(experts, N, K, E, 1, -1), strata::error);
    CHECK_THROWS_AS(make_plan(experts, N, 4, E, 1, 0), strata::error);  // k > E
  }
}

TEST_CASE("moe_dispatch_plan: a routed batch's plan is consistent, and capacity keeps the first pairs") {
  const std::int64_t N = 12, E = 4, K = 2;
  const vec logits = randn(sz(N * E), 121, 1.5);
  vec probs(sz(N * E)), lse(sz(N)), weights(sz(N * K));
  ivec experts(sz(N * K));
  k::moe_route_forward(host{}, probs.data(), lse.data(), experts.data(), weights.data(), logits.data(), N, E, K, true);
  for (std::int64_t group : {std::int64_t(12), std::int64_t(4), std::int64_t(3)})
    for (std::int64_t capacity : {std::int64_t(0), std::int64_t(1), std::int64_t(2)}) {
      CAPTURE(group);
      CAPTURE(capacity);
      const plan p = make_plan(experts, N, K, E, group, capacity);
      std::vector<int> used(sz(N * K), 0);
      lvec kept(sz(E), 0);
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t s = 0; s < K; ++s) {
          const std::int32_t e = experts[sz(n * K + s)], r = p.slot_row[sz(n * K + s)];
          // Kept exactly when fewer than `capacity` earlier pairs of its group chose the same expert.
          std::int64_t earlier = 0;
          for (std::int64_t i = (n / group) * group * K; i < n * K + s; ++i) earlier += experts[sz(i)] == e;
          CHECK((r >= 0) == (capacity == 0 || earlier < capacity));
          if (r < 0) continue;
          CHECK(r >= p.offsets[sz(e)]);
          CHECK(r < p.offsets[sz(e) + 1]);
          CHECK(p.row_token[sz(r)] == n);
          ++used[sz(r)];
          ++kept[sz(e)];
        }
      for (std::int64_t r = 0; r < N * K; ++r) CHECK(used[sz(r)] == (r < p.rows() ? 1 : 0));
      for (std::int64_t r = p.rows(); r < N * K; ++r) CHECK(p.row_token[sz(r)] == -1);
      for (std::int64_t e = 0; e < E; ++e) CHECK(p.offsets[sz(e) + 1] - p.offsets[sz(e)] == kept[sz(e)]);
      CHECK(p.rows() + std::accumulate(p.dropped.begin(), p.dropped.end(), std::int64_t(0)) == N * K);
      for (std::int64_t e = 0; e < E; ++e)  // row order within an expert: by token, then slot
        for (std::int64_t r = p.offsets[sz(e)] + 1; r < p.offsets[sz(e) + 1]; ++r)
          CHECK(p.row_token[sz(r - 1)] <= p.row_token[sz(r)]);
    }
}

// --- permute and combine ---------------------------------------------------------------------

namespace {
// 8 tokens, 2 slots, 3 experts, capacity 2 per group of 4 tokens: pairs of tokens 2, 3, 6 and 7
// drop, and token 3 loses both.
const ivec capacity_experts = {0, 1, 1, 0, 2, 0, 0, 1,  //
                               2, 1, 1, 2, 0, 2, 2, 0};
}  // namespace

TEST_CASE("moe_permute: backward matches finite differences; a token whose pairs all drop gets zero") {
  const std::int64_t N = 8, K = 2, E = 3, C = 5;
  const plan p = make_plan(capacity_experts, N, K, E, 4, 2);
  REQUIRE(p.dropped == lvec{2, 1, 2});
  REQUIRE(p.slot_row[6] == -1);
  REQUIRE(p.slot_row[7] == -1);
  const std::int64_t M = p.rows();
  vec x = randn(sz(N * C), 131), g = randn(sz(M * C), 132), out(sz(M * C));
  auto loss = [&] {
    k::moe_permute_forward(host{}, out.data(), x.data(), p.row_token.data(), M, C);
    return weighted_sum(g, out);
  };
  loss();
  for (std::int64_t r = 0; r < M; ++r)
    for (std::int64_t c = 0; c < C; ++c) CHECK(out[sz(r * C + c)] == x[sz(p.row_token[sz(r)] * C + c)]);
  vec dx(sz(N * C), qnan);
  k::moe_permute_backward(host{}, dx.data(), g.data(), p.slot_row.data(), N, K, C);
  for (std::int64_t c = 0; c < C; ++c) CHECK(dx[sz(3 * C + c)] == 0.0);
  check_gradient("moe_permute dx", dx, x, loss);
  CHECK_THROWS_AS(k::moe_permute_forward(host{}, out.data(), x.data(), p.row_token.data(), M + 1, C), strata::error);
}

TEST_CASE("moe_combine: backward matches finite differences for expert outputs and weights; dropped slots get 0") {
  const std::int64_t N = 8, K = 2, E = 3, C = 6;
  const plan p = make_plan(capacity_experts, N, K, E, 4, 2);
  const std::int64_t M = p.rows();
  vec eo = randn(sz(M * C), 141), w = randn(sz(N * K), 142, 0.5, 0.5), g = randn(sz(N * C), 143), y(sz(N * C));
  auto loss = [&] {
    k::moe_combine_forward(host{}, y.data(), eo.data(), w.data(), p.slot_row.data(), N, K, C);
    return weighted_sum(g, y);
  };
  loss();
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c) {
      double direct = 0;
      for (std::int64_t s = 0; s < K; ++s)
        if (const std::int32_t r = p.slot_row[sz(n * K + s)]; r >= 0) direct += w[sz(n * K + s)] * eo[sz(r * C + c)];
      CHECK(y[sz(n * C + c)] == doctest::Approx(direct).epsilon(1e-15));
    }
  vec deo(sz(M * C), qnan), dw(sz(N * K), qnan);
  k::moe_combine_backward(host{}, deo.data(), dw.data(), g.data(), eo.data(), w.data(), p.slot_row.data(), N, K, C);
  for (std::int64_t i = 0; i < N * K; ++i)
    if (p.slot_row[sz(i)] < 0) CHECK(dw[sz(i)] == 0.0);
  check_gradient("moe_combine dexpert_out", deo, eo, loss);
  check_gradient("moe_combine dweights", dw, w, loss);
}

// --- grouped linear --------------------------------------------------------------------------

TEST_CASE("grouped_linear: backward matches finite differences for x and every weight; an empty expert is skipped") {
  const std::int64_t E = 3, in = 5, out = 4;
  const lvec offsets = {0, 3, 3, 7};  // expert 1 has no rows
  const std::int64_t M = offsets.back();
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  vec x = randn(sz(M * in), 151), g = randn(sz(M * out), 152), y(sz(M * out), qnan);
  std::vector<vec> W = {randn(sz(out * in), 153, 0.4), randn(sz(out * in), 154, 0.4), randn(sz(out * in), 155, 0.4)};
  auto pointers = [&] {
    std::vector<const double*> p;
    for (auto& w : W) p.push_back(w.data());
    return p;
  };
  auto loss = [&] {
    const auto wp = pointers();
    k::grouped_linear_forward(host{}, ws, y.data(), x.data(), wp.data(), offsets.data(), E, in, out);
    return weighted_sum(g, y);
  };
  loss();
  for (std::int64_t e = 0; e < E; ++e)  // y = x · Wᵀ per expert, directly
    for (std::int64_t r = offsets[sz(e)]; r < offsets[sz(e) + 1]; ++r)
      for (std::int64_t o = 0; o < out; ++o) {
        double direct = 0;
        for (std::int64_t i = 0; i < in; ++i) direct += x[sz(r * in + i)] * W[sz(e)][sz(o * in + i)];
        CHECK(y[sz(r * out + o)] == doctest::Approx(direct).epsilon(1e-14));
      }

  std::vector<vec> dW(sz(E), vec(sz(out * in), 0.0));
  auto backward = [&](double* dx) {
    std::vector<double*> dp;
    for (auto& d : dW) dp.push_back(d.data());
    const auto wp = pointers();
    k::grouped_linear_backward(host{}, ws, dx, dp.data(), g.data(), x.data(), wp.data(), offsets.data(), E, in, out);
  };
  vec dx(sz(M * in), qnan);
  backward(dx.data());
  check_gradient("grouped_linear dx", dx, x, loss);
  for (std::int64_t e = 0; e < E; ++e) {
    const std::string what = "grouped_linear dweight " + std::to_string(e);
    check_gradient(what.c_str(), dW[sz(e)], W[sz(e)], loss);
  }
  CHECK(dW[1] == vec(sz(out * in), 0.0));

  const std::vector<vec> once = dW;
  vec dx2(dx.size(), qnan);
  backward(dx2.data());
  CHECK(dx2 == dx);
  for (std::int64_t e = 0; e < E; ++e) check_doubled("grouped_linear dweight", once[sz(e)], dW[sz(e)]);
  backward(nullptr);  // no dx: the weight gradients still accumulate
  for (std::int64_t e = 0; e < E; ++e)
    for (std::size_t i = 0; i < once[sz(e)].size(); ++i)
      CHECK(dW[sz(e)][i] == doctest::Approx(3 * once[sz(e)][i]).epsilon(1e-14));

  {  // the empty expert's weight may be absent
    auto wp = pointers();
    wp[1] = nullptr;
    vec y2(y.size());
    k::grouped_linear_forward(host{}, ws, y2.data(), x.data(), wp.data(), offsets.data(), E, in, out);
    loss();
    CHECK(y2 == y);
    wp[0] = nullptr;
    CHECK_THROWS_WITH_AS(
        k::grouped_linear_forward(host{}, ws, y2.data(), x.data(), wp.data(), offsets.data(), E, in, out),
        "grouped_linear_forward: expert 0 has 3 rows but no weight", strata::error);
    const lvec decreasing = {0, 3, 2, 7};
    CHECK_THROWS_WITH_AS(
        k::grouped_linear_forward(host{}, ws, y2.data(), x.data(), pointers().data(), decreasing.data(), E, in, out),
        "grouped_linear_forward: offsets decrease at expert 1: 3 then 2", strata::error);
  }
}

// --- float against double --------------------------------------------------------------------

TEST_CASE("combine and grouped linear in float agree with double") {
  // Inputs float holds exactly, so the comparison measures the kernels' float arithmetic alone:
  // sums of at most 5 products, a few float roundings each (u = 6e-8).
  const double tol = 1e-6;
  auto as_float = [](vec& v) {
    std::vector<float> f(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = f[i] = float(v[i]);
    return f;
  };
  const bool verbose = std::getenv("STRATA_TEST_VERBOSE") != nullptr;
  {
    const std::int64_t N = 8, K = 2, E = 3, C = 6;
    const plan p = make_plan(capacity_experts, N, K, E, 4, 2);
    const std::int64_t M = p.rows();
    vec eo = randn(sz(M * C), 161), w = randn(sz(N * K), 162, 0.5, 0.5), g = randn(sz(N * C), 163);
    const auto eof = as_float(eo), wf = as_float(w), gf = as_float(g);
    vec y(sz(N * C)), deo(sz(M * C)), dw(sz(N * K));
    std::vector<float> yf(y.size()), deof(deo.size()), dwf(dw.size());
    k::moe_combine_forward(host{}, y.data(), eo.data(), w.data(), p.slot_row.data(), N, K, C);
    k::moe_combine_backward(host{}, deo.data(), dw.data(), g.data(), eo.data(), w.data(), p.slot_row.data(), N, K, C);
    k::moe_combine_forward(host{}, yf.data(), eof.data(), wf.data(), p.slot_row.data(), N, K, C);
    k::moe_combine_backward(host{}, deof.data(), dwf.data(), gf.data(), eof.data(), wf.data(), p.slot_row.data(), N, K,
                            C);
    const double ey = tensor_relative_error(yf, y), ed = tensor_relative_error(deof, deo),
                 ew = tensor_relative_error(dwf, dw);
    if (verbose) std::printf("  float moe_combine vs double: y %.2e dexpert_out %.2e dweights %.2e\n", ey, ed, ew);
    CHECK(ey <= tol);
    CHECK(ed <= tol);
    CHECK(ew <= tol);
  }
  {
    const std::int64_t E = 3, in = 5, out = 4;
    const lvec offsets = {0, 3, 3, 7};
    const std::int64_t M = offsets.back();
    strata::memory_ledger ledger;
    strata::workspace ws(ledger);
    vec x = randn(sz(M * in), 171), g = randn(sz(M * out), 172);
    std::vector<vec> W = {randn(sz(out * in), 173, 0.4), randn(sz(out * in), 174, 0.4), randn(sz(out * in), 175, 0.4)};
    const auto xf = as_float(x), gf = as_float(g);
    std::vector<std::vector<float>> Wf;
    for (auto& w : W) Wf.push_back(as_float(w));
    std::vector<const double*> wp;
    std::vector<const float*> wpf;
    std::vector<vec> dW(sz(E), vec(sz(out * in), 0.0));
    std::vector<std::vector<float>> dWf(sz(E), std::vector<float>(sz(out * in), 0.0f));
    std::vector<double*> dp;
    std::vector<float*> dpf;
    for (std::int64_t e = 0; e < E; ++e) {
      wp.push_back(W[sz(e)].data());
      wpf.push_back(Wf[sz(e)].data());
      dp.push_back(dW[sz(e)].data());
      dpf.push_back(dWf[sz(e)].data());
    }
    vec y(sz(M * out)), dx(sz(M * in));
    std::vector<float> yf(y.size()), dxf(dx.size());
    k::grouped_linear_forward(host{}, ws, y.data(), x.data(), wp.data(), offsets.data(), E, in, out);
    k::grouped_linear_backward(host{}, ws, dx.data(), dp.data(), g.data(), x.data(), wp.data(), offsets.data(), E, in,
                               out);
    k::grouped_linear_forward(host{}, ws, yf.data(), xf.data(), wpf.data(), offsets.data(), E, in, out);
    k::grouped_linear_backward(host{}, ws, dxf.data(), dpf.data(), gf.data(), xf.data(), wpf.data(), offsets.data(), E,
                               in, out);
    double ew = 0;
    for (std::int64_t e = 0; e < E; e += 2) ew = std::max(ew, tensor_relative_error(dWf[sz(e)], dW[sz(e)]));
    const double ey = tensor_relative_error(yf, y), ex = tensor_relative_error(dxf, dx);
    if (verbose) std::printf("  float grouped_linear vs double: y %.2e dx %.2e dweights %.2e\n", ey, ex, ew);
    CHECK(ey <= tol);
    CHECK(ex <= tol);
    CHECK(ew <= tol);
  }
}
