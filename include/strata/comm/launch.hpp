// strata/comm/launch.hpp - the process's place in the job: MPI start-up and shut-down, RAII.
//
//   int main(int argc, char** argv) {
//     auto world = strata::launch(argc, argv);   // MPI_Init_thread; MPI_Finalize at scope exit
//     return world.run([&] {                      // a strata::error becomes one line + exit 1
//       strata::process_mesh mesh(world, strata::resolve_layout<Layout>(world.size(), overrides));
//       ...
//     }, "gpt2_train");
//   }
//
// Under mpirun/srun the world is the job; run directly, a program is a world of one (MPI
// singleton start-up: no launcher needed). If MPI was initialized before (by the user), the
// world uses it and leaves finalizing to whoever initialized it.
//
// world::run catches any exception the body throws and prints "<program>: error: <what>" on
// stderr, then returns 1. Errors every rank meets alike (a layout that does not match the world
// size: resolve_layout and process_mesh throw the same words everywhere) thus end the job with
// one identical line per rank and a non-zero exit; an error only some ranks meet leaves the
// others in their next collective, which ends the job at the timeout (timeout.hpp).
//
// The world must outlive every communicator made from it (a communicator freed after
// MPI_Finalize is skipped, not an error). Its destructor is collective: a watched barrier, then
// MPI_Finalize.
#pragma once
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "strata/comm/mpi_communicator.hpp"
#include "strata/comm/timeout.hpp"
#include "strata/core/error.hpp"

namespace strata {

class world {
 public:
  // MPI_Init_thread(MPI_THREAD_FUNNELED) unless MPI is already running: strata calls MPI from the
  // thread that drives the step only, never from inside OpenMP regions.
  world(int& argc, char**& argv, comm_options options = comm_options::from_env()) : options_(options) {
    init(&argc, &argv);
  }
  explicit world(comm_options options = comm_options::from_env()) : options_(options) { init(nullptr, nullptr); }
  world(const world&) = delete;
  world& operator=(const world&) = delete;
  // Finalizing is collective, and watched like any strata call: every rank first meets in a
  // barrier, so a rank that leaves early (returns from main while the others still communicate)
  // reports "timed out ... in finalize on group world" and ends the job instead of waiting in
  // MPI_Finalize forever (and instead of exiting "normally" under the others, which some
  // launchers, OpenMPI 4's mpirun among them, do not always clean up after).
  ~world() {
    if (initialized_here_ && detail::mpi_is_initialized() && comm_.valid()) comm_.post_barrier_named("finalize").wait();
    comm_ = mpi_communicator();  // freed before MPI_Finalize
    local_ = mpi_communicator();
    if (initialized_here_ && detail::mpi_is_initialized()) MPI_Finalize();
  }

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  // This rank's place among the ranks on its node (e.g. to pick a GPU: local_rank() % devices).
  int local_rank() const { return local_.rank(); }
  int local_size() const { return local_.size(); }

  // The world group, named "world".
  mpi_communicator& comm() { return comm_; }
  const mpi_communicator& comm() const { return comm_; }
  const comm_options& options() const { return options_; }

  // Runs body() (returning void or an exit code); an exception becomes one line on stderr,
  // "<program>: error: <what>", and exit code 1.
  template <class F>
  int run(F&& body, std::string_view program = "strata") {
    try {
      if constexpr (std::is_void_v<std::invoke_result_t<F&>>) {
        body();
        return 0;
      } else {
        return static_cast<int>(body());
      }
    } catch (const std::exception& e) {
      detail::print_line(detail::concat(program, ": error: ", e.what()));
      return 1;
    }
  }

 private:
  void init(int* argc, char*** argv) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    STRATA_CHECK(!fin, "strata::world: MPI was already finalized in this process");
    if (!init) {
      int provided = 0;
      MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
      initialized_here_ = true;
    }
    comm_ = mpi_communicator(MPI_COMM_WORLD, "world", options_);
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(comm_.native(), MPI_COMM_TYPE_SHARED, comm_.rank(), MPI_INFO_NULL, &node);
    local_ = mpi_communicator(node, "node", options_);
    MPI_Comm_free(&node);
  }

  comm_options options_;
  bool initialized_here_ = false;
  mpi_communicator comm_;
  mpi_communicator local_;
};

// The world of this process; see the top of this file.
inline world launch(int& argc, char**& argv, comm_options options = comm_options::from_env()) {
  return world(argc, argv, options);
}

}  // namespace strata
