// docs/custom-models.md's model trained in the emulated device space (core/emulated_memory.hpp:
// host memory that says it is not, fills fresh buffers with NaN and counts what crosses it) and
// in host memory, under the layout of the arguments (tp pp): the same losses, bit for bit, each
// finite; the emulated run allocated through the space and gave every block back. Its layers
// touch activations only through kernels (the building blocks of kernels/elementwise.hpp and
// kernels/rowwise.hpp), so nothing of theirs reads the space's memory on the host, and a buffer
// read before it is written would turn the losses to NaN.
#define main doc_custom_models_main
#include "custom_models.cpp"
#undef main

#include <cmath>
#include <cstring>
#include <vector>

#include <strata/core/emulated_memory.hpp>

namespace {
std::vector<double> train(st::world& world, int tp, int pp, const st::memory_space* memory) {
  st::training_options options{.layout = {.tp = tp, .pp = pp, .microbatches = pp > 1 ? 2 : 1},
                               .optimizer = {.lr = 1e-3}};
  options.trainer.micro_batch = pp > 1 ? 0 : 2;
  options.memory = memory;
  st::training<my_model<Policy>> run(world, dims{}, options);
  auto tokens = st::byte_tokens(st::generate_corpus(20000));
  for (auto& t : tokens) t = std::uint16_t(t % dims{}.vocab);
  st::token_stream data(std::move(tokens), 5);
  std::vector<double> losses;
  for (int step = 1; step <= 3; ++step) losses.push_back(run.step(data.next_batch(4, dims{}.seq)).loss);
  return losses;
}
}  // namespace

int main(int argc, char** argv) {
  auto world = st::launch(argc, argv);
  return world.run([&] {
    const int tp = argc > 1 ? std::stoi(argv[1]) : 1, pp = argc > 2 ? std::stoi(argv[2]) : 1;
    const auto host = train(world, tp, pp, nullptr);
    auto& counts = st::emulated_memory_stats();
    const long before = counts.allocations;
    const auto emulated = train(world, tp, pp, &st::emulated_device_memory());
    bool ok = counts.allocations > before && counts.live.empty() && counts.uploads > 0;
    if (!ok)
      std::printf("rank %d: the emulated run did not allocate through the space, or kept a block\n", world.rank());
    for (std::size_t i = 0; i < host.size(); ++i) {
      const bool same = std::memcmp(&host[i], &emulated[i], sizeof(double)) == 0 && std::isfinite(host[i]);
      if (world.rank() == 0)
        std::printf("step %zu loss host %.17g emulated %.17g%s\n", i + 1, host[i], emulated[i],
                    same ? "" : "  DIFFERENT");
      ok = ok && same;
    }
    if (!ok) throw st::error("custom_models_emulated: the emulated device run differs from the host run");
    if (world.rank() == 0) std::printf("emulated device == host, bit for bit\n");
  });
}
