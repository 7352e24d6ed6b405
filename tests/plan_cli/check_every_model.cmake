# Plans each model of include/strata/models with strata-plan --model NAME: every header there but
# the Hugging Face rules (*_hf.hpp) and the families' table (families*.hpp) is a model, named as
# its file. Fails naming the first model strata-plan does not take or cannot plan.
#   cmake -DPLAN=<strata-plan> -DMODELS_DIR=<include/strata/models> -P check_every_model.cmake
cmake_minimum_required(VERSION 3.24)
file(GLOB headers RELATIVE "${MODELS_DIR}" "${MODELS_DIR}/*.hpp")
set(models "")
foreach(h IN LISTS headers)
  if(h MATCHES "_hf\\.hpp$" OR h MATCHES "^families")
    continue()
  endif()
  string(REGEX REPLACE "\\.hpp$" "" name "${h}")
  list(APPEND models "${name}")
endforeach()
if(NOT models)
  message(FATAL_ERROR "no model headers under ${MODELS_DIR}")
endif()
foreach(m IN LISTS models)
  set(extra "")
  if(m STREQUAL "mixtral")
    set(extra --experts 4)
  endif()
  execute_process(COMMAND "${PLAN}" --model ${m} --layers 2 --hidden 64 --heads 4 --vocab 128 --seq 32
                          --global-batch 8 ${extra} --json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc STREQUAL "0")
    message(FATAL_ERROR "strata-plan --model ${m} (strata/models/${m}.hpp) exited ${rc}:\n${out}${err}")
  endif()
  string(JSON planned GET "${out}" model)
  if(NOT planned STREQUAL m)
    message(FATAL_ERROR "strata-plan --model ${m} planned '${planned}'")
  endif()
endforeach()
message(STATUS "strata-plan plans every model of strata/models: ${models}")
