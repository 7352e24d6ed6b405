// The single-process pieces of tensor parallelism, in double: the vocabulary-parallel
// cross-entropy and embedding kernels, combined over t simulated ranks, reproduce the whole
// kernels; tensor_shard places every piece where the serial tensor has it; a group of one is the
// identity. (The multi-rank layers are tested under mpiexec in tests/tp.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "strata/comm/group_ref.hpp"
#include "strata/core/init.hpp"
#include "strata/kernels/cross_entropy.hpp"
#include "strata/kernels/embedding.hpp"
#include "strata/layers/parameters.hpp"

namespace {

namespace k = strata::kernels;
using strata::host;
using vec = std::vector<double>;

vec randn(std::size_t n, std::uint64_t stream, double scale = 1.0) {
  vec v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * strata::counter_normal(77, stream, i);
  return v;
}

double max_abs_diff(const vec& a, const vec& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace

TEST_CASE("vocabulary-parallel cross-entropy over t pieces equals the whole fused kernel") {
  constexpr std::int64_t N = 6, V = 67;
  const std::vector<std::int32_t> targets{0, 66, 33, 17, 50, 1};
  const vec logits = randn(std::size_t(N * V), 1, 3.0);
  const double dloss = 0.25;
  vec ref_losses(N), ref_grad = logits;
  k::cross_entropy_forward_backward(host{}, ref_losses.data(), ref_grad.data(), targets.data(), N, V, V, dloss);

  for (int t : {1, 2, 3, 4}) {
    CAPTURE(t);
    const std::int64_t Vp = (V + t - 1) / t * t, Vl = Vp / t;
    // Each rank's [N, Vl] slice (padding columns hold garbage: they must be ignored).
    std::vector<vec> piece(std::size_t(t), vec(std::size_t(N * Vl), 1e3));
    for (int r = 0; r < t; ++r)
      for (std::int64_t i = 0; i < N; ++i)
        for (std::int64_t v = 0; v < Vl; ++v)
          if (r * Vl + v < V) piece[std::size_t(r)][std::size_t(i * Vl + v)] = logits[std::size_t(i * V + r * Vl + v)];
    // Step 1 and its all-reduce(max); step 2 and its all-reduce(sum); step 3 on every rank.
    vec row_max(N, -INFINITY), sums(2 * N, 0.0);
    for (int r = 0; r < t; ++r) {
      vec m(N);
      k::vocab_parallel_max(host{}, m.data(), piece[std::size_t(r)].data(), targets.data(), N, Vl, r * Vl, V);
      for (std::int64_t i = 0; i < N; ++i)
        row_max[std::size_t(i)] = std::max(row_max[std::size_t(i)], m[std::size_t(i)]);
    }
    for (int r = 0; r < t; ++r) {
      vec s(2 * N);
      k::vocab_parallel_sums(host{}, s.data(), piece[std::size_t(r)].data(), row_max.data(), targets.data(), N, Vl,
                             r * Vl, V);
      for (std::size_t i = 0; i < s.size(); ++i) sums[i] += s[i];
    }
    vec grad(std::size_t(N * V));
    for (int r = 0; r < t; ++r) {
      vec losses(N);
      k::vocab_parallel_finish(host{}, losses.data(), piece[std::size_t(r)].data(), row_max.data(), sums.data(),
                               targets.data(), N, Vl, r * Vl, V, dloss);
      CHECK(max_abs_diff(losses, ref_losses) <= 1e-12);  // every rank knows every loss
      for (std::int64_t i = 0; i < N; ++i)
        for (std::int64_t v = 0; v < Vl; ++v) {
          const double g = piece[std::size_t(r)][std::size_t(i * Vl + v)];
          if (r * Vl + v < V) grad[std::size_t(i * V + r * Vl + v)] = g;
          else CHECK(g == 0.0);  // padding gets no gradient
        }
    }
    CHECK(max_abs_diff(grad, ref_grad) <= 1e-14);
    // Loss only (evaluation): no gradient written.
    vec losses(N);
    k::vocab_parallel_finish(host{}, losses.data(), static_cast<double*>(nullptr), row_max.data(), sums.data(),
                             targets.data(), N, Vl, 0, V, 0.0);
    CHECK(max_abs_diff(losses, ref_losses) <= 1e-12);
  }
  // A target past the vocabulary is named, on every rank (each checks all targets).
  std::vector<std::int32_t> bad = targets;
  bad[3] = 67;
  vec m(N);
  CHECK_THROWS_WITH_AS(k::vocab_parallel_max(host{}, m.data(), logits.data(), bad.data(), N, 34, 34, V),
                       "cross_entropy: target 67 at position 3 is out of range for vocab 67", strata::error);
}

TEST_CASE("vocabulary-parallel embedding pieces sum to the whole embedding, forward and backward") {
  constexpr std::int64_t B = 2, T = 5, C = 4, V = 11, maxT = 6;
  const std::vector<std::int32_t> tokens{0, 10, 3, 3, 7, 10, 5, 0, 9, 2};
  const vec wte = randn(std::size_t(V * C), 2), wpe = randn(std::size_t(maxT * C), 3),
            dout = randn(std::size_t(B * T * C), 4);
  vec ref(std::size_t(B * T * C)), ref_dwte(std::size_t(V * C)), ref_dwpe(std::size_t(maxT * C));
  k::embedding_forward(host{}, ref.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, V);
  k::embedding_backward(host{}, ref_dwte.data(), ref_dwpe.data(), dout.data(), tokens.data(), B, T, C);

  for (int t : {1, 2, 3, 4}) {
    CAPTURE(t);
    const std::int64_t Vl = (V + t - 1) / t;
    vec sum(std::size_t(B * T * C), 0.0), dwte(std::size_t(Vl * t * C), 0.0);
    for (int r = 0; r < t; ++r) {
      vec table(std::size_t(Vl * C), 0.0);
      for (std::int64_t i = 0; i < Vl * C; ++i)
        if (r * Vl * C + i < V * C) table[std::size_t(i)] = wte[std::size_t(r * Vl * C + i)];
      vec out(std::size_t(B * T * C));
      k::embedding_lookup_range(host{}, out.data(), tokens.data(), table.data(), B * T, C, r * Vl, Vl, V);
      for (std::size_t i = 0; i < out.size(); ++i) sum[i] += out[i];
      k::token_embedding_backward(host{}, dwte.data() + r * Vl * C, dout.data(), tokens.data(), B * T, C, r * Vl, Vl);
    }
    // Positions added after the (simulated) reduction, in two contiguous halves of the tokens.
    k::position_embedding_add(host{}, sum.data(), wpe.data(), 4, T, 0, C);
    k::position_embedding_add(host{}, sum.data() + 4 * C, wpe.data(), B * T - 4, T, 4, C);
    CHECK(max_abs_diff(sum, ref) == 0.0);
    dwte.resize(std::size_t(V * C));
    CHECK(max_abs_diff(dwte, ref_dwte) == 0.0);
  }
  vec dwpe(std::size_t(maxT * C), 0.0);
  k::position_embedding_backward(host{}, dwpe.data(), dout.data(), B, T, C);
  CHECK(max_abs_diff(dwpe, ref_dwpe) == 0.0);

  std::vector<std::int32_t> bad = tokens;
  bad[4] = 11;
  vec out(std::size_t(B * T * C));
  CHECK_THROWS_WITH_AS(k::embedding_lookup_range(host{}, out.data(), bad.data(), wte.data(), B * T, C, 0, V, V),
                       "embedding: token id 11 at position 4 is out of range for vocab 11", strata::error);
}

TEST_CASE("tensor_shard puts every piece where the full tensor has it") {
  // A fused QKV weight [3·6, 4] over 3 ranks: rank r holds rows 2r..2r+1 of q, of k and of v.
  const strata::tensor_shard qkv{{18, 4}, 0, 3, 1, 3};
  CHECK(qkv.local() == strata::shape{6, 4});
  CHECK(qkv.global_index(0) == 2 * 4);              // q row 2
  CHECK(qkv.global_index(1 * 4 + 3) == 3 * 4 + 3);  // q row 3, column 3
  CHECK(qkv.global_index(2 * 4) == 8 * 4);          // k row 2 (rows 6..11 are k)
  CHECK(qkv.global_index(5 * 4) == 15 * 4);         // v row 3
  // Every element of the full tensor is held by exactly one rank.
  std::set<std::int64_t> seen;
  for (int r = 0; r < 3; ++r)
    for (std::int64_t i = 0; i < 24; ++i) seen.insert(qkv.of_rank(r).global_index(i));
  CHECK(seen.size() == 72u);
  // A row-parallel weight [4, 6] over 2 ranks: columns 3..5 on rank 1.
  const strata::tensor_shard row{{4, 6}, 1, 2, 1, 1};
  CHECK(row.local() == strata::shape{4, 3});
  CHECK(row.global_index(0) == 3);
  CHECK(row.global_index(3 + 2) == 6 + 5);
  // A column-parallel bias [8] over 4 ranks.
  const strata::tensor_shard bias{{8}, 0, 4, 2, 1};
  CHECK(bias.global_index(1) == 5);
  // A padded vocabulary: 10 real rows of 12, over 3 ranks; rank 2 holds rows 8..11.
  const strata::tensor_shard table{{12, 2}, 0, 3, 2, 1, 10};
  CHECK_FALSE(table.is_padding(3));  // row 9
  CHECK(table.is_padding(4));        // row 10
}

TEST_CASE("padding rows start at zero and the real rows at the serial model's values") {
  strata::memory_ledger ledger;
  strata::parameter_store<float> whole(ledger, strata::seed{5}), half(ledger, strata::seed{5});
  auto w = whole.add("wte", {5, 3}, strata::init_rule::normal_with_std(0.02), true);
  auto h = half.add("wte", strata::init_rule::normal_with_std(0.02), true, strata::tensor_shard{{6, 3}, 0, 2, 1, 1, 5});
  whole.materialize();
  half.materialize();
  const float* a = whole.weights(w);
  const float* b = half.weights(h);  // rows 3, 4 and the padding row 5
  for (int i = 0; i < 6; ++i) CHECK(b[i] == a[9 + i]);
  for (int i = 6; i < 9; ++i) CHECK(b[i] == 0.0f);
}

TEST_CASE("a group_ref of one is the identity") {
  strata::group_ref self;
  CHECK(self.size() == 1);
  CHECK(self.rank() == 0);
  std::vector<float> x{1, 2, 3}, y(3);
  self.all_reduce(std::span<float>(x));
  CHECK(x == std::vector<float>{1, 2, 3});
  self.all_gather(std::span<const float>(x), std::span<float>(y));
  CHECK(y == x);
  CHECK_THROWS_AS(self.all_gather(std::span<const float>(x), std::span<float>(y.data(), 2)), strata::error);
}
