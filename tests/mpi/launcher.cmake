# How tests start MPI jobs: strata_mpi_launch N strata_mpi_after_np PROGRAM, with strata_mpi_env
# in the test's ENVIRONMENT. OpenMPI needs --oversubscribe (ranks > cores) and, as root, two
# variables; both are set only for OpenMPI. Included by tests/mpi and tests/dp.
include_guard(DIRECTORY)
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE strata_mpiexec_version
                ERROR_VARIABLE strata_mpiexec_version RESULT_VARIABLE strata_mpiexec_rc)
set(strata_openmpi OFF)
if(strata_mpiexec_version MATCHES "Open MPI|OpenRTE")
  set(strata_openmpi ON)
endif()
set(strata_mpi_launch ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG})
set(strata_mpi_after_np ${MPIEXEC_PREFLAGS})
if(strata_openmpi)
  list(PREPEND strata_mpi_after_np --oversubscribe)
endif()
set(strata_mpi_env "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=passive")
if(strata_openmpi)
  list(APPEND strata_mpi_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
endif()

