# What makes a cold build short, per target:
# - Precompiled headers: nlohmann-json and the standard library in every C++ translation unit of a
#   target, and the extra headers given (CLI11, RapidCheck) to the targets whose sources include them.
#   Parsing those headers once per target instead of once per file: CLI11 alone costs about 7.6 s a
#   file, nlohmann-json 2.6 s. A file with flags of its own (-mavx2, -O3) sets SKIP_PRECOMPILE_HEADERS.
#   DPCHECK_PCH=OFF compiles without them.
# - Unity builds (DPCHECK_UNITY): a multi-file target's sources compiled eight to a translation unit.
#   Most of a file's time is code generation for the inline functions of the headers it uses (CLI11's
#   App and Option, nlohmann-json, std::function), made again in every file that uses them: the 14
#   files of the command took 242 s of CPU time one by one and 73 s in two units. Files with their own
#   flags or definitions are compiled alone (CMake leaves them out of the units). A unit is a set of .cpp
#   files seen as one, so two of them may not define the same name in an anonymous namespace.
# - Tests: every test executable is one file that includes GoogleTest and, most of them, RapidCheck,
#   nlohmann-json and Eigen (through the engine's header). The first target given to
#   dpcheck_precompile_test (tests/CMakeLists.txt's dpcheck_test_pch, whose flags every test program
#   has) precompiles those headers, and every test reuses its precompiled header (REUSE_FROM) instead of
#   parsing them again: the compile flags are the same, and no test defines a macro those headers read.
option(DPCHECK_PCH "Precompile the heavy third-party headers of each target" ON)
option(DPCHECK_UNITY "Compile each multi-file library and the command as unity builds" ON)

function(dpcheck_precompile target)
  if(DPCHECK_UNITY)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  endif()
  dpcheck_precompile_headers(${target} ${ARGN})
endfunction()

# The same for a library whose headers and flags are `owner`'s: its precompiled headers are owner's.
function(dpcheck_precompile_like target owner)
  if(DPCHECK_UNITY)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  endif()
  if(DPCHECK_PCH)
    target_precompile_headers(${target} REUSE_FROM ${owner})
  endif()
endfunction()

function(dpcheck_precompile_test target)
  if(NOT DPCHECK_PCH)
    return()
  endif()
  get_property(owner GLOBAL PROPERTY DPCHECK_TEST_PCH_OWNER)
  if(owner)
    target_precompile_headers(${target} REUSE_FROM ${owner})
  else()
    dpcheck_precompile_headers(${target} <gtest/gtest.h> <rapidcheck.h> <rapidcheck/gtest.h> <Eigen/Core>)
    set_property(GLOBAL PROPERTY DPCHECK_TEST_PCH_OWNER ${target})
  endif()
endfunction()

function(dpcheck_precompile_headers target)
  if(NOT DPCHECK_PCH)
    return()
  endif()
  target_precompile_headers(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:<nlohmann/json.hpp$<ANGLE-R>>"
    "$<$<COMPILE_LANGUAGE:CXX>:<algorithm$<ANGLE-R>>"
    "$<$<COMPILE_LANGUAGE:CXX>:<filesystem$<ANGLE-R>>"
    "$<$<COMPILE_LANGUAGE:CXX>:<functional$<ANGLE-R>>"
    "$<$<COMPILE_LANGUAGE:CXX>:<map$<ANGLE-R>>"
    "$<$<COMPILE_LANGUAGE:CXX>:<memory$<ANGLE-R>>"
    "$<$<COMPILE_LANGUAGE:CXX>:<string$<ANGLE-R>>"
    "$<$<COMPILE_LANGUAGE:CXX>:<vector$<ANGLE-R>>")
  foreach(header IN LISTS ARGN)
    string(REGEX REPLACE "^<(.*)>$" "\\1" bare "${header}")
    target_precompile_headers(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:<${bare}$<ANGLE-R>>")
  endforeach()
endfunction()
