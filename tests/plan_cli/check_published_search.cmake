# For every row of tests/plan/published_runs.json: strata-plan --search on the row's model and GPU
# count, with the settings the published run had (its device, ZeRO stage, recomputation, schedule,
# no context or sequence parallelism), finds the published layout (tp, pp, dp) among those that
# fit, and ranks it first or predicts its first choice at most TOLERANCE percent faster than the
# published layout's best micro-batch. Each row's rank is printed.
#
#   cmake -DPLAN=<strata-plan> -DDATA=<published_runs.json> -DWORK=<scratch dir> -DTOLERANCE=<percent>
#         -P check_published_search.cmake
foreach(v PLAN DATA WORK TOLERANCE)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_published_search.cmake: -D${v}=... is required")
  endif()
endforeach()
file(READ ${DATA} data)
file(MAKE_DIRECTORY ${WORK})
string(JSON tables LENGTH "${data}" tables)
set(failures 0)
math(EXPR last_table "${tables} - 1")
foreach(ti RANGE ${last_table})
  string(JSON table GET "${data}" tables ${ti})
  string(JSON device GET "${table}" device)
  set(device_file ${WORK}/device_${ti}.json)
  file(WRITE ${device_file} "${device}")
  foreach(key model seq vocab zero recompute precision schedule)
    string(JSON ${key} GET "${table}" ${key})
  endforeach()
  string(JSON rows LENGTH "${table}" rows)
  math(EXPR last_row "${rows} - 1")
  foreach(ri RANGE ${last_row})
    string(JSON row GET "${table}" rows ${ri})
    foreach(key label heads hidden layers tp pp gpus global_batch)
      string(JSON ${key} GET "${row}" ${key})
    endforeach()
    math(EXPR dp "${gpus} / (${tp} * ${pp})")
    execute_process(
      COMMAND ${PLAN} --search --gpus ${gpus} --hw-file ${device_file} --model ${model} --layers ${layers}
              --hidden ${hidden} --heads ${heads} --seq ${seq} --vocab ${vocab} --global-batch ${global_batch}
              --precision ${precision} --zero ${zero} --recompute ${recompute} --schedule ${schedule} --cp 1 --no-sp --top 1
              --rank-layout ${tp},${pp},${dp}
      OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
    set(what "${label} on ${gpus} GPUs")
    string(REGEX MATCH "tp [0-9]+ pp [0-9]+ dp [0-9]+ (ranks ([0-9]+) of [0-9]+[^\n]*faster|: no layout[^\n]*)" line
                 "${out}")
    set(rank "${CMAKE_MATCH_2}")
    if(NOT rc EQUAL 0 OR line STREQUAL "")
      message(SEND_ERROR "${what}: strata-plan --search (exit ${rc}): ${line}${err}")
      math(EXPR failures "${failures} + 1")
      continue()
    endif()
    string(REGEX MATCH "([0-9]+)\\.([0-9])% faster" pct "${line}")
    math(EXPR tenths "${CMAKE_MATCH_1} * 10 + ${CMAKE_MATCH_2}")
    math(EXPR limit "${TOLERANCE} * 10")
    if(rank EQUAL 1 OR tenths LESS_EQUAL limit)
      message(STATUS "${what}: ${line}")
    else()
      message(SEND_ERROR "${what}: ${line} (more than ${TOLERANCE}%)")
      math(EXPR failures "${failures} + 1")
    endif()
  endforeach()
endforeach()
if(failures GREATER 0)
  message(FATAL_ERROR "${failures} published layout(s) neither ranked first nor within ${TOLERANCE}% of the first")
endif()
