#!/usr/bin/env bash
# test_tp_cpu.sh BINDIR: pagoda-up --tensor-parallel 2 --tp-mode thread on the CPU serves the
# bundled model (pagoda-brown: 4 heads, 2 KV heads) with its two ranks as threads of the one
# worker (ranks as processes, the default: test_tp_proc_group.sh), and its
# answers are those of the same group at TP 1: greedy, and seeded sampling at temperature 0.8.
# A size the model cannot be split by (3) stops the group at start, the worker saying why.
set -euo pipefail
# shellcheck source=tests/check.sh
. "$(dirname "$0")/../check.sh"

bin_dir=$(cd "${1:?usage: test_tp_cpu.sh BINDIR}" && pwd -P)
src=${PAGODA_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd -P)}
deploy=$src/deploy
tmp=$(mktemp -d /tmp/pagoda-tp-XXXXXX)
cleanup() {
    local d
    for d in "$tmp"/run*; do
        [ ! -d "$d" ] || "$deploy/pagoda-down" --run-dir "$d" --timeout 30 >/dev/null 2>&1 || true
    done
    rm -rf -- "$tmp"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# serve NAME ARGS...: starts a group in $tmp/runNAME, asks two questions, writes the answers'
# token ids to $tmp/NAME.out, stops the group.
serve() {
    local name=$1 run=$tmp/run$1
    shift
    mkdir -m 0700 "$run"
    if ! "$deploy/pagoda-up" --run-dir "$run" --bin-dir "$bin_dir" --listen "ipc://$run/c.ipc" \
        --kv-blocks 128 --timeout 60 "$@" >/dev/null 2>"$tmp/$name.err"; then
        check "pagoda-up $* starts" false
        cat "$tmp/$name.err" >&2
        return 0
    fi
    local pagoda=("$bin_dir/pagoda" --url "ipc://$run/c.ipc")
    {
        "${pagoda[@]}" generate --tokens 5,100,200,300,400 --max-tokens 24 --timeout-ms 60000
        "${pagoda[@]}" generate --tokens 9,8,7 --max-tokens 24 --temperature 0.8 --seed 42 \
            --timeout-ms 60000
    } >"$tmp/$name.out" 2>&1 || true
    "$deploy/pagoda-down" --run-dir "$run" --timeout 30 >/dev/null 2>&1 || true
}

serve tp1
serve tp2 --tensor-parallel 2 --tp-mode thread
check "TP 1 answered twice ($(tr '\n' ' ' <"$tmp/tp1.out"))" \
    test "$(grep -c '^[0-9]' "$tmp/tp1.out")" = 2
check "TP 2 gives TP 1's tokens ($(tr '\n' ' ' <"$tmp/tp2.out"))" cmp -s "$tmp/tp1.out" "$tmp/tp2.out"
check "the worker ran two ranks" grep -q "tensor parallel, 2 ranks" "$tmp/runtp2"/worker-*.log

mkdir -m 0700 "$tmp/run3"
rc=0
"$deploy/pagoda-up" --run-dir "$tmp/run3" --bin-dir "$bin_dir" --listen "ipc://$tmp/run3/c.ipc" \
    --kv-blocks 128 --timeout 60 --tensor-parallel 3 --tp-mode thread >/dev/null \
    2>"$tmp/tp3.err" || rc=$?
check "--tensor-parallel 3 does not come up (exit $rc)" test "$rc" != 0
check "the worker says why" grep -q "does not divide the model's num_attention_heads (4)" \
    "$tmp/run3"/worker-*.log
check_summary
