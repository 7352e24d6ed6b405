# Builds and runs tests/consumer/project against strata, as a user would:
#   MODE=add_subdirectory  the consumer adds the strata checkout with add_subdirectory()
#   MODE=find_package      strata's build tree is installed into WORK_DIR/prefix and the consumer
#                          finds it there with find_package(strata CONFIG REQUIRED)
# Every step runs from scratch (WORK_DIR is wiped first) and a failing step stops the script
# with FATAL_ERROR and that step's full output, so ctest --output-on-failure shows the cause.
#
# Usage: cmake -DMODE=... -DWORK_DIR=... -DSTRATA_SOURCE_DIR=... -DSTRATA_BINARY_DIR=...
#              -DCONSUMER_SOURCE_DIR=... -DGENERATOR=... [-DGENERATOR_PLATFORM=...]
#              [-DGENERATOR_TOOLSET=...] [-DMAKE_PROGRAM=...] -DCXX_COMPILER=...
#              [-DCXX_COMPILER_LAUNCHER=...] [-DCONFIG=...]
#              [-DEXPECTED_BLAS=OpenBLAS|MKL] [-DMPI_LAUNCH="mpiexec;-n;2;..."] -P run_consumer.cmake
# With MPI_LAUNCH (the launcher, its rank-count flag, 2 and its flags, as a list), find_package mode
# also trains the Llama of strata/models as tp 2 on 2 ranks against its serial run.
cmake_minimum_required(VERSION 3.24)

foreach(var IN ITEMS MODE WORK_DIR STRATA_SOURCE_DIR CONSUMER_SOURCE_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT CONFIG)
  set(CONFIG Release)
endif()

# Runs one step; on failure stops with the command line and everything it printed.
function(consumer_step name)
  string(TIMESTAMP t0 "%s")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  string(TIMESTAMP t1 "%s")
  math(EXPR seconds "${t1} - ${t0}")
  list(JOIN ARGN " " command_line)
  if(NOT rc STREQUAL "0")
    # The output goes out verbatim first: FATAL_ERROR would re-wrap the compiler's lines.
    message("---- ${command_line}\n${out}---- end of output (exit ${rc}) ----")
    message(FATAL_ERROR "consumer.${MODE}: ${name} failed (exit ${rc}); its output is above")
  endif()
  message(STATUS "consumer.${MODE}: ${name} ok (${seconds} s)")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(build_dir "${WORK_DIR}/build")

set(configure_args
  -S "${CONSUMER_SOURCE_DIR}" -B "${build_dir}" -G "${GENERATOR}"
  "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
  "-DCMAKE_BUILD_TYPE=${CONFIG}")
if(GENERATOR_PLATFORM)
  list(APPEND configure_args -A "${GENERATOR_PLATFORM}")
endif()
if(GENERATOR_TOOLSET)
  list(APPEND configure_args -T "${GENERATOR_TOOLSET}")
endif()
if(MAKE_PROGRAM)
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX_COMPILER_LAUNCHER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_COMPILER_LAUNCHER}")
endif()

if(MODE STREQUAL "add_subdirectory")
  # CUDA off: strata's CUDA detection would only slow the consumer's configure down.
  list(APPEND configure_args -DSTRATA_CONSUME=subdirectory "-DSTRATA_SOURCE_DIR=${STRATA_SOURCE_DIR}"
       -DSTRATA_ENABLE_CUDA=OFF)

elseif(MODE STREQUAL "find_package")
  if(NOT STRATA_BINARY_DIR)
    message(FATAL_ERROR "run_consumer.cmake: MODE=find_package needs -DSTRATA_BINARY_DIR=<strata build tree>")
  endif()
  set(prefix "${WORK_DIR}/prefix")
  consumer_step("install strata into ${prefix}"
    "${CMAKE_COMMAND}" --install "${STRATA_BINARY_DIR}" --prefix "${prefix}" --config "${CONFIG}")

  # Every public header must have been installed, next to a package config.
  file(GLOB_RECURSE source_headers RELATIVE "${STRATA_SOURCE_DIR}/include" "${STRATA_SOURCE_DIR}/include/strata/*")
  file(GLOB_RECURSE installed_headers RELATIVE "${prefix}/include" "${prefix}/include/strata/*")
  list(SORT source_headers)
  list(SORT installed_headers)
  if(NOT source_headers STREQUAL installed_headers OR NOT source_headers)
    list(REMOVE_ITEM source_headers ${installed_headers})
    message(FATAL_ERROR "consumer.${MODE}: headers missing from the install: ${source_headers}\n"
                        "installed: ${installed_headers}")
  endif()
  file(GLOB_RECURSE config_files "${prefix}/*/strataConfig.cmake")
  if(NOT config_files)
    message(FATAL_ERROR "consumer.${MODE}: the install has no strataConfig.cmake under ${prefix}")
  endif()

  list(APPEND configure_args -DSTRATA_CONSUME=package
    "-DCMAKE_PREFIX_PATH=${prefix}"
    "-DSTRATA_EXPECTED_PREFIX=${prefix}"
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
    -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)

else()
  message(FATAL_ERROR "run_consumer.cmake: MODE must be add_subdirectory or find_package, not '${MODE}'")
endif()

consumer_step("configure" "${CMAKE_COMMAND}" ${configure_args})
# An installed strata links the BLAS it was built with (strataConfig.cmake.in).
if(MODE STREQUAL "find_package" AND EXPECTED_BLAS)
  file(STRINGS "${build_dir}/CMakeCache.txt" blas_line REGEX "^STRATA_HOST_BLAS_VENDOR:")
  if(NOT blas_line MATCHES ":STRING=${EXPECTED_BLAS}$")
    message(FATAL_ERROR "consumer.${MODE}: strata was built on ${EXPECTED_BLAS}, but its installed config "
                        "gave the consumer '${blas_line}'")
  endif()
endif()
consumer_step("build" "${CMAKE_COMMAND}" --build "${build_dir}" --config "${CONFIG}")

set(exe_file "${build_dir}/consumer_exe_${CONFIG}.txt")
if(NOT EXISTS "${exe_file}")
  message(FATAL_ERROR "consumer.${MODE}: ${exe_file} was not generated")
endif()
file(READ "${exe_file}" consumer_exe)
consumer_step("run" "${consumer_exe}")
if(NOT step_output MATCHES "linear forward/backward OK")
  message(FATAL_ERROR "consumer.${MODE}: the consumer exited 0 but did not report success:\n${step_output}")
endif()
message(STATUS "consumer.${MODE}: ${step_output}")

if(MODE STREQUAL "find_package" AND MPI_LAUNCH)
  file(READ "${build_dir}/consumer_llama_exe_${CONFIG}.txt" llama_exe)
  consumer_step("run the Llama of strata/models as tp 2 on 2 ranks" ${MPI_LAUNCH} "${llama_exe}")
  if(NOT step_output MATCHES "llama tp2 matches serial")
    message(FATAL_ERROR "consumer.${MODE}: the Llama run exited 0 but did not report a match:\n${step_output}")
  endif()
  message(STATUS "consumer.${MODE}: ${step_output}")
endif()
