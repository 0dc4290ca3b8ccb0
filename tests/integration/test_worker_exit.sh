#!/usr/bin/env bash
# test_worker_exit.sh BINDIR: how pagoda-worker tells the supervisor whether a restart can help.
# Beside a kvpool started for another model (a pool of 4 layers, a model of 2), the worker says
# what does not fit and exits with PAGODA_EXIT_CANNOT_RUN (common/exit_status.h, read here from
# the header), which the supervisor takes as "do not restart me" while the group starts (and as
# "try me again, without counting a crash loop" once it has served). A worker whose model
# directory does not exist says the same: the model folder is the operator's to fix (a served
# group goes on, and the worker comes back once the folder is there; it exited 1 before, and a
# served group whose folder went away stopped after five quick exits).
set -uo pipefail
# shellcheck source=tests/check.sh
. "$(dirname "$0")/../check.sh"

bin_dir=$(cd "${1:?usage: test_worker_exit.sh BINDIR}" && pwd -P)
src=${PAGODA_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd -P)}
cannot_run=$(sed -n 's/^#define PAGODA_EXIT_CANNOT_RUN \([0-9][0-9]*\)$/\1/p' \
    "$src/common/exit_status.h")
[ -n "$cannot_run" ] || { echo "no PAGODA_EXIT_CANNOT_RUN in common/exit_status.h"; exit 1; }

tmp=$(mktemp -d /tmp/pagoda-twe-XXXXXX)
run=$tmp/run
kvpool_pid=
cleanup() {
    if [ -n "$kvpool_pid" ]; then
        kill -TERM "$kvpool_pid" 2>/dev/null
        wait "$kvpool_pid" 2>/dev/null
    fi
    rm -rf -- "$tmp"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

mkdir -m 0700 "$run"
"$bin_dir/pagoda-mkmodel" --preset tiny --seed 1 --out "$tmp/pool-model" >/dev/null || exit 1
"$bin_dir/pagoda-mkmodel" --preset tiny --layers 2 --seed 1 --out "$tmp/worker-model" \
    >/dev/null || exit 1
"$bin_dir/pagoda-kvpool" --run-dir "$run" --model "$tmp/pool-model" --kv-blocks 64 \
    >"$tmp/kvpool.log" 2>&1 &
kvpool_pid=$!

# The worker asks kvpool for its pool (waiting while kvpool starts), maps it and compares.
timeout 60 "$bin_dir/pagoda-worker" --run-dir "$run" --model "$tmp/worker-model" --worker-id 0 \
    >"$tmp/worker.log" 2>&1
status=$?
check "a pool of another model: exit status $cannot_run (got $status)" [ "$status" = "$cannot_run" ]
check "it says what does not fit" grep -q 'layers 4 in the pool, 2 in the model' "$tmp/worker.log"
check "it says it cannot run as configured" grep -q 'cannot run as configured' "$tmp/worker.log"

timeout 60 "$bin_dir/pagoda-worker" --run-dir "$run" --model "$tmp/missing" --worker-id 0 \
    >"$tmp/worker2.log" 2>&1
status=$?
check "a missing model: exit status $cannot_run (got $status)" [ "$status" = "$cannot_run" ]
check "it names the file" grep -q "$tmp/missing/config.json: cannot open" "$tmp/worker2.log"
check_summary || { cat "$tmp/worker.log" "$tmp/worker2.log" "$tmp/kvpool.log"; exit 1; }
