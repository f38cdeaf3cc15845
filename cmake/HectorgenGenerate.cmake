# hectorgen_generate(): compile a hectorgen model spec at build time and get a CUDA library target.
#
#   hectorgen_generate(<target>
#     SPEC <file>                      # model spec (.yaml/.yml/.json); relative: to CMAKE_CURRENT_SOURCE_DIR
#     [OUTPUT_DIR <dir>]               # default ${CMAKE_CURRENT_BINARY_DIR}/hectorgen/<target>;
#                                      #   relative: to CMAKE_CURRENT_BINARY_DIR
#     [MODEL <name>]                   # the spec's `model:`; default the spec's file stem
#     [OPTIONS <arg>...]               # extra hectorgen arguments, e.g. -v
#     [HECTORGEN_EXECUTABLE <path>]    # the compiler to run (see "Which hectorgen" below)
#     [NO_RUNTIME])                    # do not look for the hectorgen runtime (see "The runtime" below)
#
# At build time this runs `hectorgen <SPEC> -o <OUTPUT_DIR> <OPTIONS...>`, which writes the fixed set of files
# described in docs/generated_api.md:
#   <model>_kernels.cu  <model>_kernels.h  <model>_host.cpp  <model>.py  CMakeLists.txt  manifest.json
#   <model>.inter.ir  <model>.backward.inter.ir  <model>.intra.ir
# and defines
#   <target>            STATIC library: <model>_kernels.cu compiled as CUDA (torch-free), with OUTPUT_DIR as a
#                       PUBLIC include directory (for <model>_kernels.h) and the CUDA headers for C++ users; it
#                       links hectorgen::runtime PUBLIC (graph preprocessing, hectorgen/graph.h, for the arrays
#                       the kernels read).
#   <target>_generate   custom target that only runs hectorgen (for users of <model>.py / <model>_host.cpp).
# Properties set on <target>:
#   HECTORGEN_OUTPUT_DIR     absolute OUTPUT_DIR
#   HECTORGEN_PYTHON_MODULE  absolute path of <model>.py
#   HECTORGEN_MODEL, HECTORGEN_SPEC
#
# The caller must have enabled CUDA (project(... LANGUAGES CXX CUDA) or enable_language(CUDA)); the library
# follows CMAKE_CUDA_ARCHITECTURES.
#
# Example:
#   find_package(hectorgen REQUIRED)      # installed hectorgen; or include(HectorgenGenerate) in its own build
#   hectorgen_generate(rgcn_kernels SPEC specs/rgcn.yaml)
#   target_link_libraries(app PRIVATE rgcn_kernels)           # app.cpp: #include "rgcn_kernels.h"
#   get_target_property(py rgcn_kernels HECTORGEN_PYTHON_MODULE)
#
# Which hectorgen: the HECTORGEN_EXECUTABLE argument; else the HECTORGEN_EXECUTABLE variable; else the
# `hectorgen` target of this build (inside the hectorgen repository); else the imported `hectorgen::hectorgen`
# (from find_package(hectorgen)); else `hectorgen` on PATH (cached as HECTORGEN_PROGRAM). The tool is a
# dependency: rebuilding it regenerates.
#
# The runtime: the hectorgen::runtime target when it exists (add_subdirectory(<hectorgen>/runtime) before this call),
# else find_package(hectorgen_runtime <HECTORGEN_RUNTIME_REQUIRED_VERSION> CONFIG), searched in CMAKE_PREFIX_PATH,
# hectorgen_runtime_DIR and the prefix hectorgen was installed to. HECTORGEN_RUNTIME_REQUIRED_VERSION (MAJOR.MINOR,
# the runtime version that generated code is written for) comes from find_package(hectorgen), or inside the
# hectorgen repository from runtime/include/hectorgen/runtime_version.h. The generated CMakeLists.txt (the Python
# extension) finds the runtime the same way. NO_RUNTIME skips all this (the kernels themselves need no runtime code).
#
# Incremental builds: the command's only OUTPUT is a stamp file (<target>.hectorgen-stamp in the current binary
# dir); the generated files are BYPRODUCTS. hectorgen rewrites a file only when its content changed, so editing
# the spec (or rebuilding hectorgen) reruns hectorgen but recompiles only what actually changed, and a build with
# nothing changed runs nothing. With Ninja a deleted generated file is regenerated; with Makefile generators
# delete the stamp to force that. OUTPUT_DIR belongs to the build (`clean` deletes the generated files), so do not
# point it at committed sources.

include_guard(GLOBAL)
if(CMAKE_VERSION VERSION_LESS 3.20)
  message(FATAL_ERROR "HectorgenGenerate.cmake needs CMake 3.20 or newer (cmake_path)")
endif()

