#!/usr/bin/env bash
# test_deploy.sh BINDIR: deploy/pagoda-up, pagoda-status and pagoda-down drive a real process
# group on the CPU: up prints the address and refuses a second group in the same run dir, status
# tells running from stopped, a request is answered, and down leaves no process, no socket and
# no shared memory behind, also after the supervisor was killed with SIGKILL.
# The group listens on a private ipc:// address in a temporary dir, so it never collides with a
# group on the default TCP port.
set -euo pipefail
# shellcheck source=tests/check.sh
. "$(dirname "$0")/../check.sh"

bin_dir=$(cd "${1:?usage: test_deploy.sh BINDIR}" && pwd -P)
src=${PAGODA_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd -P)}
deploy=$src/deploy

tmp=$(mktemp -d /tmp/pagoda-td-XXXXXX)
run=$tmp/run
url=ipc://$run/client.ipc
cleanup() {
    "$deploy/pagoda-down" --run-dir "$run" --timeout 30 >/dev/null 2>&1 || true
    rm -rf -- "$tmp"
}
trap cleanup EXIT


# The pids of pagoda-* processes with an argument equal to the run dir.
group_pids() {
    local d a
    for d in /proc/[0-9]*; do
        a=$(tr '\0' '\n' 2>/dev/null <"$d/cmdline") || continue
        case $(basename -- "$(head -n 1 <<<"$a")" 2>/dev/null) in
        pagoda-*) ;;
        *) continue ;;
        esac
        if grep -qxF -- "$run" <<<"$a"; then echo "${d#/proc/}"; fi
    done
}
no_group_process() { [ -z "$(group_pids)" ]; }
no_socket() { [ -z "$(find "$run" -maxdepth 1 -name '*.ipc')" ]; }
# The pool's name as the kvpool logged it ("kv pool /pagoda-<hex>: ..."), not as pagoda-down
# computes it.
pool_name() {
    sed -n 's|.*kv pool \(/pagoda-[0-9a-f]\{16\}\):.*|\1|p' "$run/kvpool.log" | tail -n 1
}
up() { "$deploy/pagoda-up" --run-dir "$run" --bin-dir "$bin_dir" --model "$tmp/model" \
    --listen "$url" --kv-blocks 256 "$@"; }

"$bin_dir/pagoda-mkmodel" --preset tiny --seed 1 --out "$tmp/model" >/dev/null
mkdir -m 0700 "$run"

# -- up, and a second up refused.
out=$(up 2>"$tmp/up.err") && rc=0 || rc=$?
check "pagoda-up starts the group (exit $rc)" [ "$rc" = 0 ]
check "pagoda-up prints the address ($out)" [ "$out" = "$url" ]
check "DIR/ready names the address" [ "$(head -n 1 "$run/ready" 2>/dev/null)" = "$url" ]
sup_pid=$(cat "$run/supervisor.pid" 2>/dev/null || true)
up >"$tmp/up2.out" 2>"$tmp/up2.err" && rc=0 || rc=$?
check "a second pagoda-up on the same run dir is refused (exit $rc)" [ "$rc" != 0 ]
check "the refusal says why" grep -q "already runs" "$tmp/up2.err"
check "the first group still runs" kill -0 "$sup_pid"
check "the first group's pid file is kept" [ "$(cat "$run/supervisor.pid")" = "$sup_pid" ]
if ! "$bin_dir/pagoda-router" --help 2>&1 | grep -q -- --tenants; then
    touch "$tmp/tenants"
    up --tenants "$tmp/tenants" >/dev/null 2>"$tmp/up3.err" && rc=0 || rc=$?
    check "--tenants is refused while the router lacks it (exit $rc)" \
        grep -q "not supported yet" "$tmp/up3.err"
else
    up --tenants "$tmp/no-such-file" >/dev/null 2>"$tmp/up3.err" && rc=0 || rc=$?
    check "--tenants naming no file is refused (exit $rc)" grep -q "cannot read it" "$tmp/up3.err"
fi

# -- status, a request, the pool.
"$deploy/pagoda-status" --run-dir "$run" >"$tmp/status.out" 2>&1 && rc=0 || rc=$?
check "pagoda-status says running (exit $rc)" [ "$rc" = 0 ]
check "pagoda-status names the supervisor and the router" \
    grep -q "supervisor pid $sup_pid" "$tmp/status.out"
check "pagoda-status lists the router" grep -q "router .*pid [0-9]" "$tmp/status.out"
check "pagoda-status prints stats" grep -q '"num_blocks": 255' "$tmp/status.out"
answer=$("$bin_dir/pagoda" --url "$url" generate --tokens 1,2,3 --max-tokens 5 --json) || true
ids=$(sed -n 's/.*"token_ids": *\[\([0-9, ]*\)\].*/\1/p' <<<"$answer")
check "generate answers with 5 tokens ($ids)" [ "$(tr ',' '\n' <<<"$ids" | grep -c '[0-9]')" = 5 ]
pool=$(pool_name)
check "the kvpool's pool exists while the group runs ($pool)" [ -n "$pool" -a -e "/dev/shm$pool" ]

# -- down.
"$deploy/pagoda-down" --run-dir "$run" >"$tmp/down.out" 2>&1 && rc=0 || rc=$?
check "pagoda-down exits 0 (exit $rc)" [ "$rc" = 0 ]
check "pagoda-down drained without force" \
    bash -c '! grep -qE "SIGKILL|removing|FAIL" "$1"' _ "$tmp/down.out"
check "no pagoda process names the run dir" no_group_process
check "no socket is left in the run dir" no_socket
check "the kvpool's shared memory is gone" [ -n "$pool" -a ! -e "/dev/shm$pool" ]
"$deploy/pagoda-status" --run-dir "$run" >/dev/null 2>&1 && rc=0 || rc=$?
check "pagoda-status then exits 3 (exit $rc)" [ "$rc" = 3 ]

# -- a supervisor killed with SIGKILL leaves its programs running: pagoda-down stops them.
up >/dev/null 2>"$tmp/up4.err" && rc=0 || rc=$?
check "pagoda-up starts again in the same run dir (exit $rc)" [ "$rc" = 0 ]
kill -KILL "$(cat "$run/supervisor.pid")" 2>/dev/null || true
sleep 0.2
check "the programs outlive a killed supervisor" [ -n "$(group_pids)" ]
"$deploy/pagoda-status" --run-dir "$run" >"$tmp/status2.out" 2>&1 && rc=0 || rc=$?
check "pagoda-status says not running (exit $rc)" [ "$rc" = 3 ]
"$deploy/pagoda-down" --run-dir "$run" >"$tmp/down2.out" 2>&1 && rc=0 || rc=$?
check "pagoda-down cleans up after a killed supervisor (exit $rc)" [ "$rc" = 0 ]
check "no pagoda process names the run dir afterwards" no_group_process
check "no socket is left afterwards" no_socket
check "the shared memory is gone afterwards" [ -n "$pool" -a ! -e "/dev/shm$pool" ]
check "no ready file announces the dead group" [ ! -e "$run/ready" ]

if [ "$failed" != 0 ]; then
    for f in "$tmp"/*.out "$tmp"/*.err "$run"/*.log; do
        [ -f "$f" ] || continue
        echo "---- $f"
        tail -n 20 "$f"
    done
fi
check_summary
