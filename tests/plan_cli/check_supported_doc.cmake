# docs/supported-combinations.md holds the table of supported combinations as strata-plan
# --supported prints it from policy/support.hpp, between its two markers. Fails showing both
# when they differ; the fix is to paste strata-plan --supported's output between the markers.
#   cmake -DPLAN=<strata-plan> -DDOC=<docs/supported-combinations.md> -P check_supported_doc.cmake
cmake_minimum_required(VERSION 3.24)
execute_process(COMMAND "${PLAN}" --supported RESULT_VARIABLE rc OUTPUT_VARIABLE printed ERROR_VARIABLE err)
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "strata-plan --supported exited ${rc}: ${err}")
endif()
file(READ "${DOC}" doc)
set(open_marker "<!-- strata-plan --supported -->\n")
set(close_marker "<!-- end of strata-plan --supported -->")
string(FIND "${doc}" "${open_marker}" open)
string(FIND "${doc}" "${close_marker}" close)
if(open EQUAL -1 OR close EQUAL -1 OR close LESS open)
  message(FATAL_ERROR "${DOC}: expected the table between '${open_marker}' and '${close_marker}'")
endif()
string(LENGTH "${open_marker}" skip)
math(EXPR start "${open} + ${skip}")
math(EXPR length "${close} - ${start}")
string(SUBSTRING "${doc}" ${start} ${length} held)
if(NOT held STREQUAL printed)
  message(FATAL_ERROR "${DOC} holds another table than strata-plan --supported prints.\nThe doc:\n${held}\n"
                      "strata-plan --supported:\n${printed}")
endif()
string(REGEX MATCHALL "\n\\| `" rows "\n${printed}")
list(LENGTH rows n)
message(STATUS "docs/supported-combinations.md holds the table of ${n} rows")
