#!/usr/bin/env bash
# test_deploy.sh BINDIR: deploy/pagoda-up, pagoda-status and pagoda-down drive a real process
# group on the CPU: up refuses --workers above 1, a run dir of another user or writable by
# others, and a supervisor.log or program log that is a symbolic link (whose target stays
# untouched), all before anything runs; of two ups started at once on one run dir exactly one
# starts the group and the other says it is already running; up prints the address and refuses
# a second group in the same run dir, status tells running from stopped, a request is answered,
# a router whose loop stops (SIGSTOP) is killed and replaced by the supervisor and the group
# serves again, an earlier group's runtime pins file is removed, and down leaves no process, no socket and no shared memory behind, also after
# the supervisor was killed with SIGKILL; with --http-listen, status lists the gateway and up's
# --gateway-arg reaches it; a model folder whose tokenizer.json is broken fails the start, saying
# which file and why, the router tried once.
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
    local d
    for d in "$run" "$tmp/theirs" "$tmp/open" "$tmp/linked" "$tmp/gw" "$tmp/tok"; do
        [ ! -d "$d" ] || "$deploy/pagoda-down" --run-dir "$d" --timeout 30 >/dev/null 2>&1 || true
    done
    rm -rf -- "$tmp"
}
trap cleanup EXIT
trap 'exit 143' TERM INT # the cleanup runs on a timeout's SIGTERM too


# The pids of pagoda-* processes with an argument equal to the run dir.
group_pids() {
    local d a args
    for d in /proc/[0-9]*; do
        # bash builtins only (no fork per process: the polls below call this often).
        mapfile -d '' -t args 2>/dev/null <"$d/cmdline" || continue
        a=${args[0]:-}
        case ${a##*/} in
        pagoda-*) ;;
        *) continue ;;
        esac
        for a in "${args[@]}"; do
            if [ "$a" = "$run" ]; then
                echo "${d#/proc/}"
                break
            fi
        done
    done
}
no_group_process() { [ -z "$(group_pids)" ]; }
no_socket() { [ -z "$(find "$run" -maxdepth 1 -name '*.ipc')" ]; }
# The pool's name as the kvpool logged it ("kv pool /pagoda-<hex>: ..."), not as pagoda-down
# computes it.
pool_name() {
    sed -n 's|.*kv pool \(/pagoda-[0-9a-f]\{16\}\):.*|\1|p' "$run/kvpool.log" | tail -n 1
}
up() { up_in "$run" "$@"; }
up_in() { # DIR ARGS...
    local dir=$1
    shift
    "$deploy/pagoda-up" --run-dir "$dir" --bin-dir "$bin_dir" --model "$tmp/model" \
        --listen "ipc://$dir/client.ipc" --kv-blocks 256 "$@"
}
# The pids of pagoda-* processes naming any dir under $tmp.
any_pids() {
    local d a args
    for d in /proc/[0-9]*; do
        mapfile -d '' -t args 2>/dev/null <"$d/cmdline" || continue
        a=${args[0]:-}
        case ${a##*/} in
        pagoda-*) ;;
        *) continue ;;
        esac
        for a in "${args[@]}"; do
            if [[ $a == "$tmp/"* ]]; then
                echo "${d#/proc/}"
                break
            fi
        done
    done
}
nothing_runs() { [ -z "$(any_pids)" ]; }
healthy() { timeout 10 "$bin_dir/pagoda" --url "$url" health >/dev/null 2>&1; }

"$bin_dir/pagoda-mkmodel" --preset tiny --seed 1 --out "$tmp/model" >/dev/null
# The tokenizer's EOS (token 7 here) is one the worker announces (it stops below).
printf '{"eos_token": "<end>", "added_tokens_decoder": {"7": {"content": "<end>"}}}\n' \
    >"$tmp/model/tokenizer_config.json"
mkdir -m 0700 "$run"