# The runtime version generated code needs (MAJOR.MINOR): set by hectorgenConfig.cmake for an installed hectorgen,
# read from the runtime's version header inside the hectorgen repository.
if(NOT DEFINED HECTORGEN_RUNTIME_REQUIRED_VERSION)
  set(_hectorgen_runtime_header "${CMAKE_CURRENT_LIST_DIR}/../runtime/include/hectorgen/runtime_version.h")
  if(EXISTS "${_hectorgen_runtime_header}")
    file(STRINGS "${_hectorgen_runtime_header}" _hectorgen_runtime_version
         REGEX "^#define HECTORGEN_RUNTIME_VERSION_STRING ")
    if(_hectorgen_runtime_version MATCHES "\"([0-9]+)\\.([0-9]+)\\.[0-9]+\"")
      set(HECTORGEN_RUNTIME_REQUIRED_VERSION "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
    endif()
    unset(_hectorgen_runtime_version)
  endif()
  unset(_hectorgen_runtime_header)
endif()

# Makes hectorgen::runtime available in the caller's directory: the existing target or the installed package.
function(_hectorgen_require_runtime target)
  if(TARGET hectorgen::runtime)
    return()
  endif()
  set(hints)
  if(_HECTORGEN_INSTALL_PREFIX)
    list(APPEND hints "${_HECTORGEN_INSTALL_PREFIX}")
  endif()
  find_package(hectorgen_runtime ${HECTORGEN_RUNTIME_REQUIRED_VERSION} CONFIG QUIET HINTS ${hints})
  if(NOT hectorgen_runtime_FOUND OR NOT TARGET hectorgen::runtime)
    set(found "")
    if(hectorgen_runtime_CONSIDERED_VERSIONS)
      list(JOIN hectorgen_runtime_CONSIDERED_VERSIONS ", " versions)
      list(JOIN hectorgen_runtime_CONSIDERED_CONFIGS ", " configs)
      set(found " (found only version(s) ${versions}: ${configs})")
    endif()
    message(FATAL_ERROR "hectorgen_generate(${target}): the hectorgen runtime ${HECTORGEN_RUNTIME_REQUIRED_VERSION} "
                        "(any later version of the same major version will do) was not found${found}: "
                        "add_subdirectory(<hectorgen>/runtime) first, or install it (runtime/README.md) and add its "
                        "prefix to CMAKE_PREFIX_PATH (or set hectorgen_runtime_DIR); NO_RUNTIME skips it")
  endif()
endfunction()

function(_hectorgen_resolve_tool explicit out_command out_depends)
  if(explicit)
    set(exe "${explicit}")
  elseif(HECTORGEN_EXECUTABLE)
    set(exe "${HECTORGEN_EXECUTABLE}")
  elseif(TARGET hectorgen)
    get_target_property(imported hectorgen IMPORTED)
    set(${out_command} "$<TARGET_FILE:hectorgen>" PARENT_SCOPE)
    if(imported)
      set(${out_depends} "$<TARGET_FILE:hectorgen>" PARENT_SCOPE)
    else()
      set(${out_depends} hectorgen PARENT_SCOPE)  # target- and file-level dependency on the built tool
    endif()
    return()
  elseif(TARGET hectorgen::hectorgen)
    set(${out_command} "$<TARGET_FILE:hectorgen::hectorgen>" PARENT_SCOPE)
    set(${out_depends} "$<TARGET_FILE:hectorgen::hectorgen>" PARENT_SCOPE)
    return()
  else()
    find_program(HECTORGEN_PROGRAM hectorgen DOC "hectorgen compiler used by hectorgen_generate()")
    if(NOT HECTORGEN_PROGRAM)
      message(FATAL_ERROR "hectorgen_generate: no hectorgen found: use find_package(hectorgen), "
                          "set HECTORGEN_EXECUTABLE, or put hectorgen on PATH")
    endif()
    set(exe "${HECTORGEN_PROGRAM}")
  endif()
  if(TARGET "${exe}")
    set(${out_command} "$<TARGET_FILE:${exe}>" PARENT_SCOPE)
    set(${out_depends} "$<TARGET_FILE:${exe}>" PARENT_SCOPE)
    return()
  endif()
  if(NOT exe MATCHES "^\\$<")  # a generator expression is taken as is
    cmake_path(ABSOLUTE_PATH exe BASE_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}" NORMALIZE)
    if(NOT EXISTS "${exe}")
      message(FATAL_ERROR "hectorgen_generate: hectorgen executable '${exe}' does not exist")
    endif()
  endif()
  set(${out_command} "${exe}" PARENT_SCOPE)
  set(${out_depends} "${exe}" PARENT_SCOPE)
endfunction()

function(hectorgen_generate target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "NO_RUNTIME" "SPEC;OUTPUT_DIR;MODEL;HECTORGEN_EXECUTABLE" "OPTIONS")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "hectorgen_generate(${target}): unknown arguments: ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT arg_SPEC)
    message(FATAL_ERROR "hectorgen_generate(${target}): SPEC <file> is required")
  endif()
  if(TARGET "${target}")
    message(FATAL_ERROR "hectorgen_generate(${target}): a target named '${target}' already exists")
  endif()
  get_property(languages GLOBAL PROPERTY ENABLED_LANGUAGES)
  if(NOT "CUDA" IN_LIST languages)
    message(FATAL_ERROR "hectorgen_generate(${target}): enable CUDA first "
                        "(project(... LANGUAGES CXX CUDA) or enable_language(CUDA))")
  endif()

  # The spec, as hectorgen sees it: relative paths stay relative to CMAKE_CURRENT_SOURCE_DIR (the command's
  # working directory) so the generated banners and diagnostics name it the way the caller wrote it.
  set(spec_arg "${arg_SPEC}")
  cmake_path(ABSOLUTE_PATH arg_SPEC BASE_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}" NORMALIZE OUTPUT_VARIABLE spec)
  get_source_file_property(spec_generated "${spec}" GENERATED)
  if(NOT EXISTS "${spec}" AND NOT spec_generated)
    message(FATAL_ERROR "hectorgen_generate(${target}): SPEC '${spec}' does not exist")
  endif()

  if(arg_MODEL)
    set(model "${arg_MODEL}")
  else()
    cmake_path(GET spec STEM model)
  endif()
  if(NOT model MATCHES "^[A-Za-z_][A-Za-z0-9_]*$")
    message(FATAL_ERROR "hectorgen_generate(${target}): model name '${model}' is not an identifier; pass MODEL")
  endif()
  # Output names follow the spec's `model:`; catch a mismatch now rather than as a missing file at build time.
  if(EXISTS "${spec}")
    file(STRINGS "${spec}" model_lines REGEX "^[ \t{]*\"?model\"?[ \t]*:" LIMIT_COUNT 1)
    if(model_lines MATCHES "model\"?[ \t]*:[ \t]*[\"']?([A-Za-z_][A-Za-z0-9_]*)" AND
       NOT CMAKE_MATCH_1 STREQUAL model)
      message(FATAL_ERROR "hectorgen_generate(${target}): '${spec}' declares model '${CMAKE_MATCH_1}' but "
                          "the outputs are expected for '${model}'; pass MODEL ${CMAKE_MATCH_1}")
    endif()
  endif()

  if(arg_OUTPUT_DIR)
    cmake_path(ABSOLUTE_PATH arg_OUTPUT_DIR BASE_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}" NORMALIZE
               OUTPUT_VARIABLE out)
  else()
    set(out "${CMAKE_CURRENT_BINARY_DIR}/hectorgen/${target}")
  endif()
  string(REGEX REPLACE "/+$" "" out "${out}")
  get_property(claimed GLOBAL PROPERTY _HECTORGEN_OUTPUT_DIR_OWNER_${out})
  if(claimed)
    message(FATAL_ERROR "hectorgen_generate(${target}): OUTPUT_DIR '${out}' is already used by '${claimed}'")
  endif()
  set_property(GLOBAL PROPERTY _HECTORGEN_OUTPUT_DIR_OWNER_${out} "${target}")

  _hectorgen_resolve_tool("${arg_HECTORGEN_EXECUTABLE}" tool_command tool_depends)
  if(NOT arg_NO_RUNTIME)
    _hectorgen_require_runtime(${target})
  endif()

  set(cu "${out}/${model}_kernels.cu")
  set(h "${out}/${model}_kernels.h")
  set(generated
    "${cu}" "${h}" "${out}/${model}_host.cpp" "${out}/${model}.py" "${out}/CMakeLists.txt"
    "${out}/manifest.json" "${out}/${model}.inter.ir" "${out}/${model}.backward.inter.ir"
    "${out}/${model}.intra.ir")
  set(stamp "${CMAKE_CURRENT_BINARY_DIR}/${target}.hectorgen-stamp")

  add_custom_command(
    OUTPUT "${stamp}"
    BYPRODUCTS ${generated}
    COMMAND ${tool_command} "${spec_arg}" -o "${out}" ${arg_OPTIONS}
    COMMAND "${CMAKE_COMMAND}" -E touch "${stamp}"
    DEPENDS "${spec}" ${tool_depends}
    WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}"
    COMMENT "hectorgen: generating ${model} from ${arg_SPEC}"
    VERBATIM)
  # One owner for the command (a custom command listed by two targets may run twice in parallel with Makefiles).
  add_custom_target(${target}_generate DEPENDS "${stamp}")

  add_library(${target} STATIC "${cu}" "${h}")
  add_dependencies(${target} ${target}_generate)
  set_source_files_properties("${cu}" "${h}" PROPERTIES GENERATED TRUE)
  target_include_directories(${target} PUBLIC "${out}")
  # <model>_kernels.h declares launchers taking cudaStream_t: C++ users need the CUDA headers.
  target_include_directories(${target} SYSTEM PUBLIC ${CMAKE_CUDA_TOOLKIT_INCLUDE_DIRECTORIES})
  if(NOT arg_NO_RUNTIME)
    target_link_libraries(${target} PUBLIC hectorgen::runtime)
  endif()
  set_target_properties(${target} PROPERTIES
    CUDA_STANDARD 17
    CUDA_STANDARD_REQUIRED ON
    POSITION_INDEPENDENT_CODE ON  # so it can go into a shared library (the torch extension)
    HECTORGEN_OUTPUT_DIR "${out}"
    HECTORGEN_PYTHON_MODULE "${out}/${model}.py"
    HECTORGEN_MODEL "${model}"
    HECTORGEN_SPEC "${spec}")
endfunction()
