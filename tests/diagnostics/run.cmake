# Diagnostics golden suite: every fail_*.yaml / fail_*.json here holds one deliberate error, and
# fail_<name>.stderr the exact stderr hectorgen must print for it (paths relative: hectorgen runs from
# inside this folder). For each spec this script checks that hectorgen
#   * exits with 1 (a user error: not 0, not 2, no signal),
#   * prints exactly the expected stderr and nothing on stdout,
#   * leaves the output directory (-o), pre-populated with stale files, byte-for-byte unchanged.
#
# Regenerate every .stderr after an intended change of messages with one command:
#     tools/update_goldens.sh            (or: tools/update_goldens.sh --diagnostics-only [HECTORGEN])
# and review the diff.
#
# Usage (CMake script mode, no Python needed; registered as the ctest test `diagnostics`):
#   cmake -DHECTORGEN=build/hectorgen -DDIAG_DIR=tests/diagnostics -DWORK_DIR=/tmp/diag-work
#         [-DONLY=fail_yaml_syntax] -P tests/diagnostics/run.cmake
cmake_minimum_required(VERSION 3.20)

foreach(var HECTORGEN DIAG_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run.cmake: pass -D${var}=...")
  endif()
endforeach()
get_filename_component(HECTORGEN "${HECTORGEN}" ABSOLUTE)
get_filename_component(DIAG_DIR "${DIAG_DIR}" ABSOLUTE)
get_filename_component(WORK_DIR "${WORK_DIR}" ABSOLUTE)
if(NOT EXISTS "${HECTORGEN}")
  message(FATAL_ERROR "run.cmake: no hectorgen at ${HECTORGEN}")
endif()

# A listing of every file and folder under `dir` (hidden ones included) with each file's SHA-256.
function(snapshot dir out_var)
  file(GLOB_RECURSE entries LIST_DIRECTORIES true RELATIVE "${dir}" "${dir}/*")
  list(SORT entries)
  set(result "")
  foreach(e IN LISTS entries)
    if(IS_DIRECTORY "${dir}/${e}")
      string(APPEND result "${e}/\n")
    else()
      file(SHA256 "${dir}/${e}" hash)
      file(SIZE "${dir}/${e}" size)
      string(APPEND result "${e} ${size} ${hash}\n")
    endif()
  endforeach()
  set(${out_var} "${result}" PARENT_SCOPE)
endfunction()

# Stale files a failing run must not touch: earlier outputs of the same model, a hidden file, a subfolder.
function(populate dir)
  file(REMOVE_RECURSE "${dir}")
  file(MAKE_DIRECTORY "${dir}/sub")
  file(WRITE "${dir}/rgcn.inter.ir" "stale output of an earlier run\n")
  file(WRITE "${dir}/rgcn_kernels.cu" "// stale\n")
  file(WRITE "${dir}/manifest.json" "{}\n")
  file(WRITE "${dir}/.hidden" "x")
  file(WRITE "${dir}/sub/keep.txt" "keep me\n")
endfunction()

file(GLOB specs RELATIVE "${DIAG_DIR}" "${DIAG_DIR}/fail_*.yaml" "${DIAG_DIR}/fail_*.json")
list(SORT specs)
list(LENGTH specs count)
if(count EQUAL 0)
  message(FATAL_ERROR "run.cmake: no fail_*.yaml / fail_*.json in ${DIAG_DIR}")
endif()

set(failed "")
set(checked 0)
foreach(spec IN LISTS specs)
  string(REGEX REPLACE "\\.(yaml|json)$" "" name "${spec}")
  if(DEFINED ONLY AND NOT name STREQUAL ONLY)
    continue()
  endif()
  math(EXPR checked "${checked} + 1")
  set(expected_file "${DIAG_DIR}/${name}.stderr")
  set(out_dir "${WORK_DIR}/${name}")
  populate("${out_dir}")
  snapshot("${out_dir}" before)

  execute_process(
    COMMAND "${HECTORGEN}" "${spec}" -o "${out_dir}"
    WORKING_DIRECTORY "${DIAG_DIR}"
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE err)
  snapshot("${out_dir}" after)

  set(problems "")
  if(NOT rc STREQUAL "1")
    string(APPEND problems "  exit status '${rc}', expected 1\n")
  endif()
  if(NOT EXISTS "${expected_file}")
    string(APPEND problems "  no ${name}.stderr (run tools/update_goldens.sh)\n")
  else()
    file(READ "${expected_file}" expected)
    if(NOT err STREQUAL expected)
      string(APPEND problems "  stderr differs from ${name}.stderr\n"
                             "  ---- expected ----\n${expected}"
                             "  ---- actual ----\n${err}"
                             "  ------------------\n")
    endif()
  endif()
  if(NOT out STREQUAL "")
    string(APPEND problems "  stdout is not empty:\n${out}\n")
  endif()
  if(NOT before STREQUAL after)
    string(APPEND problems "  the output directory changed (partial output)\n"
                           "  ---- before ----\n${before}  ---- after ----\n${after}")
  endif()

  if(problems STREQUAL "")
    message(STATUS "ok   ${spec}")
    file(REMOVE_RECURSE "${out_dir}")
  else()
    message("FAIL ${spec}\n${problems}")
    list(APPEND failed "${spec}")
  endif()
endforeach()

if(checked EQUAL 0)
  message(FATAL_ERROR "run.cmake: no spec named ${ONLY}")
endif()
list(LENGTH failed nfailed)
if(nfailed GREATER 0)
  string(REPLACE ";" " " failed "${failed}")
  message(FATAL_ERROR "diagnostics: ${nfailed} of ${checked} failed: ${failed}\n"
                      "If the new messages are intended, run tools/update_goldens.sh and review the diff.")
endif()
message(STATUS "diagnostics: all ${checked} passed")
