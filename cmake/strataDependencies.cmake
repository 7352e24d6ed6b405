# Finds what strata's host path links: OpenMP, MPI and a CBLAS from OpenBLAS. Shared by strata's
# own build and by the installed package config, so both resolve the same libraries.
#
# OpenBLAS built on OpenMP is preferred: its GEMMs then share strata's OpenMP thread pool.
# The pthread build keeps a pool of its own that fights OpenMP's spinning threads for the
# cores, which halves GEMM speed on a small machine unless OMP_WAIT_POLICY=passive is set.
include_guard(DIRECTORY)
find_package(OpenMP REQUIRED COMPONENTS CXX)
# MPI carries the host path's collectives (include/strata/comm). The C++ bindings are long gone
# from the standard; only the C API is used.
if(NOT TARGET MPI::MPI_CXX)
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI REQUIRED COMPONENTS CXX)
endif()

# CRC-32 checksums of checkpoint files through zlib (Debian's zlib1g-dev).
if(NOT TARGET ZLIB::ZLIB)
  find_package(ZLIB REQUIRED)
endif()
# JSON (safetensors headers) through Debian's nlohmann-json, header-only.
if(NOT TARGET nlohmann_json::nlohmann_json)
  find_package(nlohmann_json 3 REQUIRED)
endif()

if(NOT TARGET strata::openblas)
  set(_strata_arch_lib /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE})
  set(_strata_arch_inc /usr/include/${CMAKE_LIBRARY_ARCHITECTURE})
  find_library(STRATA_OPENBLAS_LIBRARY NAMES openblas
               PATHS ${_strata_arch_lib}/openblas-openmp ${_strata_arch_lib}/openblas-pthread
               NO_DEFAULT_PATH)
  find_library(STRATA_OPENBLAS_LIBRARY NAMES openblas REQUIRED)
  get_filename_component(_strata_blas_dir ${STRATA_OPENBLAS_LIBRARY} DIRECTORY)
  get_filename_component(_strata_blas_flavour ${_strata_blas_dir} NAME)
  find_path(STRATA_CBLAS_INCLUDE_DIR cblas.h
            PATHS ${_strata_arch_inc}/${_strata_blas_flavour} ${_strata_arch_inc}/openblas-pthread
                  /usr/include/openblas
            NO_DEFAULT_PATH)
  find_path(STRATA_CBLAS_INCLUDE_DIR cblas.h REQUIRED)
  add_library(strata::openblas INTERFACE IMPORTED)
  set_target_properties(strata::openblas PROPERTIES
    INTERFACE_LINK_LIBRARIES "${STRATA_OPENBLAS_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${STRATA_CBLAS_INCLUDE_DIR}")
  if(NOT strata_FIND_QUIETLY)
    message(STATUS "strata: OpenBLAS ${STRATA_OPENBLAS_LIBRARY}")
  endif()
endif()
