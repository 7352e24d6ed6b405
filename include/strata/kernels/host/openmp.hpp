// strata/kernels/host/openmp.hpp - the OpenMP team size and thread number the host kernels size
// their per-thread scratch by: omp_get_max_threads() and omp_get_thread_num() when the program
// is compiled with OpenMP, 1 and 0 when it is not (its '#pragma omp' lines are then ignored and
// every kernel runs on one thread), so no kernel header needs <omp.h> unguarded.
#pragma once

#ifdef _OPENMP
#include <omp.h>
#endif

namespace strata::kernels::openmp {

// Threads a parallel region started here gets at most.
inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// This thread's number in its team, 0 .. team size - 1.
inline int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// Limits the parallel regions the calling thread starts from here on (a library it calls that
// sizes its team by omp_get_max_threads, as OpenBLAS and MKL do) to one thread. Called inside a
// parallel region it changes that thread's setting for the rest of the region only.
inline void nested_single_thread() {
#ifdef _OPENMP
  omp_set_num_threads(1);
#endif
}

}  // namespace strata::kernels::openmp
