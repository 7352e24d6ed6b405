# expect_abort.cmake - runs a command that must end the job: non-zero exit, within a time bound,
# with the expected line in its output.
#   cmake -DCMD="mpiexec|-n|4|prog|arg" -DMAX_SECONDS=20 [-DEXPECT_REGEX=re] [-DEXPECT_COUNT=n]
#         -P expect_abort.cmake
# CMD's words are separated by '|'. EXPECT_REGEX must match at least once (exactly EXPECT_COUNT
# times when given); the command is killed and the test fails if it runs past MAX_SECONDS.
string(REPLACE "|" ";" cmd "${CMD}")
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT ${MAX_SECONDS})
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
set(all "${out}${err}")
message("---- output ----\n${all}---- exit ${rc} after ${elapsed} s (bound ${MAX_SECONDS} s) ----")
if("${rc}" STREQUAL "0")
  message(FATAL_ERROR "FAIL: expected a non-zero exit, got 0")
endif()
if(NOT "${rc}" MATCHES "^[0-9]+$")
  message(FATAL_ERROR "FAIL: did not end by itself within ${MAX_SECONDS} s (${rc})")
endif()
if(DEFINED EXPECT_REGEX AND NOT "${EXPECT_REGEX}" STREQUAL "")
  # A ';' in a match would split it into two list elements: count on a copy without them.
  string(REPLACE ";" "," flat "${all}")
  string(REGEX MATCHALL "${EXPECT_REGEX}" hits "${flat}")
  list(LENGTH hits k)
  if(k EQUAL 0)
    message(FATAL_ERROR "FAIL: the output does not match: ${EXPECT_REGEX}")
  endif()
  if(DEFINED EXPECT_COUNT AND NOT k EQUAL EXPECT_COUNT)
    message(FATAL_ERROR "FAIL: expected ${EXPECT_COUNT} lines matching '${EXPECT_REGEX}', found ${k}")
  endif()
  message("ok: exit ${rc} after ${elapsed} s, ${k} x '${EXPECT_REGEX}'")
else()
  message("ok: exit ${rc} after ${elapsed} s")
endif()
