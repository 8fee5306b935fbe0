# Precompiled headers: nlohmann-json and the standard library in every C++ translation unit of a target,
# and the extra headers given (CLI11, RapidCheck) to the targets whose sources include them. Parsing
# those headers once per target instead of once per file shortens a cold build: CLI11 alone costs
# about 7.6 s a file, nlohmann-json 2.6 s. A file with flags of its own (-mavx2, -O3) sets
# SKIP_PRECOMPILE_HEADERS. DPCHECK_PCH=OFF compiles without them, as the sanitizer and fuzz presets do.
option(DPCHECK_PCH "Precompile the heavy third-party headers of each target" ON)

function(dpcheck_precompile target)
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
