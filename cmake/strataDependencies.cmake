# Finds what strata's host path links: OpenMP, MPI and a CBLAS, as the target strata::host_blas.
# Shared by strata's own build and by the installed package config, so both resolve the same
# libraries.
#
# The CBLAS is STRATA_HOST_BLAS_VENDOR's:
#   OpenBLAS (the default)  Debian's. The build on OpenMP is preferred: its GEMMs then share
#                           strata's OpenMP thread pool. The pthread build keeps a pool of its own
#                           that fights OpenMP's spinning threads for the cores, which halves GEMM
#                           speed on a small machine unless OMP_WAIT_POLICY=passive is set.
#   MKL                     Intel's single dynamic library, libmkl_rt, with mkl_cblas.h, from
#                           STRATA_MKL_ROOT or $MKLROOT (PyPI's wheels: pip install --no-deps
#                           --prefix DIR mkl mkl-include, then -DSTRATA_MKL_ROOT=DIR). Its GEMMs
#                           run on strata's OpenMP threads too (kernels/host/blas_core.hpp).
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

set(STRATA_HOST_BLAS_VENDOR "OpenBLAS" CACHE STRING "The CBLAS strata's host GEMMs call: OpenBLAS or MKL")
set_property(CACHE STRATA_HOST_BLAS_VENDOR PROPERTY STRINGS OpenBLAS MKL)
set(STRATA_MKL_ROOT "" CACHE PATH "With STRATA_HOST_BLAS_VENDOR=MKL: the prefix of include/mkl_cblas.h and lib/libmkl_rt")

if(NOT TARGET strata::host_blas)
  if(STRATA_HOST_BLAS_VENDOR STREQUAL "MKL")
    set(_strata_mkl_hints ${STRATA_MKL_ROOT} $ENV{MKLROOT})
    find_path(STRATA_MKL_INCLUDE_DIR mkl_cblas.h HINTS ${_strata_mkl_hints} PATH_SUFFIXES include)
    # PyPI's wheel ships only the versioned name, libmkl_rt.so.2.
    find_library(STRATA_MKL_LIBRARY NAMES mkl_rt libmkl_rt.so.2 HINTS ${_strata_mkl_hints} PATH_SUFFIXES lib lib/intel64)
    if(NOT STRATA_MKL_INCLUDE_DIR OR NOT STRATA_MKL_LIBRARY)
      message(FATAL_ERROR "strata: STRATA_HOST_BLAS_VENDOR=MKL, but mkl_cblas.h (${STRATA_MKL_INCLUDE_DIR}) or "
                          "libmkl_rt (${STRATA_MKL_LIBRARY}) is not under STRATA_MKL_ROOT='${STRATA_MKL_ROOT}' or "
                          "MKLROOT='$ENV{MKLROOT}'. From PyPI: pip install --no-deps --prefix DIR mkl mkl-include, "
                          "then -DSTRATA_MKL_ROOT=DIR")
    endif()
    add_library(strata::host_blas INTERFACE IMPORTED)
    set_target_properties(strata::host_blas PROPERTIES
      INTERFACE_LINK_LIBRARIES "${STRATA_MKL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${STRATA_MKL_INCLUDE_DIR}"
      INTERFACE_COMPILE_DEFINITIONS "STRATA_HOST_BLAS_MKL=1")
    if(NOT strata_FIND_QUIETLY)
      message(STATUS "strata: MKL ${STRATA_MKL_LIBRARY}")
    endif()
  elseif(STRATA_HOST_BLAS_VENDOR STREQUAL "OpenBLAS")
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
    add_library(strata::host_blas INTERFACE IMPORTED)
    set_target_properties(strata::host_blas PROPERTIES
      INTERFACE_LINK_LIBRARIES "${STRATA_OPENBLAS_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${STRATA_CBLAS_INCLUDE_DIR}")
    if(NOT strata_FIND_QUIETLY)
      message(STATUS "strata: OpenBLAS ${STRATA_OPENBLAS_LIBRARY}")
    endif()
  else()
    message(FATAL_ERROR "strata: STRATA_HOST_BLAS_VENDOR='${STRATA_HOST_BLAS_VENDOR}' is neither OpenBLAS nor MKL")
  endif()
endif()
