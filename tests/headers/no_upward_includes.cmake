# cmake -DINCLUDE_DIR=<repo>/include -P no_upward_includes.cmake
#
# The folders under include/strata are layers (docs/architecture.md, the table at the top): a
# header includes strata headers of its own folder and of the folders below it, never above.
#   core      core
#   policy    core
#   kernels   core, and of policy only the device tags (policy/device.hpp)
#   comm      core, policy
#   layers    core, policy, kernels, comm
#   parallel  ... layers
#   optim     ... parallel
#   plan      ... optim
#   train     everything below
#   models    everything below (the library's models and their Hugging Face rules)
# strata/strata.hpp, at the top, includes them all. Fails naming every file and include that
# breaks the order.
cmake_minimum_required(VERSION 3.24)
if(NOT INCLUDE_DIR)
  message(FATAL_ERROR "no_upward_includes.cmake: pass -DINCLUDE_DIR=<repository>/include")
endif()

# What a header in each folder may include, as "folder/" prefixes or whole paths under strata/.
set(below_core "core/")
set(below_policy ${below_core} "policy/")
set(below_kernels ${below_core} "policy/device.hpp")
set(below_comm ${below_policy})
set(below_layers ${below_policy} "kernels/" "comm/")
set(below_parallel ${below_layers} "layers/")
set(below_optim ${below_parallel} "parallel/")
set(below_plan ${below_optim} "optim/")
set(below_train ${below_plan} "plan/")
set(below_models ${below_train} "train/")
set(layers core policy kernels comm layers parallel optim plan train models)

file(GLOB_RECURSE headers RELATIVE ${INCLUDE_DIR}/strata ${INCLUDE_DIR}/strata/*.hpp ${INCLUDE_DIR}/strata/*.cuh)
list(SORT headers)
set(violations)
set(checked 0)
foreach(header IN LISTS headers)
  if(NOT header MATCHES "^([a-z_]+)/")
    continue()  # strata.hpp: the whole library
  endif()
  set(folder ${CMAKE_MATCH_1})
  if(NOT folder IN_LIST layers)
    list(APPEND violations "strata/${header}: folder ${folder}/ is in no layer of docs/architecture.md's table")
    continue()
  endif()
  set(allowed "${folder}/" ${below_${folder}})
  file(STRINGS ${INCLUDE_DIR}/strata/${header} includes REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]strata/")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[<\"]strata/([^>\"]+)[>\"].*$" "\\1" included "${line}")
    math(EXPR checked "${checked} + 1")
    set(ok FALSE)
    foreach(prefix IN LISTS allowed)
      string(LENGTH "${prefix}" n)
      string(SUBSTRING "${included}" 0 ${n} head)
      if(head STREQUAL prefix)
        set(ok TRUE)
        break()
      endif()
    endforeach()
    if(NOT ok)
      list(JOIN allowed ", " allowed_text)
      list(APPEND violations "strata/${header} includes strata/${included}: ${folder}/ may include only ${allowed_text}")
    endif()
  endforeach()
endforeach()

if(violations)
  list(LENGTH violations count)
  list(JOIN violations "\n  " lines)
  message(FATAL_ERROR "${count} include(s) against the layer order:\n  ${lines}")
endif()
list(LENGTH headers n_headers)
message(STATUS "no upward includes: ${checked} strata includes in ${n_headers} headers follow the layer order")
