# The project's warnings, cohort_library(), cohort_folder_library() and
# cohort_binary(), shared by the main build and the fuzz build
# (fuzz/CMakeLists.txt), so that a folder's CMakeLists.txt declares its
# libraries once for both. COHORT_ROOT is the repository root.
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

# cohort_folder_library(NAME FOLDER DEPS ...): a library of every .cc in FOLDER
# except main.cc; defines nothing while the folder has no sources yet.
function(cohort_folder_library name folder)
  cmake_parse_arguments(ARG "" "" "DEPS" ${ARGN})
  file(GLOB sources CONFIGURE_DEPENDS ${folder}/*.cc)
  list(FILTER sources EXCLUDE REGEX "/main\\.cc$")
  if(sources)
    cohort_library(${name} SOURCES ${sources} DEPS ${ARG_DEPS})
  endif()
endfunction()

function(cohort_binary name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE ${COHORT_WARNINGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
endfunction()
