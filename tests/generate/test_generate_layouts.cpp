// Generation with a key/value cache under the host layouts, against the serial model, under
// mpiexec. Each rank trains the example GPT-2 and the grouped-query Llama a few steps serially
// (tests/generate/generate_test.hpp), generates 64 greedy tokens and 32 drawn ones (temperature
// 0.8, top-k 20) with that serial model, then starts every layout of its world size from the same
// weights (training_options::initial_weights) and generates again:
//   2 ranks: dp 2 (ZeRO-0 and ZeRO-3), tp 2, tp 2 + SP, pp 2 (1F1B: 2 blocks per stage; and
//            interleaved, 2 chunks of 1 block per stage);
//   4 ranks: tp 4 (the Llama's 2 key/value heads each on 2 ranks), tp 2 + SP x pp 2, dp 2 x tp 2
//            with ZeRO-3.
// Every rank must produce the serial tokens, greedy and drawn; the logits of each step, where a
// rank holds the head, within 1e-5 of max|logit| of the serial cached run's. Where the model is
// whole on each rank (no pipeline), the uncached reference under the layout gives the same tokens.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "../mpi/layout_equivalence.hpp"
#include "generate_test.hpp"

namespace {
using namespace gen_test;

struct gpt2_family {
  using config = strata::models::gpt2::dims;
  template <class P>
  using apply = strata::models::gpt2::model<P>;
};
struct llama_family {
  using config = strata::models::llama::dims;
  template <class P>
  using apply = strata::models::llama::model<P>;
};
using strata_test::launch_policy;

struct sized_case {
  int world;
  strata_test::layout_case layout;
};
const sized_case cases[] = {
    {2, {"dp2, ZeRO-0", 2, 1, 1, 0, 0, 1, 1, "1f1b"}},
    {2, {"dp2, ZeRO-3", 2, 1, 1, 3, 0, 1, 1, "1f1b"}},
    {2, {"tp2", 1, 2, 1, 0, 0, 1, 1, "1f1b"}},
    {2, {"tp2 + SP", 1, 2, 1, 0, 1, 1, 1, "1f1b"}},
    {2, {"pp2, 1F1B", 1, 1, 2, 0, 0, 4, 1, "1f1b"}},
    {2, {"pp2, interleaved V=2", 1, 1, 2, 0, 0, 4, 2, "interleaved"}},
    {4, {"tp4", 1, 4, 1, 0, 0, 1, 1, "1f1b"}},
    {4, {"tp2 + SP x pp2", 1, 2, 2, 0, 1, 2, 1, "1f1b"}},
    {4, {"dp2 x tp2, ZeRO-3", 2, 2, 1, 3, 0, 1, 1, "1f1b"}},
};
const st::sampling warm{.temperature = 0.8, .top_k = 20, .seed = 3};

template <class Family>
void check_layouts(const char* family, const typename Family::config& shape) {
  using serial = typename Family::template apply<serial_policy>;
  using spread = typename Family::template apply<launch_policy<st::fp32>>;
  const auto weights = trained_weights<serial>(shape);
  const auto p = prompt(shape.vocab);
  serial_model<serial> one(shape, weights);
  st::generator reference(one.model);
  const auto greedy = record(reference, p, {.new_tokens = new_tokens});
  const auto drawn = reference.generate(p, {.new_tokens = 32, .sample = warm});
  const int world = strata_test::world().size();
  int ran = 0;
  for (const auto& [size, c] : cases) {
    if (size != world) continue;
    ++ran;
    CAPTURE(std::string(family) + ", " + c.name);
    auto o = strata_test::launch(c, {});
    o.seed = st::seed{seed};
    o.initial_weights = weights;
    st::training<spread> run(strata_test::world().comm(), shape, std::move(o));
    st::generator gen(run);
    const auto got = record(gen, p, {.new_tokens = new_tokens});
    CHECK(got.tokens == greedy.tokens);
    const bool head = run.model().holds_head();
    double err = head ? logits_error(got, greedy) : 0.0;
    strata_test::world().comm().all_reduce(std::span<double>(&err, 1), st::reduce_op::max);
    CHECK(err <= 1e-5);
    CHECK(gen.generate(p, {.new_tokens = 32, .sample = warm}) == drawn);
    if (!run.model().pipelined()) CHECK(gen.generate(p, {.new_tokens = new_tokens, .cache = false}) == greedy.tokens);
    if (strata_test::world().rank() == 0)
      MESSAGE(std::string(family) << ", " << std::string(c.name) << ": the serial tokens; logits within " << err
                                  << " of max|logit|");
  }
  CHECK(ran > 0);
}

}  // namespace

TEST_CASE("GPT-2 generates the serial tokens under every layout") { check_layouts<gpt2_family>("GPT-2", gpt2_shape); }

TEST_CASE("the grouped-query Llama generates the serial tokens under every layout") {
  check_layouts<llama_family>("Llama", llama_shape);
}

TEST_CASE("a generator over some pipeline stages only is refused, naming the head") {
  if (strata_test::world().size() != 2) return;
  auto o = strata_test::launch({"pp2", 1, 1, 2, 0, 0, 2, 1, "1f1b"}, {});
  st::training<strata::models::gpt2::model<launch_policy<st::fp32>>> run(strata_test::world().comm(), gpt2_shape,
                                                                         std::move(o));
  // Each stage alone: the first holds no head; the reference needs the whole model.
  if (run.model().holds_head()) {
    st::generator gen(run.model());
    CHECK_THROWS_WITH(gen.generate(prompt(gpt2_shape.vocab), {.new_tokens = 2, .cache = false}),
                      doctest::Contains("split over pipeline stages (generate with the cache)"));
  } else {
    CHECK_THROWS_WITH(st::generator(run.model()), doctest::Contains("holds the model's head"));
  }
}
