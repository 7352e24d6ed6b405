// Generation with a key/value cache (train/generate.hpp), serially (2 threads):
//  - the cached attention kernel gives the full attention's rows bit for bit, for multi-head and
//    grouped-query attention, whether the positions come as one prefill or one at a time;
//  - greedy generation of 64 tokens with the cache gives the same tokens as without it (a whole
//    forward over the growing window each step), for the example GPT-2 and the grouped-query
//    Llama, and each step's logits equal the full forward's last position within 1e-5 of
//    max|logit| (fp32); the greedy choices are further than that from a tie;
//  - temperature/top-k draws are a function of (seed, index): the same twice, the same with and
//    without the cache; top_k = 1 is greedy;
//  - a generation past the position table is refused before anything runs;
//  - the figure for docs/generation.md: per-token time with and without the cache at seq 256
//    (GPT-2, 4 layers x 256 wide).
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "strata/models/neox.hpp"
#include "generate_test.hpp"

namespace {
using namespace gen_test;
namespace kn = st::kernels;

// Random qkv [B, T, row] in [-1, 1).
std::vector<float> random_qkv(const kn::attention_shape& s, std::uint64_t salt) {
  std::vector<float> v(std::size_t(s.batch * s.seq * s.row_width()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(2 * st::counter_uniform(salt, 1, i) - 1);
  return v;
}

// Positions 0 .. prefill-1 at once, then one at a time through the cache; the outputs against
// the full forward's, bit for bit.
void check_cached_kernel(const kn::attention_shape& full, std::int64_t prefill) {
  const auto qkv = random_qkv(full, 11 + std::uint64_t(full.kv_heads));
  std::vector<float> ref(std::size_t(full.batch * full.seq * full.q_width())),
      lse(std::size_t(full.batch * full.heads * full.seq));
  kn::attention_forward(st::host{}, ref.data(), lse.data(), qkv.data(), full);
  const std::int64_t B = full.batch, T = full.seq, W = full.row_width(), Q = full.q_width();
  std::vector<float> k_cache(std::size_t(B * T * full.kv_width())), v_cache(k_cache.size());
  for (std::int64_t pos = 0; pos < T;) {
    const std::int64_t n = pos == 0 ? prefill : 1;
    kn::attention_shape step = full;
    step.seq = n;
    std::vector<float> in(std::size_t(B * n * W)), out(std::size_t(B * n * Q));
    for (std::int64_t b = 0; b < B; ++b) std::copy_n(qkv.begin() + (b * T + pos) * W, n * W, in.begin() + b * n * W);
    kn::cached_attention_forward(st::host{}, out.data(), k_cache.data(), v_cache.data(), in.data(), step, pos, T);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t i = 0; i < n * Q; ++i)
        REQUIRE(out[std::size_t(b * n * Q + i)] == ref[std::size_t((b * T + pos) * Q + i)]);
    pos += n;
  }
}

template <class Model>
void check_cached_equals_uncached(const char* name, const typename Model::config& shape) {
  serial_model<Model> m(shape, trained_weights<Model>(shape));
  st::generator gen(m.model);
  const auto p = prompt(shape.vocab);
  const auto cached = record(gen, p, {.new_tokens = new_tokens});
  const auto full = record(gen, p, {.new_tokens = new_tokens, .cache = false});
  const double err = logits_error(cached, full), margin = smallest_margin(full);
  MESSAGE(std::string(name) << ": 64 greedy tokens, cached logits within " << err
                            << " of max|logit| of the full forward's; "
                            << "smallest top-2 gap " << margin << " of max|logit|");
  CHECK(cached.tokens.size() == std::size_t(new_tokens));
  CHECK(cached.tokens == full.tokens);
  CHECK(err <= 1e-5);
  CHECK(margin > 100 * err);  // the choices are nowhere near a tie
  // More than one token: the comparison covers real continuations, not a repeated token.
  CHECK(std::count(cached.tokens.begin(), cached.tokens.end(), cached.tokens.front()) < new_tokens);
}

}  // namespace

TEST_CASE("the cached attention kernel gives the full attention's rows bit for bit") {
  check_cached_kernel({.batch = 2, .seq = 37, .heads = 4, .kv_heads = 4, .head_dim = 16}, 5);  // multi-head
  check_cached_kernel({.batch = 2, .seq = 37, .heads = 8, .kv_heads = 2, .head_dim = 8}, 1);   // grouped-query
  check_cached_kernel({.batch = 1, .seq = 20, .heads = 4, .kv_heads = 1, .head_dim = 8},
                      20);  // multi-query, one prefill
}

TEST_CASE("greedy generation with the KV cache gives the tokens and logits of the full forward") {
  check_cached_equals_uncached<strata::models::gpt2::model<serial_policy>>("GPT-2", gpt2_shape);
  check_cached_equals_uncached<strata::models::llama::model<serial_policy>>(
      "Llama (8 query heads on 2 key/value heads)", llama_shape);
  // Partial rotary by absolute position, the per-head QKV regrouped and the parallel residual,
  // token by token.
  check_cached_equals_uncached<strata::models::neox::model<serial_policy>>(
      "GPT-NeoX (parallel residual, rotary on a quarter of each head, per-head QKV)",
      strata::models::neox::dims{.vocab = 64, .seq = 96, .layers = 2, .heads = 4, .d_model = 64, .ffn = 128});
}

TEST_CASE("temperature and top-k draws depend on the seed and the token's index alone") {
  serial_model<strata::models::llama::model<serial_policy>> m(
      llama_shape, trained_weights<strata::models::llama::model<serial_policy>>(llama_shape));
  st::generator gen(m.model);
  const auto p = prompt(llama_shape.vocab);
  const st::sampling warm{.temperature = 0.8, .top_k = 20, .seed = 3};
  const auto a = gen.generate(p, {.new_tokens = 32, .sample = warm});
  CHECK(gen.generate(p, {.new_tokens = 32, .sample = warm}) == a);
  CHECK(gen.generate(p, {.new_tokens = 32, .sample = warm, .cache = false}) == a);
  CHECK(gen.generate(p, {.new_tokens = 32, .sample = {.temperature = 0.8, .top_k = 20, .seed = 4}}) != a);
  CHECK(gen.generate(p, {.new_tokens = 32, .sample = {.temperature = 0.8, .top_k = 1, .seed = 3}}) ==
        gen.generate(p, {.new_tokens = 32}));
  // The draw itself: ties go to the lowest id; top-k keeps the k largest.
  const std::vector<double> logits{1.0, 3.0, 3.0, -2.0};
  CHECK(st::choose_token(logits, {}, 0) == 1);
  for (std::uint64_t i = 0; i < 50; ++i) {
    const auto t = st::choose_token(logits, {.temperature = 1.0, .top_k = 2, .seed = 9}, i);
    CHECK((t == 1 || t == 2));
  }
  CHECK_THROWS_WITH(st::choose_token(logits, {.temperature = -1}, 0),
                    doctest::Contains("the temperature must be finite and >= 0"));
}

TEST_CASE("generation past the position table is refused before it starts") {
  serial_model<strata::models::gpt2::model<serial_policy>> m(gpt2_shape);
  st::generator gen(m.model);
  const std::vector<std::int32_t> p(90, 1);
  CHECK_THROWS_WITH(gen.generate(p, {.new_tokens = 8}),
                    doctest::Contains("need 97 positions; the model knows 96 (its position table): ask for at most 7"));
  CHECK(gen.generate(p, {.new_tokens = 7}).size() == 7);
  CHECK_THROWS_WITH(gen.generate(std::vector<std::int32_t>{1, 64}, {.new_tokens = 1}),
                    doctest::Contains("token id 64 at position 1 is out of range for vocab 64"));
  CHECK_THROWS_WITH(gen.generate(std::vector<std::int32_t>{}, {.new_tokens = 1}),
                    doctest::Contains("the prompt is empty"));
}

TEST_CASE("per-token time with and without the cache at seq 256 (GPT-2, 4 layers x 256 wide)") {
  using M = strata::models::gpt2::model<serial_policy>;
  const strata::models::gpt2::dims shape{.vocab = 256, .seq = 256, .layers = 4, .heads = 4, .d_model = 256};
  serial_model<M> m(shape);
  st::generator gen(m.model);
  std::vector<std::int32_t> p(224);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = std::int32_t((i * 37 + 11) % 256);
  // Seconds between consecutive tokens, the first (which includes the prefill) left out: each is
  // one decode step (or one forward over the window), at positions 225 .. 255.
  const auto per_token = [&](bool cache) {
    using clock = std::chrono::steady_clock;
    clock::time_point last;
    double total = 0;
    int counted = 0;
    gen.generate(p, {.new_tokens = 32, .cache = cache}, [&](std::int64_t i, std::int32_t, std::span<const double>) {
      const auto now = clock::now();
      if (i > 0) total += std::chrono::duration<double>(now - last).count(), ++counted;
      last = now;
    });
    return total / counted;
  };
  per_token(true);  // warm-up
  const double with = per_token(true), without = per_token(false);
  MESSAGE("seq 225..256, GPT-2 4 x 256 (3.2M weights), fp32, serial, "
          << st::kernels::openmp::max_threads() << " threads: " << with * 1e3 << " ms/token with the KV cache, "
          << without * 1e3 << " ms/token without (a forward over the window): " << without / with << "x");
  CHECK(without > 5 * with);
}