# -- refused before anything starts.
up --workers 2 >/dev/null 2>"$tmp/workers.err" && rc=0 || rc=$?
check "--workers 2 is refused (exit $rc)" [ "$rc" = 2 ]
check "the refusal says why" grep -q -- "--workers 2: a group runs 1 worker" "$tmp/workers.err"
check "nothing was started for --workers 2" nothing_runs
check "no supervisor was started for --workers 2" [ ! -e "$run/supervisor.log" ]
up --listen "ipc://$tmp/no-such-dir/client.ipc" >/dev/null 2>"$tmp/ipcdir.err" && rc=0 || rc=$?
check "a client address in a directory that is not there is refused (exit $rc)" [ "$rc" != 0 ]
check "the refusal names the flag and the directory" \
    grep -q -- "--listen ipc://$tmp/no-such-dir/client.ipc: $tmp/no-such-dir is not a directory" \
    "$tmp/ipcdir.err"
check "nothing was started for it" nothing_runs

mkdir -m 0700 "$tmp/theirs"
if chown 65534:65534 "$tmp/theirs" 2>/dev/null; then
    up_in "$tmp/theirs" >/dev/null 2>"$tmp/theirs.err" && rc=0 || rc=$?
    check "a run dir of another user is refused (exit $rc)" [ "$rc" = 2 ]
    check "the refusal names its owner" grep -q "belongs to uid 65534" "$tmp/theirs.err"
    check "nothing was written in it" [ -z "$(ls -A "$tmp/theirs")" ]
else
    echo "skip a run dir of another user: chown needs root"
fi
mkdir -m 0700 "$tmp/open" && chmod 0777 "$tmp/open"
up_in "$tmp/open" >/dev/null 2>"$tmp/open.err" && rc=0 || rc=$?
check "a run dir writable by others is refused (exit $rc)" [ "$rc" = 2 ]
check "the refusal says why" grep -q "writable by others" "$tmp/open.err"
check "nothing was written in it" [ -z "$(ls -A "$tmp/open")" ]
check "nothing was started for the refused run dirs" nothing_runs

echo precious >"$tmp/precious"
mkdir -m 0700 "$tmp/linked"
ln -s "$tmp/precious" "$tmp/linked/supervisor.log"
up_in "$tmp/linked" >/dev/null 2>"$tmp/linked.err" && rc=0 || rc=$?
check "a supervisor.log that is a symbolic link is refused (exit $rc)" [ "$rc" != 0 ]
check "the refusal says why" grep -q "symbolic link" "$tmp/linked.err"
rm -f "$tmp/linked/supervisor.log" "$tmp/linked/router.log"
ln -s "$tmp/precious" "$tmp/linked/router.log"
up_in "$tmp/linked" >/dev/null 2>"$tmp/linked2.err" && rc=0 || rc=$?
check "a program log that is a symbolic link is refused (exit $rc)" [ "$rc" != 0 ]
check "the supervisor says why" grep -q "router.log is a symbolic link" "$tmp/linked/supervisor.log"
check "the links' target is unchanged" [ "$(cat "$tmp/precious")" = precious ]
check "nothing runs after the refusals" nothing_runs

# -- two ups at once on one run dir: one group starts, the other up says it is already running
# and leaves that group alone. The runtime pins an earlier group's router kept are not the new
# group's: its supervisor removes them.
echo '{"pins": []}' >"$run/router-pins.json"
up >"$tmp/upA.out" 2>"$tmp/upA.err" &
a=$!
up >"$tmp/upB.out" 2>"$tmp/upB.err" &
b=$!
wait $a && rc_a=0 || rc_a=$?
wait $b && rc_b=0 || rc_b=$?
check "exactly one of two ups at once starts the group (exits $rc_a, $rc_b)" \
    [ "$(((rc_a == 0) + (rc_b == 0)))" = 1 ]
if [ "$rc_a" = 0 ]; then out=$(cat "$tmp/upA.out") err=$tmp/upB.err; else
    out=$(cat "$tmp/upB.out") err=$tmp/upA.err; fi
