#!/usr/bin/env bash
# sanitize_kernels.sh PROGRAM TEST_EXE: the sanitizer build's split of kernels/cpu
# (pagoda_uninstrumented_kernels, cmake/PagodaTest.cmake): PROGRAM's cpu_linear and
# attention_run_partial carry no ASan checks (the integration tests' model runs at full speed),
# and TEST_EXE's do (the kernels' tests still catch an out-of-bounds access in those loops).
set -euo pipefail
program=${1:?usage: sanitize_kernels.sh PROGRAM TEST_EXE}
test_exe=${2:?usage: sanitize_kernels.sh PROGRAM TEST_EXE}
failed=0
# asan_checks BINARY FUNCTION: how many ASan reports FUNCTION's code can call.
asan_checks() {
    objdump -d --no-show-raw-insn "$1" |
        awk -v f="<$2>:" '$2 == f { on = 1; next } on && /^$/ { exit } on' | grep -c '__asan_report' || true
}
for f in cpu_linear attention_run_partial; do
    n=$(asan_checks "$program" "$f")
    if [ "$n" = 0 ]; then echo "ok   $(basename "$program"): $f uninstrumented"; else
        echo "FAIL $(basename "$program"): $f has $n ASan checks"; failed=1; fi
    n=$(asan_checks "$test_exe" "$f")
    if [ "$n" -gt 0 ]; then echo "ok   $(basename "$test_exe"): $f instrumented ($n checks)"; else
        echo "FAIL $(basename "$test_exe"): $f has no ASan checks"; failed=1; fi
done
exit "$failed"
