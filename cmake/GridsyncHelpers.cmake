# Shared compile settings, applied per target (never through CMAKE_CXX_FLAGS).
add_library(gridsync_options INTERFACE)
target_compile_options(gridsync_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wno-psabi>
  # Nothing reads errno after a math call; with it set, sqrtf cannot be
  # vectorised (cpu/adam_batch.h). Results are unchanged: same instructions.
  $<$<COMPILE_LANGUAGE:CXX>:-fno-math-errno>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${GRIDSYNC_WERROR}>>:-Werror>)
if(GRIDSYNC_CPU_ARCH)
  target_compile_options(gridsync_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=${GRIDSYNC_CPU_ARCH}>)
endif()
if(GRIDSYNC_SANITIZE)
  target_compile_options(gridsync_options INTERFACE -fsanitize=address,undefined -fno-omit-frame-pointer)
  target_link_options(gridsync_options INTERFACE -fsanitize=address,undefined)
endif()
if(GRIDSYNC_FUZZ)
  # Coverage for libFuzzer in everything the targets call; undefined
  # behaviour aborts, so the fuzzer reports it as a crash.
  target_compile_options(gridsync_options INTERFACE -fsanitize=fuzzer-no-link
                         -fno-sanitize-recover=undefined)
  target_link_options(gridsync_options INTERFACE -fno-sanitize-recover=undefined)
endif()

# gridsync_add_test(NAME SOURCES... [LIBS ...] [LABELS ...])
function(gridsync_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE gridsync_options GTest::gtest GTest::gtest_main ${ARG_LIBS})
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    ENVIRONMENT "GRIDSYNC_BUILD_DIR=${PROJECT_BINARY_DIR}"
    TIMEOUT 600)
  if(ARG_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}")
  endif()
endfunction()
