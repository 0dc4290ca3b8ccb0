#!/usr/bin/env bash
# test_netns_engines.sh BINDIR: three engines behind one router, each engine in its own network
# namespace (issue 20's CPU must-show), through deploy/pagoda-up and pagoda-down:
#  - the test makes four namespaces (the router's and one per engine) and joins each engine's to
#    the router's by a veth pair with private addresses (engine I is 10.77.I.2/24, the router's
#    end 10.77.I.1/24); each engine is `pagoda-up --role engine --scheduler-listen
#    tcp://10.77.I.2:PORT` run inside its namespace (ip netns exec), the router `pagoda-up --role
#    router --scheduler tcp://10.77.I.2:PORT` (x3) inside its own. Clients reach the router on an
#    ipc:// path in its run dir (Unix sockets on a path are not per namespace). Every name is the
#    test's pid, so parallel runs share nothing (the same addresses live in different namespaces);
#    everything is torn down on exit, failure or the test's own deadline (a trap), and namespaces
#    left by a run that was killed outright (its pid gone) are removed at the next start.
#  - the multi-tenant workload (bench/tenants-multi.json: five tenants, four cache namespaces, a
#    pin) is run twice over the same engines, with --routing round-robin then (the router
#    restarted, the tenants' caches flushed through the admin call) --routing cache-aware. One
#    request at a time, so the comparison is a consequence of routing alone: cache-aware sends a
#    namespace's requests where its system prompt is cached (one miss per namespace), round robin
#    sends five tenants over three engines (a miss per namespace on each engine). Checked:
#    cache-aware's prefix hit rate is higher; the hit rates and TTFT p50/p95 are printed (not
#    checked: no timing is asserted).
#  - kill -9 of one engine's scheduler and worker (inside its namespace) amid 64 requests, once
#    all are running: all complete, the router moved that engine's requests, the supervisor
#    brings the engine back, and the greedy outputs equal pagoda-run's on the same prompts.
# Without the right to make namespaces (not root: CAP_SYS_ADMIN and CAP_NET_ADMIN) it says so
# and exits 77 (skipped). PAGODA_TEST_TIME_SCALE stretches the time limits (the sanitizer build).
set -euo pipefail
# shellcheck source=tests/check.sh
. "$(dirname "$0")/../check.sh"

bin_dir=$(cd "${1:?usage: test_netns_engines.sh BINDIR}" && pwd -P)
src=${PAGODA_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd -P)}
deploy=$src/deploy
scale=${PAGODA_TEST_TIME_SCALE:-1}
command -v jq >/dev/null || { echo "jq is missing (scripts/install-deps installs it)"; exit 1; }
command -v ip >/dev/null || { echo "SKIP: no ip command (iproute2)"; exit 77; }

# The test's own deadline, below ctest's timeout (which kills without a trap; CMake passes
# PAGODA_TEST_DEADLINE_S): past it the test stops itself and the EXIT trap tears everything down.
deadline_s=${PAGODA_TEST_DEADLINE_S:-$((150 * scale))}
engines=3
port=7460                                         # in every engine's namespace: no collision
tenants=$src/bench/tenants-multi.json             # five tenants, a group, a pin
admin_key=bench-admin
mt_prompts=30                                     # multi-tenant requests per routing policy
mt_system=64                                      # their namespace's system prompt: 4 blocks
mt_question=16                                    # their own question: one block
mt_namespaces=4                                   # tenants-multi.json: research, carol, dave, erin
fo_requests=64                                    # requests amid which an engine is killed
fo_tokens=256                                     # their output tokens, in both builds: the
                                                  # run must outlast the kill. 24 let it end
                                                  # first in the sanitizer build (its model
                                                  # programs run their kernels uninstrumented,
                                                  # scripts/run-tests), 64 once in the normal
                                                  # build of a fresh-clone CI run

# Names: pgdn-PID-r (the router's namespace), pgdn-PID-eI (engine I's).
prefix=pgdn
tag=$prefix-$$
rns=$tag-r
ens() { echo "$tag-e$1"; }
all_ns() { echo "$rns"; for ((i = 0; i < engines; i++)); do ens "$i"; done; }

