// A downstream program training a model of the library: the Llama of <strata/models/llama.hpp>,
// 5 steps as tp 2 on 2 ranks and 5 steps serially on each rank alone, on the same corpus with the
// same optimizer and schedule. Prints "llama tp2 matches serial" and exits 0 when the losses and
// gradient norms agree within 1e-5; exits 1 naming the step otherwise.
#include <strata/models/llama.hpp>
#include <strata/strata.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

namespace st = strata;
namespace llama = st::models::llama;

namespace {

const llama::dims shape{.vocab = 61, .seq = 16, .layers = 2, .heads = 4, .d_model = 32, .kv_heads = 2, .ffn = 64};
constexpr int steps = 5;
constexpr std::int64_t batch = 8, micro = 4;

st::trainer_options schedule() {
  st::trainer_options o;
  o.schedule = {1e-3, 1e-4, 1, steps};
  o.micro_batch = micro;
  return o;
}

st::token_stream corpus() {
  auto tokens = st::byte_tokens(st::generate_corpus(20000));
  for (auto& t : tokens) t = static_cast<std::uint16_t>(t % shape.vocab);
  return st::token_stream(std::move(tokens), 5);
}

struct run_result {
  std::vector<double> losses, grad_norms;
};

// The serial model, built and trained by the library's pieces on this rank alone.
run_result serial() {
  using P = st::policy<st::host, st::serial, st::fp32>;
  st::memory_ledger ledger;
  st::sequential_model<llama::model<P>> model(ledger, shape, st::seed{7});
  st::adamw<P> opt(model, {.lr = 1e-3});
  st::trainer train(model, opt, schedule());
  auto data = corpus();
  run_result r;
  for (int s = 0; s < steps; ++s) {
    const st::step_result step = train.step(data.next_batch(batch, shape.seq));
    r.losses.push_back(step.loss);
    r.grad_norms.push_back(step.grad_norm);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  auto world = st::launch(argc, argv);
  return world.run([&] {
    using P = st::policy<st::host, st::parallel<st::tensor<2>>, st::fp32>;
    st::training<llama::model<P>> run(world, shape,
                                      {.seed = st::seed{7}, .optimizer = {.lr = 1e-3}, .trainer = schedule()});
    auto data = corpus();
    run_result tp;
    for (int s = 0; s < steps; ++s) {
      const st::step_result step = run.step(data.next_batch(batch, shape.seq));
      tp.losses.push_back(step.loss);
      tp.grad_norms.push_back(step.grad_norm);
    }
    const run_result ref = serial();
    int bad = 0;
    for (int s = 0; s < steps; ++s) {
      const double dl = std::fabs(tp.losses[std::size_t(s)] - ref.losses[std::size_t(s)]) / ref.losses[std::size_t(s)];
      const double dg =
          std::fabs(tp.grad_norms[std::size_t(s)] - ref.grad_norms[std::size_t(s)]) / ref.grad_norms[std::size_t(s)];
      if (!(dl <= 1e-5 && dg <= 1e-5)) {
        std::fprintf(stderr, "step %d: tp2 loss %.9g grad norm %.9g, serial %.9g and %.9g\n", s + 1,
                     tp.losses[std::size_t(s)], tp.grad_norms[std::size_t(s)], ref.losses[std::size_t(s)],
                     ref.grad_norms[std::size_t(s)]);
        ++bad;
      }
    }
    if (bad > 0) throw st::error("llama tp2 differs from serial at " + std::to_string(bad) + " steps");
    if (world.rank() == 0)
      std::printf("llama tp2 matches serial: %d steps, last loss %.6f (serial %.6f)\n", steps, tp.losses.back(),
                  ref.losses.back());
  });
}
