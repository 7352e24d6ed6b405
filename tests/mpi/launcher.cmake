# How tests start MPI jobs: strata_mpi_launch N strata_mpi_after_np PROGRAM, with strata_mpi_env
# in the test's ENVIRONMENT. OpenMPI needs --oversubscribe (ranks > cores) and, as root, two
# variables; both are set only for OpenMPI. Included by tests/mpi, tests/dp, tests/tp and tests/cli.
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


# strata_add_mpi_suite(PREFIX TARGET SOURCE RANKS...): one doctest executable (with the MPI main and
# the examples on its include path), run as ctest tests PREFIX.npN under mpiexec at each rank count.
function(strata_add_mpi_suite prefix target source)
  add_executable(${target} ${source} $<TARGET_OBJECTS:strata_test_mpi_main>)
  strata_test_program(${target})
  foreach(np IN LISTS ARGN)
    add_test(NAME ${prefix}.np${np}
             COMMAND ${strata_mpi_launch} ${np} ${strata_mpi_after_np} $<TARGET_FILE:${target}> --no-colors)
    set_tests_properties(${prefix}.np${np} PROPERTIES TIMEOUT 300 PROCESSORS ${np} LABELS mpi
                         ENVIRONMENT "${strata_mpi_env};STRATA_COMM_TIMEOUT=120")
  endforeach()
endfunction()
