// Training steps give the same bits whatever the OpenMP thread count (docs/architecture.md's
// claim): the example GPT-2, serial, fp32 and bf16, three AdamW steps at 1, 2 and 3 threads,
// losses, gradient norms and every weight compared bit for bit.
#include <doctest/doctest.h>

#include <omp.h>

#include <cstring>
#include <vector>

#include <strata/strata.hpp>

#include "strata/models/gpt2.hpp"

namespace st = strata;

namespace {

struct outcome {
  std::vector<double> losses, norms;
  std::vector<unsigned char> weights;
};

template <class Precision>
outcome train_at(int threads) {
  using P = st::policy<st::host, st::serial, Precision>;
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  // Wide enough that every kernel crosses its parallel threshold.
  const strata::models::gpt2::dims d{.vocab = 300, .seq = 64, .layers = 2, .heads = 4, .d_model = 128};
  st::memory_ledger ledger;
  st::sequential_model<strata::models::gpt2::model<P>> model(ledger, d, st::seed{3});
  st::adamw<P> opt(model, {.lr = 1e-3});
  st::trainer_options o;
  o.schedule = {1e-3, 1e-4, 1, 100};
  o.micro_batch = 4;
  st::trainer train(model, opt, o);
  st::token_stream data(st::byte_tokens(st::generate_corpus(20000)), 5);
  outcome out;
  for (int step = 0; step < 3; ++step) {
    const auto r = train.step(data.next_batch(8, d.seq));
    out.losses.push_back(r.loss);
    out.norms.push_back(r.grad_norm);
  }
  auto& params = model.parameters();
  const auto* bytes = reinterpret_cast<const unsigned char*>(params.weights_data());
  out.weights.assign(bytes, bytes + params.size() * sizeof(*params.weights_data()));
  omp_set_num_threads(before);
  return out;
}

template <class Precision>
void check_thread_counts() {
  const outcome one = train_at<Precision>(1);
  for (int threads : {2, 3}) {
    const outcome other = train_at<Precision>(threads);
    INFO(threads, " threads against 1");
    for (std::size_t i = 0; i < one.losses.size(); ++i) {
      CHECK(other.losses[i] == one.losses[i]);
      CHECK(other.norms[i] == one.norms[i]);
    }
    REQUIRE(other.weights.size() == one.weights.size());
    CHECK(std::memcmp(other.weights.data(), one.weights.data(), one.weights.size()) == 0);
  }
}

}  // namespace

TEST_CASE("fp32 training is bit-identical at 1, 2 and 3 threads") { check_thread_counts<st::fp32>(); }
TEST_CASE("bf16 training is bit-identical at 1, 2 and 3 threads") { check_thread_counts<st::mixed<st::bf16, float>>(); }
