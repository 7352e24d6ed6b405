// tests/mpi/mpi_main.cpp - one main for the doctest MPI tests: MPI up, doctest on every rank.
//
// Every rank runs the same test cases in the same order (the collectives inside them must
// match). Rank 0 prints doctest's normal report; the others print only their failures. The exit
// code is the worst over the ranks, so a failure on any rank fails the ctest test.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "mpi_test.hpp"

namespace {
strata::world* the_world = nullptr;
}

strata::world& strata_test::world() { return *the_world; }

int main(int argc, char** argv) {
  auto w = strata::launch(argc, argv);
  the_world = &w;
  doctest::Context ctx(argc, argv);
  if (w.rank() != 0) ctx.setOption("minimal", true);
  int rc = ctx.run();
  if (ctx.shouldExit()) return rc;
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (w.rank() == 0 && worst != 0 && rc == 0) std::printf("[mpi] a test failed on another rank (see above)\n");
  return worst;
}
