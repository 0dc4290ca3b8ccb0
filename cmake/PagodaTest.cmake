# pagoda_add_test(NAME SOURCES src... [LIBS lib...] [TIMEOUT seconds] [LABELS label...])
# Builds one CMocka test executable from tests/ and registers it in CTest with a timeout
# (30 seconds unless given), so that a hung test fails instead of stalling CI. The timeout is
# also the test's COST: without timings of an earlier run (a fresh clone, as in CI), ctest -jN
# starts the tests given long limits first instead of leaving one of them alone at the end.
function(pagoda_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 30)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_include_directories(${name} PRIVATE ${CMOCKA_INCLUDE_DIR} ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PRIVATE ${T_LIBS} ${CMOCKA_LIBRARIES})
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} COST ${T_TIMEOUT}
                       ENVIRONMENT "PAGODA_SOURCE_DIR=${PROJECT_SOURCE_DIR};PAGODA_BINARY_DIR=${PROJECT_BINARY_DIR}")
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()

# pagoda_add_script_test(NAME COMMAND cmd... [TIMEOUT seconds]): a test that runs a command
# (a shell script driving the built binaries), with the same environment, timeout and cost rule.
function(pagoda_add_script_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "COMMAND" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 60)
  endif()
  add_test(NAME ${name} COMMAND ${T_COMMAND})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} COST ${T_TIMEOUT}
                       ENVIRONMENT "PAGODA_SOURCE_DIR=${PROJECT_SOURCE_DIR};PAGODA_BINARY_DIR=${PROJECT_BINARY_DIR}")
endfunction()

# pagoda_add_gpu_test(NAME SOURCES src... [LIBS lib...] [TIMEOUT seconds]): a test that needs a
# CUDA device. Built only with the CUDA backend; registered with the label "gpu". Without a
# device it prints why and exits 77, which CTest reports as skipped (CI has no GPU; these tests
# run on the GPU machine through tests/gpu/run).
function(pagoda_add_gpu_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS" ${ARGN})
  if(NOT PAGODA_HAVE_CUDA)
    return()
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  # Plain C test programs (no CMocka), so that the binary runs on the GPU machine, where only
  # the CUDA toolkit is installed.
  add_executable(${name} ${T_SOURCES} ${PROJECT_SOURCE_DIR}/tests/gpu/gpu_test.c)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PRIVATE ${T_LIBS})
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS gpu SKIP_RETURN_CODE 77
                       ENVIRONMENT "PAGODA_SOURCE_DIR=${PROJECT_SOURCE_DIR};PAGODA_BINARY_DIR=${PROJECT_BINARY_DIR}")
endfunction()

# pagoda_add_program(NAME SOURCES src... LIBS lib...): a program of pagoda's, in build/bin.
function(pagoda_add_program name)
  cmake_parse_arguments(P "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${P_SOURCES})
  target_link_libraries(${name} PRIVATE ${P_LIBS})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
endfunction()

# pagoda_uninstrumented_kernels(target...): in the sanitizer build, links these programs with
# kernels/cpu's hot loops (ops.c, attention.c) compiled without instrumentation (the object
# library pagoda_kernels_cpu_fast). The objects come first on the link line, so the
# instrumented copies in pagoda_kernels_cpu are never pulled in; the rest of each program stays
# instrumented. Under ASan those loops run about 12 times slower and are nearly all of an
# integration test's CPU time; the kernels' own tests (tests/unit/test_ops.c, test_attention.c)
# and every other test executable keep the instrumented kernels. No-op in other builds.
function(pagoda_uninstrumented_kernels)
  if(NOT PAGODA_SANITIZE)
    return()
  endif()
  foreach(t ${ARGN})
    target_sources(${t} PRIVATE $<TARGET_OBJECTS:pagoda_kernels_cpu_fast>)
  endforeach()
endfunction()
