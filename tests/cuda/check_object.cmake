# cuda.compile: (re)builds the CUDA compile-check target, then checks its object file(s) exist
# and embed device code for every kernel in KERNELS (mangled-name prefixes, '|'-separated): a
# cubin in the fatbinary has a ".nv.info.<mangled name>" section per kernel (host code never
# does), so finding it means nvcc generated that kernel's device code.
#   cmake -DBUILD_DIR=<build tree> -DTARGET=<target> [-DCONFIG=<config>] -DOBJECTS=a.o|b.o
#         -DKERNELS=k1|k2 -P check_object.cmake
cmake_minimum_required(VERSION 3.24)

set(build_args --build "${BUILD_DIR}" --target "${TARGET}")
if(CONFIG)
  list(APPEND build_args --config "${CONFIG}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" ${build_args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc STREQUAL "0")
  message("${out}")  # verbatim: FATAL_ERROR would re-wrap the compiler's lines
  message(FATAL_ERROR "cuda.compile: building ${TARGET} failed (exit ${rc}); nvcc's output is above")
endif()

string(REPLACE "|" ";" objects "${OBJECTS}")
string(REPLACE "|" ";" kernels "${KERNELS}")
if(NOT objects)
  message(FATAL_ERROR "cuda.compile: no object files given")
endif()
set(sections)
foreach(object IN LISTS objects)
  if(NOT EXISTS "${object}")
    message(FATAL_ERROR "cuda.compile: ${object} was not built")
  endif()
  file(STRINGS "${object}" object_sections REGEX "^\\.(nv_fatbin|nv\\.info\\._Z.*)$")
  list(APPEND sections ${object_sections})
endforeach()
if(NOT ".nv_fatbin" IN_LIST sections)
  message(FATAL_ERROR "cuda.compile: ${OBJECTS} has no .nv_fatbin section: no device code was embedded")
endif()
set(missing)
foreach(kernel IN LISTS kernels)
  set(found ${sections})
  list(FILTER found INCLUDE REGEX "^\\.nv\\.info\\.${kernel}")
  if(NOT found)
    list(APPEND missing ${kernel})
  endif()
endforeach()
if(missing)
  message(FATAL_ERROR "cuda.compile: no device code for kernel(s) ${missing} in ${OBJECTS}")
endif()
list(LENGTH kernels n)
message(STATUS "cuda.compile: ${OBJECTS} holds device code for ${n} kernel(s)")