# Removes namespace NS: whatever still runs in it (only what this test, or the dead run that
# made it, started there) is killed by pid, then its name goes.
drop_ns() { # NS
    local p
    ip netns list 2>/dev/null | awk '{print $1}' | grep -qxF -- "$1" || return 0
    for p in $(ip netns pids "$1" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$1" 2>/dev/null || true
}

tmp=$(mktemp -d /tmp/pagoda-nn-XXXXXX)
watchdog='' child='' bench_pid=''
# Every group stopped at once (10 s each to drain, within the 30 s that ctest leaves after the
# deadline), then whatever is left in the namespaces, and the namespaces.
cleanup() {
    local d ns
    [ -z "$watchdog" ] || kill "$watchdog" 2>/dev/null || true
    [ -z "$child" ] || kill "$child" 2>/dev/null || true
    [ -z "$bench_pid" ] || kill "$bench_pid" 2>/dev/null || true
    for d in "$tmp"/r "$tmp"/e*; do
        [ ! -f "$d/lock" ] ||
            "$deploy/pagoda-down" --run-dir "$d" --timeout 10 >/dev/null 2>&1 &
    done
    wait || true
    for ns in $(all_ns); do drop_ns "$ns"; done
    [ -n "${KEEP_TMP:-}" ] || rm -rf -- "$tmp"
}
trap cleanup EXIT
# (To the test's own output, fd 3: the signal may come while a command's output goes elsewhere.)
exec 3>&1
stopped() {
    echo "test_netns_engines: stopped after $SECONDS s (a signal, or its $deadline_s s deadline)" >&3
    exit 143
}
trap stopped TERM INT
# (Its sleep is killed with it, and holds no output open.)
(
    sleep "$deadline_s" &
    s=$!
    trap 'kill "$s" 2>/dev/null; exit 0' TERM
    wait "$s" && kill -TERM $$
) >/dev/null 2>&1 &
watchdog=$!
# bg COMMAND...: runs COMMAND as a child and waits for it; a wait (unlike a command in the
# foreground, or a $(...)) gives way to the deadline's signal at once, and the trap kills the
# child.
bg() {
    local rc=0
    "$@" &
    child=$!
    wait "$child" || rc=$?
    child=
    return "$rc"
}

# Namespaces of an earlier run that was killed outright (ctest's timeout): their pid is gone.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$prefix-[0-9]+-" || true); do
    p=${ns#"$prefix"-}
    p=${p%%-*}
    [ -d "/proc/$p" ] || { echo "removing $ns, left by a dead run (pid $p)"; drop_ns "$ns"; }
done

# -- may this test make namespaces at all?
if ! err=$(ip netns add "$rns" 2>&1); then
    echo "SKIP: cannot make a network namespace (ip netns add: $err); this test needs root" \
        "(CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    exit 77
fi

# -- the network: the router's namespace holds one veth end per engine.
net() { # what command...: runs an ip command, failing the test with its message
    local what=$1 out
    shift
    out=$("$@" 2>&1) || { echo "setting up the namespaces: $what: $out"; exit 1; }
}
net "lo in $rns" ip -n "$rns" link set lo up
for ((i = 0; i < engines; i++)); do
    ns=$(ens "$i")
    net "add $ns" ip netns add "$ns"
    net "lo in $ns" ip -n "$ns" link set lo up
    # Both ends are made inside their namespaces: their names never meet in the root one.
    net "veth $i" ip link add "r$i" netns "$rns" type veth peer name "e$i" netns "$ns"
    net "router's address $i" ip -n "$rns" addr add "10.77.$i.1/24" dev "r$i"
    net "engine's address $i" ip -n "$ns" addr add "10.77.$i.2/24" dev "e$i"
    net "r$i up" ip -n "$rns" link set "r$i" up
    net "e$i up" ip -n "$ns" link set "e$i" up
done
check "each engine's namespace sees only its own veth and lo" \
    [ "$(ip -n "$(ens 1)" -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort |
        tr '\n' ' ')" = "e1 lo " ]

bg "$bin_dir/pagoda-mkmodel" --preset tiny --seed 1 --out "$tmp/model" >/dev/null
up_timeout=$((60 * scale))
# The supervisor's liveness check scales like every other wait (as tests/integration/group.c
# does): a sanitizer build's worker, resuming an engine's moved requests on two busy cores, can
# go longer than 15 s between heartbeats, and would be killed as hung over and over.
up() { # NS DIR ARGS...: pagoda-up inside namespace NS
    local ns=$1 dir=$2
    shift 2
    mkdir -m 0700 "$dir" 2>/dev/null || [ -d "$dir" ]
    ip netns exec "$ns" "$deploy/pagoda-up" --run-dir "$dir" --bin-dir "$bin_dir" \
        --model "$tmp/model" --timeout "$up_timeout" --heartbeat-ms $((1000 * scale)) "$@"
}
addr() { echo "tcp://10.77.$1.2:$port"; }

# -- three engines, started together, each in its namespace.
pids=()
for ((i = 0; i < engines; i++)); do
    up "$(ens "$i")" "$tmp/e$i" --role engine --scheduler-listen "$(addr "$i")" \
        --kv-blocks 1024 >"$tmp/e$i.out" 2>"$tmp/e$i.err" &
    pids+=($!)
done
for ((i = 0; i < engines; i++)); do
    rc=0
    wait "${pids[$i]}" || rc=$?
    check "engine $i starts in $(ens "$i") (exit $rc)" [ "$rc" = 0 ]
    [ "$rc" = 0 ] || cat "$tmp/e$i.err"
    check "engine $i prints its address $(addr "$i")" [ "$(cat "$tmp/e$i.out")" = "$(addr "$i")" ]
done
[ "$failed" = 0 ] || { check_summary; exit 1; }

# PID runs in namespace NS.
in_ns() { [ -n "$1" ] && [ "$(ip netns identify "$1" 2>/dev/null)" = "$2" ]; }
# The pid of pagoda-PROGRAM whose --run-dir is DIR (the run dirs are mktemp's: no regex
# characters).
pid_of() { # program dir
    pgrep -f -- "/pagoda-$1 (.* )?--run-dir $2( |\$)" || true
}
for ((i = 0; i < engines; i++)); do
    s=$(pid_of scheduler "$tmp/e$i")
    check "engine $i's scheduler ($s) runs in its namespace" in_ns "$s" "$(ens "$i")"
done

# -- the router, in its namespace: ROUTING.
router_up() { # ROUTING
    local a=() i
    for ((i = 0; i < engines; i++)); do a+=(--scheduler "$(addr "$i")"); done
    up "$rns" "$tmp/r" --role router "${a[@]}" --routing "$1" --tenants "$tenants" \
        --listen "ipc://$tmp/r/client.ipc" 2>"$tmp/router-$1.err"
}
router_down() {
    bg "$deploy/pagoda-down" --run-dir "$tmp/r" --timeout $((30 * scale)) >/dev/null 2>&1
}
# retry TENTHS COMMAND...: COMMAND succeeds within TENTHS tenths of a second.
retry() {
    local n=$1 i
    shift
    for ((i = 0; i < n; i++)); do
        if "$@"; then return 0; fi
        sleep 0.1
    done
    "$@"
}
# Every engine's link is up in the router's current log.
links_up() {
    [ "$(grep -c "engine [0-9] up (tcp://10\.77\." "$tmp/r/router.log")" -ge "$engines" ]
}

bench_mt() { # NAME: the multi-tenant workload, one request at a time
    bg "$bin_dir/pagoda-bench" --url "$url" --model "$tmp/model" \
        --workload multi-tenant --tenants "$tenants" --num-prompts "$mt_prompts" \
        --system-prompt-len "$mt_system" --question-len "$mt_question" --output-len 8 \
        --ignore-eos --concurrency 1 \
        --seed 7 --stats-api-key "$admin_key" --timeout-ms $((30000 * scale)) \
        --json "$tmp/$1.json" --output-requests "$tmp/$1.jsonl" >"$tmp/$1.out" 2>"$tmp/$1.err"
}
jq_true() { [ "$(jq -e "$2" "$1" 2>/dev/null)" = true ]; }

for routing in round-robin cache-aware; do
    rc=0
    bg router_up "$routing" >"$tmp/url" || rc=$?
    url=$(cat "$tmp/url")
    check "the $routing router starts in $rns (exit $rc)" [ "$rc" = 0 ]
    [ "$rc" = 0 ] || { cat "$tmp/router-$routing.err"; exit 1; }
    check "the $routing router links the three engines over the veths" \
        retry $((100 * scale)) links_up
    check "the router says $routing" grep -qF "3 engines, $routing routing" "$tmp/r/router.log"
    rc=0
    bench_mt "$routing" || rc=$?
    check "$routing: the multi-tenant workload runs (exit $rc)" [ "$rc" = 0 ]
    check "$routing: all $mt_prompts requests completed" jq_true "$tmp/$routing.json" \
        ".completed == $mt_prompts and .failed == 0"
    check "$routing: the engines' prefix figures were read" jq_true "$tmp/$routing.json" \
        '.engine.available and .engine.prefix_query_tokens > 0'
    if [ "$routing" = round-robin ]; then
        # The same workload again from cold caches: every namespace's cached prefixes go (the
        # pins stay: they are the same on every engine under both policies).
        for f in "--group research" "--tenant carol" "--tenant dave" "--tenant erin"; do
            # shellcheck disable=SC2086
            out=$(timeout 20 "$bin_dir/pagoda" --url "$url" --api-key "$admin_key" \
                admin flush $f 2>&1) && rc=0 || rc=$?
            check "admin flush $f answers (exit $rc: $out)" [ "$rc" = 0 ]
        done
    fi
    router_down && rc=0 || rc=$?
    check "the $routing router stops clean (exit $rc)" [ "$rc" = 0 ]
    [ "$routing" = cache-aware ] || mv "$tmp/r/router.log" "$tmp/router-$routing.log"
done

# The comparison, printed (the record in bench/RESULTS.md comes from this table).
fmt() { jq -r "$2" "$tmp/$1.json" 2>/dev/null || echo "?"; }
echo "multi-tenant workload, $mt_prompts requests one at a time, 3 engines in network namespaces:"
printf '  %-12s %14s %14s %14s %14s\n' routing "prefix hit" "hit tokens" "TTFT p50 ms" "TTFT p95 ms"
for routing in cache-aware round-robin; do
    printf '  %-12s %14s %14s %14s %14s\n' "$routing" \
        "$(fmt "$routing" '.engine.prefix_hit_rate * 1000 | round / 1000')" \
        "$(fmt "$routing" '"\(.engine.prefix_hit_tokens)/\(.engine.prefix_query_tokens)"')" \
        "$(fmt "$routing" '.ttft_ms.p50 * 100 | round / 100')" \
        "$(fmt "$routing" '.ttft_ms.p95 * 100 | round / 100')"
done
ca=$(fmt cache-aware .engine.prefix_hit_rate)
rr=$(fmt round-robin .engine.prefix_hit_rate)
check "cache-aware's prefix hit rate ($ca) is higher than round robin's ($rr)" \
    jq -n -e "$ca > $rr" >/dev/null
# Exactly so: under cache-aware routing each namespace misses its system prompt once (its first
# request), every later prompt hits all but its question (the pin is on every engine); round
# robin misses it once per namespace on each engine it visits.
ca_want=$(jq "(.engine.prefix_query_tokens - $mt_prompts * $mt_question - \
    $mt_namespaces * $mt_system)" "$tmp/cache-aware.json" 2>/dev/null || echo "?")
check "cache-aware: one system-prompt miss per namespace ($ca_want hit tokens expected)" \
    jq_true "$tmp/cache-aware.json" ".engine.prefix_hit_tokens == $ca_want"

# -- kill -9 of engine 1's scheduler and worker amid 64 requests (the cache-aware router again).
rc=0
bg router_up cache-aware >"$tmp/url" || rc=$?
url=$(cat "$tmp/url")
check "the router starts again (exit $rc)" [ "$rc" = 0 ]
[ "$rc" = 0 ] || { cat "$tmp/router-cache-aware.err"; exit 1; }
check "the router links the three engines again" retry $((100 * scale)) links_up
# The victim's pids.
victim=1
vs=$(pid_of scheduler "$tmp/e$victim")
vw=$(pid_of worker "$tmp/e$victim")
check "engine $victim's scheduler ($vs) is in its namespace" in_ns "$vs" "$(ens $victim)"
check "engine $victim's worker ($vw) is in its namespace" in_ns "$vw" "$(ens $victim)"
fo_args=(--workload random --num-prompts "$fo_requests" --input-len 8:40 --output-len "$fo_tokens"
    --seed 21)
"$bin_dir/pagoda-bench" --url "$url" --model "$tmp/model" \
    --api-key bench-carol "${fo_args[@]}" --ignore-eos --rate inf --stats-api-key "$admin_key" \
    --timeout-ms $((60000 * scale)) --json "$tmp/fo.json" --output-requests "$tmp/fo.jsonl" \
    >"$tmp/fo.out" 2>"$tmp/fo.err" &
bench_pid=$!
all_running() {
    [ "$(timeout 20 "$bin_dir/pagoda" --url "$url" --api-key "$admin_key" stats --json 2>/dev/null |
        jq -r '.running + .waiting' 2>/dev/null)" = "$fo_requests" ]
}
check "all $fo_requests requests are on the engines (running or waiting)" \
    retry $((200 * scale)) all_running
still_running() { kill -0 "$bench_pid" 2>/dev/null; }
check "the requests are still running when the engine is killed" still_running
ip netns exec "$(ens $victim)" kill -9 "$vs" "$vw" || true
rc=0
wait "$bench_pid" || rc=$?
check "the 64-request run ends (exit $rc)" [ "$rc" = 0 ]
check "all $fo_requests requests completed, none failed" jq_true "$tmp/fo.json" \
    ".completed == $fo_requests and .failed == 0"
moved=$(sed -n "s/.*engine $victim (tcp:[^)]*) is .*: \([0-9]*\) unfinished requests move.*/\1/p" \
    "$tmp/r/router.log" | head -n 1)
check "the router moved engine $victim's unfinished requests (${moved:-none})" \
    [ "${moved:-0}" -gt 0 ]
back() {
    local s w
    s=$(pid_of scheduler "$tmp/e$victim")
    w=$(pid_of worker "$tmp/e$victim")
    [ -n "$s" ] && [ "$s" != "$vs" ] && [ -n "$w" ] && [ "$w" != "$vw" ] &&
        [ "$(grep -c "engine $victim up (tcp://" "$tmp/r/router.log")" -ge 2 ]
}
check "engine $victim's supervisor restarts both and the router links it again" \
    retry $((300 * scale)) back

# The same prompts through pagoda-run (greedy, EOS ignored): the outputs must be equal.
bg "$bin_dir/pagoda-bench" --model "$tmp/model" "${fo_args[@]}" \
    --dump-workload "$tmp/fo-dump.json" \
    >/dev/null
mapfile -t prompts < <(jq -r '.requests[].prompt | map(tostring) | join(",")' "$tmp/fo-dump.json")
run_args=()
for p in "${prompts[@]}"; do run_args+=(--tokens "$p"); done
rc=0
bg "$bin_dir/pagoda-run" --model "$tmp/model" --max-tokens "$fo_tokens" \
    --ignore-eos --json "${run_args[@]}" >"$tmp/expected.jsonl" 2>"$tmp/expected.err" || rc=$?
check "the dump holds the $fo_requests prompts (${#prompts[@]})" \
    [ "${#prompts[@]}" = "$fo_requests" ]
check "pagoda-run runs them (exit $rc)" [ "$rc" = 0 ]
differ=$(jq -n --slurpfile got "$tmp/fo.jsonl" --slurpfile want "$tmp/expected.jsonl" \
    '[range(0; $want | length) as $i | select(($got | map(select(.index == $i)) | .[0].token_ids)
                                             != $want[$i].token_ids)] | length' 2>&1) || true
check "greedy outputs equal pagoda-run's ($differ of $fo_requests differ)" [ "$differ" = 0 ]

router_down && rc=0 || rc=$?
check "the router stops clean (exit $rc)" [ "$rc" = 0 ]
for ((i = 0; i < engines; i++)); do
    bg "$deploy/pagoda-down" --run-dir "$tmp/e$i" --timeout $((30 * scale)) >/dev/null 2>&1 &&
        rc=0 || rc=$?
    check "engine $i stops clean (exit $rc)" [ "$rc" = 0 ]
    check "nothing is left in $(ens "$i")" [ -z "$(ip netns pids "$(ens "$i")")" ]
done

if [ "$failed" != 0 ]; then
    for f in "$tmp"/*.err "$tmp"/r/*.log "$tmp"/e*/*.log; do
        [ -s "$f" ] || continue
        echo "---- $f"
        tail -n 15 "$f"
    done
fi
check_summary
