// tests/mpi/stall.cpp - a collective that cannot complete ends the job with one line.
//
//   stall skip       (4 ranks, tp=2 x dp=2) rank 1 skips a dp all_reduce of 4096 bytes and
//                    sleeps; its dp peer, rank 3, must print
//                      strata: rank 3 timed out after 2.0 s in all_reduce on group dp (4096 bytes); aborting the job
//                    and MPI_Abort the job.
//   stall exit       rank 1 exits (code 3) without finalizing, the others wait in a world
//   stall kill       all_reduce; rank 1 dies by SIGKILL instead
//   stall finalize   rank 1 finalizes MPI and returns 0 (a clean exit the launcher accepts)
// Run with STRATA_COMM_TIMEOUT=2. Ranks that are not waiting on the missing peer sleep, so the
// only way the job ends early is the watchdog (or the launcher killing it).
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <strata/comm/launch.hpp>
#include <strata/comm/mesh.hpp>

namespace {
void sleep_long() { std::this_thread::sleep_for(std::chrono::seconds(60)); }
}  // namespace

int main(int argc, char** argv) {
  auto world = strata::launch(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "skip";
  return world.run(
      [&]() -> int {
        std::vector<float> data(1024, 1.0f);  // 4096 bytes
        if (mode == "skip") {
          strata::layout_config cfg;
          cfg.tp = 2;
          cfg.dp = world.size() / 2;
          strata::process_mesh mesh(world, cfg);
          if (world.rank() != 1) mesh.dp().all_reduce(data);
          sleep_long();
          return 0;
        }
        world.comm().barrier();  // everyone is up before rank 1 goes
        if (world.rank() == 1) {
          if (mode == "exit") std::_Exit(3);
          if (mode == "kill") std::raise(SIGKILL);
          if (mode == "finalize") return 0;  // ~world finalizes MPI
        }
        world.comm().all_reduce(data);
        std::fprintf(stderr, "stall: rank %d: all_reduce completed without rank 1\n", world.rank());
        return 0;
      },
      "stall");
}
