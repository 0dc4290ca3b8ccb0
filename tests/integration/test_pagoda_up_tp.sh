#!/usr/bin/env bash
# pagoda-up's tensor-parallel flags: --tensor-parallel N --devices LIST are checked (a count
# that matches, distinct devices, --devices only with --backend cuda), and N above 1 with
# --backend cuda is refused at once, saying GPU groups are not wired yet; nothing is started.
# (--backend cpu --tensor-parallel 2 serving: tests/integration/test_tp_cpu.sh.)
# Usage: tests/integration/test_pagoda_up_tp.sh
set -euo pipefail
# shellcheck source=tests/check.sh
. "$(dirname "$0")/../check.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
up=$root/deploy/pagoda-up
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# refused NEEDLE ARGS...: pagoda-up exits 2 with NEEDLE on stderr, leaving the run dir alone.
refused() {
    local needle=$1 rc=0
    shift
    "$up" --run-dir "$tmp/run" --bin-dir "$tmp/no-bin" "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
    check "pagoda-up $* is refused (exit $rc)" test "$rc" = 2
    check "  saying \"$needle\"" grep -qF -- "$needle" "$tmp/err"
    check "  starting nothing" test ! -e "$tmp/run"
}

refused "pagoda-worker does not run GPU tensor-parallel groups yet" \
    --backend cuda --tensor-parallel 2 --devices 0,1
refused "--devices 0 names 1 device(s), --tensor-parallel is 2" \
    --backend cuda --tensor-parallel 2 --devices 0
refused "--devices 1,1 names a device twice" --backend cuda --tensor-parallel 2 --devices 1,1
refused "--tensor-parallel 2 needs --devices" --backend cuda --tensor-parallel 2
refused "--devices needs --backend cuda" --devices 0
refused "--tensor-parallel: a number of GPUs" --tensor-parallel 0
refused "--device and --devices exclude each other" --backend cuda --device 0 --devices 1
check_summary
