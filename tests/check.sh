# Counting checks for the test scripts (source it): check NAME COMMAND... runs the command and
# prints "ok   NAME" or "FAIL NAME", counting both; check_summary prints "N passed, M failed"
# (the line tests/gpu/run collects) and succeeds when nothing failed.
passed=0
failed=0

check() { # check NAME COMMAND...
    local name=$1
    shift
    if "$@"; then
        passed=$((passed + 1))
        echo "ok   $name"
    else
        failed=$((failed + 1))
        echo "FAIL $name"
    fi
}

check_summary() {
    echo "$passed passed, $failed failed"
    [ "$failed" = 0 ]
}
