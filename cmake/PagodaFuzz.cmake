# The libFuzzer build (PAGODA_FUZZ=ON, tests/fuzz/): every C file is compiled with clang's
# coverage instrumentation for libFuzzer plus AddressSanitizer and UndefinedBehaviorSanitizer;
# only the fuzz targets link libFuzzer's main. A configuration of its own (build-fuzz), with
# CUDA off, so that the normal and the ASan builds are unchanged:
#
#   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DPAGODA_FUZZ=ON -DPAGODA_CUDA=OFF
#   cmake --build build-fuzz --target pagoda_fuzzers
if(NOT PAGODA_FUZZ)
  return()
endif()
if(NOT CMAKE_C_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "PAGODA_FUZZ=ON needs clang (-DCMAKE_C_COMPILER=clang), not ${CMAKE_C_COMPILER_ID}")
endif()
if(PAGODA_SANITIZE)
  message(FATAL_ERROR "PAGODA_FUZZ=ON brings its own sanitizers: leave PAGODA_SANITIZE off")
endif()
add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
                    -fno-sanitize-recover=undefined)
add_link_options(-fsanitize=address,undefined)
# Clang, unlike GCC, warns about the unused static inline functions that a macro such as
# common/list.h's PAGODA_LIST_DEFINE expands into a .c file.
add_compile_options(-Wno-unused-function)

# Every fuzz target; `cmake --build build-fuzz --target pagoda_fuzzers` builds them all and
# nothing else.
add_custom_target(pagoda_fuzzers)

# pagoda_add_fuzzer(NAME SOURCES src... [LIBS lib...]): a libFuzzer target, in build-fuzz/fuzz/.
function(pagoda_add_fuzzer name)
  cmake_parse_arguments(F "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${F_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PRIVATE ${F_LIBS})
  target_link_options(${name} PRIVATE -fsanitize=fuzzer)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/fuzz)
  add_dependencies(pagoda_fuzzers ${name})
endfunction()
