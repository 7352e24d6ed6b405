// tests/mpi/mesh_mismatch.cpp - a layout that does not fit the world fails fast on every rank.
//
//   mesh_mismatch resolve   dp=2 x tp=2 as a static layout type, resolved against the world
//   mesh_mismatch mesh      the same degrees handed straight to process_mesh
//
// Run with 3 ranks, every rank must print
//   mesh_mismatch: error: layout dp=2 x tp=2 x pp=1 = 4 ranks does not match the world size 3
// and the job must exit non-zero at once (tests/mpi/CMakeLists.txt counts the lines).
#include <cstdio>
#include <string>

#include <strata/comm/launch.hpp>
#include <strata/comm/mesh.hpp>
#include <strata/policy/layout.hpp>
#include <strata/policy/parallel.hpp>

int main(int argc, char** argv) {
  auto world = strata::launch(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "resolve";
  return world.run(
      [&] {
        using layout = strata::parallel<strata::data<2>, strata::tensor<2>>;
        strata::layout_config cfg;
        if (mode == "mesh") {
          cfg.dp = 2;
          cfg.tp = 2;
        } else {
          cfg = strata::resolve_layout<layout>(world.size());
        }
        strata::process_mesh mesh(world, cfg);
        mesh.world().barrier();
        if (world.rank() == 0) std::printf("mesh_mismatch: the layout fits the world of %d\n", world.size());
      },
      "mesh_mismatch");
}