check "the other says the group is already running" grep -q "already running (pid [0-9]" "$err"
check "pagoda-up prints the address ($out)" [ "$out" = "$url" ]
check "the group serves after the race" healthy
check "DIR/ready names the address" [ "$(head -n 1 "$run/ready" 2>/dev/null)" = "$url" ]
check "an earlier group's runtime pins are removed" [ ! -e "$run/router-pins.json" ]
sup_pid=$(cat "$run/supervisor.pid" 2>/dev/null || true)
up >"$tmp/up2.out" 2>"$tmp/up2.err" && rc=0 || rc=$?
check "a second pagoda-up on the same run dir is refused (exit $rc)" [ "$rc" != 0 ]
check "the refusal says why" grep -q "already running (pid $sup_pid)" "$tmp/up2.err"
check "the first group still runs" kill -0 "$sup_pid"
check "the first group's pid file is kept" [ "$(cat "$run/supervisor.pid")" = "$sup_pid" ]
# pagoda-down of a directory the group names only as another flag's value (its bin dir here; a
# model folder alike) leaves it alone: a program is DIR's only by its --run-dir. It stopped the
# group before.
"$deploy/pagoda-down" --run-dir "$bin_dir" --timeout 10 >"$tmp/down-bin.out" 2>&1 || true
check "pagoda-down of the group's bin dir leaves the group running" kill -0 "$sup_pid"
check "and it serves" healthy
if ! "$bin_dir/pagoda-router" --help 2>&1 | grep -q -- --tenants; then
    touch "$tmp/tenants"
    up --tenants "$tmp/tenants" >/dev/null 2>"$tmp/up3.err" && rc=0 || rc=$?
    check "--tenants is refused while the router lacks it (exit $rc)" \
        grep -q "not supported yet" "$tmp/up3.err"
else
    up --tenants "$tmp/no-such-file" >/dev/null 2>"$tmp/up3.err" && rc=0 || rc=$?
    check "--tenants naming no file is refused (exit $rc)" grep -q "cannot read it" "$tmp/up3.err"
fi

# -- status, a request, the pool. A pagoda-worker of no run dir (another user's, started by
# hand) runs beside the group: the listing passes over it.
(exec -a pagoda-worker sleep 60) &
stray=$!
for _ in $(seq 1 50); do # until the subshell has become the stray
    [ "$(tr '\0' '\n' <"/proc/$stray/cmdline" 2>/dev/null | head -n 1)" = pagoda-worker ] && break
    sleep 0.1
done
"$deploy/pagoda-status" --run-dir "$run" >"$tmp/status.out" 2>&1 && rc=0 || rc=$?
kill "$stray" 2>/dev/null || true
wait "$stray" 2>/dev/null || true
check "pagoda-status says running (exit $rc)" [ "$rc" = 0 ]
check "pagoda-status names the supervisor and the router" \
    grep -q "supervisor pid $sup_pid" "$tmp/status.out"
check "pagoda-status lists the router" grep -q "router .*pid [0-9]" "$tmp/status.out"
check "pagoda-status prints stats" grep -q '"num_blocks": 255' "$tmp/status.out"
answer=$("$bin_dir/pagoda" --url "$url" generate --tokens 1,2,3 --max-tokens 5 --json) || true
ids=$(sed -n 's/.*"token_ids": *\[\([0-9, ]*\)\].*/\1/p' <<<"$answer")
check "generate answers with 5 tokens ($ids)" [ "$(tr ',' '\n' <<<"$ids" | grep -c '[0-9]')" = 5 ]
answer=$("$bin_dir/pagoda" --url "$url" generate --tokens 1,2,3 --max-tokens 5 --logit-bias 7:100 \
    --json) || true
check "the tokenizer's EOS stops a request ($answer)" \
    grep -Eq '"token_ids": *\[7\].*"finish_reason": *"stop"' <<<"$answer"
# pagoda-run (offline) answers as the group does with stop ids, a logit bias and min_tokens: 3
# tokens without 9 (nor the EOS ids), then 9.
flags=(--tokens 1,2,3 --max-tokens 8 --logit-bias 9:100 --logit-bias 5:2.5 --stop-token-ids 9
    --min-tokens 3 --json)
answer=$("$bin_dir/pagoda" --url "$url" generate "${flags[@]}") || true
offline=$("$bin_dir/pagoda-run" --model "$tmp/model" "${flags[@]}") || true
ids=$(sed -n 's/.*"token_ids": *\[\([0-9, ]*\)\].*"finish_reason": *"\([a-z]*\)".*/\1 \2/p' <<<"$answer")
check "a request with stop ids, a bias and min_tokens: 3 tokens, then 9 ($ids)" \
    grep -Eq '^[0-9]+, [0-9]+, [0-9]+, 9 stop$' <<<"$ids"
