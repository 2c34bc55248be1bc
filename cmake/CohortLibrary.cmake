# The project's warnings and cohort_library(), shared by the main build and
# the fuzz build (fuzz/CMakeLists.txt). COHORT_ROOT is the repository root.
set(COHORT_WARNINGS -Wall -Wextra -Wno-unused-parameter)
if(COHORT_WERROR)
  list(APPEND COHORT_WARNINGS -Werror)
endif()

# cohort_library(NAME SOURCES ... DEPS ...): one library per folder, with the
# project's warnings and the repository root on the include path.
function(cohort_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${COHORT_ROOT})
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${COHORT_WARNINGS}>)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
endfunction()
