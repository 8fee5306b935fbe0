# Warning flags shared by every dpcheck target; DPCHECK_WERROR turns them into errors (CI sets it).
function(dpcheck_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor>)
  if(DPCHECK_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
    # GCC 12 at -O3 reports -Wrestrict on std::string's operator+("literal", std::string&&) inside
    # libstdc++ itself (GCC bug 105329, fixed in GCC 13): a warning, not an error, until then. Wherever
    # it inlines deeply -- at -O3 (the gpu preset's Release build), and in a unity build's units at -O2 --
    # it also reports -Warray-bounds and -Wstringop-overflow inside libstdc++ on accesses that are in
    # bounds (a std::vector<float> assigned from a copy, a json compared with a string literal, a
    # std::pair of strings moved into a vector), so those stay warnings there too.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
      target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-error=restrict>
                             $<$<COMPILE_LANGUAGE:CXX>:-Wno-error=array-bounds -Wno-error=stringop-overflow>)
    endif()
  endif()
endfunction()