check "pagoda-run gives the group's tokens ($offline)" [ "$(sed -n \
    's/.*"token_ids": *\[\([0-9, ]*\)\].*"finish_reason": *"\([a-z]*\)".*/\1 \2/p' \
    <<<"$offline")" = "$ids" ]
# ... and stops at the tokenizer's EOS (7) as the group does, once min_tokens lets it
offline=$("$bin_dir/pagoda-run" --model "$tmp/model" --tokens 1,2,3 --max-tokens 6 \
    --logit-bias 7:100 --min-tokens 2 --json) || true
check "pagoda-run stops at the tokenizer's EOS after min_tokens ($offline)" \
    grep -Eq '"token_ids": *\[[0-9]+, [0-9]+, 7\].*"finish_reason": *"stop"' <<<"$offline"
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

# -- a router whose loop stops answering is killed and replaced: the group serves again.
up --heartbeat-ms 200 --heartbeat-misses 10 >/dev/null 2>"$tmp/up4.err" && rc=0 || rc=$?
check "pagoda-up starts again in the same run dir (exit $rc)" [ "$rc" = 0 ]
router_pid() { # the pid of the group's router, or nothing
    local p
    for p in $(group_pids); do
        if [ "$(basename -- "$(tr '\0' '\n' 2>/dev/null <"/proc/$p/cmdline" | head -n 1)")" = \
            pagoda-router ]; then
            echo "$p"
            return 0
        fi
    done
    return 0
}
stopped=$(router_pid)
check "the router runs ($stopped)" [ -n "$stopped" ]
[ -z "$stopped" ] || kill -STOP "$stopped"
replaced=
deadline=$((SECONDS + 30))
while [ $SECONDS -lt $deadline ]; do
    now=$(router_pid)
    if [ -n "$now" ] && [ "$now" != "$stopped" ] && healthy; then
        replaced=$now
        break
    fi
    sleep 0.1
done
check "the stopped router was replaced by a new one ($replaced)" [ -n "$replaced" ]
check "the stopped router was killed" [ ! -e "/proc/$stopped" ]
check "the supervisor says why" grep -q "router (pid $stopped) sent no heartbeat" "$run/supervisor.log"
answer=
[ -z "$replaced" ] || answer=$("$bin_dir/pagoda" --url "$url" generate --tokens 1,2,3 \
    --max-tokens 5 --json --timeout-ms 30000) || true
ids=$(sed -n 's/.*"token_ids": *\[\([0-9, ]*\)\].*/\1/p' <<<"$answer")
check "the group serves again ($ids)" [ "$(tr ',' '\n' <<<"$ids" | grep -c '[0-9]')" = 5 ]

# -- the model folder's generation_config.json broken while the group serves, then the worker
# killed: it cannot run as configured (exit status 78) and is tried again without end while the
# rest of the group goes on; once the file is fixed, the group serves again. Before, the worker
# exited 1 five times within seconds and the supervisor stopped the whole group.
program_pid() { # NAME: the pid of the group's program of that name, or nothing
    local p
    for p in $(group_pids); do
        if [ "$(basename -- "$(tr '\0' '\n' 2>/dev/null <"/proc/$p/cmdline" | head -n 1)")" = \
            "$1" ]; then
            echo "$p"
            return 0
        fi
    done
    return 0
}
sup_pid=$(cat "$run/supervisor.pid" 2>/dev/null || true)
router_before=$(router_pid)
printf '{"eos_token_id": ' >"$tmp/model/generation_config.json"
worker=$(program_pid pagoda-worker)
check "the worker runs ($worker)" [ -n "$worker" ]
[ -z "$worker" ] || kill -KILL "$worker"
for _ in $(seq 1 100); do # until it has failed (and been tried again) at least 6 times
    [ "$(grep -c "worker.*cannot run as configured" "$run/supervisor.log")" -ge 6 ] && break
    sleep 0.1
done
check "the worker cannot run with the broken file, and is tried again" \
    [ "$(grep -c "worker.*cannot run as configured" "$run/supervisor.log")" -ge 6 ]
