#!/usr/bin/env bash
# pagoda-up's tensor-parallel flags: --tensor-parallel N --devices LIST --tp-mode are checked (a
# count that matches, distinct devices, --devices only with --backend cuda, a GPU group's pools
# sized alike by --kv-blocks or --kv-bytes, --tp-mode only on the CPU); nothing is started. With
# BINDIR, pagoda-supervisor --check-args refuses the same (and --backend null ranks).
# (Serving: tests/integration/test_tp_cpu.sh, threads; test_tp_proc_group.sh, processes.)
# Usage: tests/integration/test_pagoda_up_tp.sh [BINDIR]
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

refused "needs --kv-blocks N or --kv-bytes B (every rank's pool the same size)" \
    --backend cuda --tensor-parallel 2 --devices 0,1
refused "--tp-mode needs --backend cpu" --backend cuda --tp-mode thread
refused "--tp-mode bogus: expected process or thread" --tp-mode bogus
refused "--devices 0 names 1 device(s), --tensor-parallel is 2" \
    --backend cuda --tensor-parallel 2 --devices 0
refused "--devices 1,1 names a device twice" --backend cuda --tensor-parallel 2 --devices 1,1
refused "--tensor-parallel 2 needs --devices" --backend cuda --tensor-parallel 2
refused "--devices needs --backend cuda" --devices 0
refused "--tensor-parallel: a number of GPUs" --tensor-parallel 0
refused "--device and --devices exclude each other" --backend cuda --device 0 --devices 1

# The supervisor's own checks (pagoda-up passes --tensor-parallel and --devices on).
if [ -n "${1:-}" ]; then
    sup=$1/pagoda-supervisor
    # sup_refused NEEDLE ARGS...: --check-args exits 2 with NEEDLE.
    sup_refused() {
        local needle=$1 rc=0
        shift
        "$sup" --check-args --run-dir "$tmp/run" --bin-dir "$tmp" --model "$tmp" "$@" \
            >"$tmp/out" 2>"$tmp/err" || rc=$?
        check "pagoda-supervisor $* is refused (exit $rc)" test "$rc" = 2
        check "  saying \"$needle\"" grep -qF -- "$needle" "$tmp/err"
    }
    sup_refused "give every rank's pool the same size" \
        --backend cuda --tensor-parallel 2 --devices 0,1
    sup_refused "--devices names 1 device(s), --tensor-parallel is 2" \
        --backend cuda --tensor-parallel 2 --devices 0 --kv-blocks 64
    sup_refused "--devices 0,0 names a device twice" --backend cuda --tensor-parallel 2 \
        --devices 0,0
    sup_refused "--devices needs --backend cuda" --tensor-parallel 2 --devices 0,1
    sup_refused "needs --backend cpu or cuda" --backend null --tensor-parallel 2
    sup_refused "needs --devices" --backend cuda --tensor-parallel 2 --kv-blocks 64
    # One rank: --devices would be dropped (only ranks get a device from it), leaving GPU 0.
    sup_refused "--devices 3 with --tensor-parallel 1: give one GPU with --kvpool-arg --device" \
        --backend cuda --devices 3 --kv-blocks 64
    rc=0
    "$sup" --check-args --run-dir "$tmp/run" --bin-dir "$tmp" --model "$tmp" --tensor-parallel 2 \
        >/dev/null 2>&1 || rc=$?
    check "pagoda-supervisor --tensor-parallel 2 (cpu) is accepted (exit $rc)" test "$rc" = 0

    # A rank's own flags: pagoda-worker's go together; pagoda-kvpool refuses a size the model's
    # heads cannot be split by (pagoda-brown: 4 heads, 2 KV heads), naming the field, creating
    # nothing.
    worker_refused() {
        local needle=$1 rc=0
        shift
        "$1/pagoda-worker" --run-dir "$tmp" --model "$root/assets/pagoda-brown" --worker-id 0 \
            "${@:2}" >"$tmp/out" 2>"$tmp/err" || rc=$?
        check "pagoda-worker ${*:2} is refused (exit $rc)" test "$rc" = 2
        check "  saying \"$needle\"" grep -qF -- "$needle" "$tmp/err"
    }
    worker_refused "--tp-rank, --tp-size and --tp-group go together" "$1" --tp-rank 1 --tp-size 2
    worker_refused "the ranks of --tp-size 2 are 0 to 1" "$1" --tp-rank 2 --tp-size 2 \
        --tp-group "$tmp/g"
    worker_refused "exclude each other" "$1" --tp-rank 0 --tp-size 2 --tp-group "$tmp/g" \
        --tensor-parallel 2
    worker_refused "--tp-size needs --backend cpu or cuda" "$1" --tp-rank 0 --tp-size 2 \
        --tp-group "$tmp/g" --backend null
    mkdir -m 0700 "$tmp/kv"
    rc=0
    timeout 30 "$1/pagoda-kvpool" --run-dir "$tmp/kv" --model "$root/assets/pagoda-brown" \
        --kv-blocks 16 --tp-rank 1 --tp-size 3 >"$tmp/out" 2>"$tmp/err" || rc=$?
    check "pagoda-kvpool --tp-size 3 (4 heads) fails (exit $rc)" test "$rc" = 1
    check "  naming the field" grep -q "does not divide the model.s num_attention_heads (4)" "$tmp/err"
    check "  creating no socket" test -z "$(ls "$tmp/kv")"
fi
check_summary
