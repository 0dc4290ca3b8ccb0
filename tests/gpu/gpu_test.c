/* The check counts of a GPU test program, one pair whatever the number of its source files
 * (tests/gpu/gpu_test.h; pagoda_add_gpu_test links this file into every GPU test). */
#include "tests/gpu/gpu_test.h"

int gpu_test_passed, gpu_test_failed;