check "the supervisor keeps the group" kill -0 "$sup_pid"
check "the router is the same one" [ "$(router_pid)" = "$router_before" ]
rm -f "$tmp/model/generation_config.json"
answer=$("$bin_dir/pagoda" --url "$url" generate --tokens 1,2,3 --max-tokens 5 --json \
    --timeout-ms 30000) || true
ids=$(sed -n 's/.*"token_ids": *\[\([0-9, ]*\)\].*/\1/p' <<<"$answer")
check "once the file is fixed the group serves again ($ids)" \
    [ "$(tr ',' '\n' <<<"$ids" | grep -c '[0-9]')" = 5 ]

# -- a supervisor killed with SIGKILL leaves its programs running: pagoda-down stops them.
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

# -- with --http-listen: pagoda-status lists the gateway, and up's --gateway-arg reaches it (its
# model name, which --gateway-arg overrides, in /v1/models).
# shellcheck source=tests/ports.sh
. "$src/tests/ports.sh"
take_port http_port
gw=$tmp/gw
up_in "$gw" --http-listen "127.0.0.1:$http_port" --gateway-arg --model-name \
    --gateway-arg passed-through >"$tmp/gw-up.out" 2>&1 && rc=0 || rc=$?
check "pagoda-up with --gateway-arg starts the group (exit $rc)" [ "$rc" = 0 ]
models=$(curl -s --max-time 10 "http://127.0.0.1:$http_port/v1/models" || true)
check "the gateway got --gateway-arg ($models)" grep -q '"id": *"passed-through"' <<<"$models"
"$deploy/pagoda-status" --run-dir "$gw" >"$tmp/gw-status.out" 2>&1 || true
check "pagoda-status lists the gateway" grep -q "gateway .*pid [0-9]" "$tmp/gw-status.out"
"$deploy/pagoda-down" --run-dir "$gw" >"$tmp/gw-down.out" 2>&1 && rc=0 || rc=$?
check "pagoda-down stops it (exit $rc)" [ "$rc" = 0 ]
"$deploy/pagoda-up" --run-dir "$gw" --gateway-arg >"$tmp/gw-bad.out" 2>&1 && rc=0 || rc=$?
check "a --gateway-arg without its value is refused (exit $rc)" [ "$rc" = 2 ]

# -- the bundled model with its tokenizer.json cut short (a copy that did not finish): the group
# does not start. The router says it cannot run as configured, naming the file and the cause, and
# the supervisor stops the group at once instead of restarting it (vLLM and llama.cpp refuse such
# a model folder too), before starting anything: the router's check (pagoda-router --check) runs
# first; a folder without tokenizer.json would serve token ids.
brown=$src/assets/pagoda-brown
mkdir "$tmp/brown" && ln -s "$brown/config.json" "$brown/model.safetensors" "$tmp/brown/" &&
    cp "$brown/tokenizer_config.json" "$tmp/brown/"
head -c 100000 "$brown/tokenizer.json" >"$tmp/brown/tokenizer.json"
mkdir -m 0700 "$tmp/tok"
"$deploy/pagoda-up" --run-dir "$tmp/tok" --bin-dir "$bin_dir" --model "$tmp/brown" \
    --listen "ipc://$tmp/tok/client.ipc" --kv-blocks 256 >"$tmp/tok-up.out" 2>&1 && rc=0 || rc=$?
check "a model whose tokenizer.json is broken does not start (exit $rc)" [ "$rc" = 1 ]
check "pagoda-up shows the router naming the file and the cause" grep -q \
    "pagoda-router: $tmp/brown/tokenizer.json: line [0-9]* column [0-9]*: .*end of file" \
    "$tmp/tok-up.out"
check "the supervisor says the router cannot run as configured and stops the group" grep -q \
    "the router cannot run as configured (its check.*exit status 78.*nothing was started" \
    "$tmp/tok/supervisor.log"
check "the router's check ran once and nothing was started" \
    [ "$(grep -c "checking router" "$tmp/tok/router.log")" = 1 -a ! -e "$tmp/tok/kvpool.log" ]
check "nothing runs after the refused model" nothing_runs

if [ "$failed" != 0 ]; then
    for f in "$tmp"/*.out "$tmp"/*.err "$run"/*.log; do
        [ -f "$f" ] || continue
        echo "---- $f"
        tail -n 20 "$f"
    done
fi
check_summary
