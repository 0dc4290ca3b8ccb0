#!/usr/bin/env bash
# test_deploy_engines.sh BINDIR: addresses as configuration and several engines, through
# deploy/pagoda-up and pagoda-down on the CPU (issue 20):
#  - bad addresses (scheme, port, a socket path too long, ipc:// for several engines), --workers 2
#    (pagoda-up and the supervisor itself) and contradictory role flags are refused at once with
#    a message saying why, and nothing starts;
#  - a group whose every link is tcp:// on localhost answers a request, and binds no ipc socket
#    of those links;
#  - --role engine --engines 2 starts two engines (each its kvpool, worker and scheduler, in
#    DIR/engine-I), both supervised: a --role router group in another run dir, given engine 1's
#    address, answers; kill -9 of engine 1's worker restarts that worker alone (every other pid
#    stays) and the router's requests are answered again;
#  - --engines 2 with the router: when pagoda-router takes several --scheduler (--routing), the
#    group answers; until then pagoda-up refuses, naming the missing flag;
#  - pagoda-status lists each engine's programs; pagoda-down leaves no process, socket or shared
#    memory, in the engines' dirs too.
set -euo pipefail
# shellcheck source=tests/check.sh
. "$(dirname "$0")/../check.sh"

bin_dir=$(cd "${1:?usage: test_deploy_engines.sh BINDIR}" && pwd -P)
src=${PAGODA_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd -P)}
deploy=$src/deploy

tmp=$(mktemp -d /tmp/pagoda-te-XXXXXX)
cleanup() {
    local d
    for d in "$tmp"/*/; do
        [ ! -f "$d/lock" ] || "$deploy/pagoda-down" --run-dir "$d" --timeout 30 >/dev/null 2>&1 || true
    done
    rm -rf -- "$tmp"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# Ports for this run: a block of 16 free ones below the kernel's ephemeral range (tests/ports.sh).
# shellcheck source=tests/ports.sh
. "$(dirname "$0")/../ports.sh"
port=''
take_port port 16

# The pids of pagoda-* processes with an argument under $tmp (one ps: the run dirs hold no
# spaces, so its words are the arguments).
any_pids() {
    ps -u "$(id -u)" -o pid=,args= | awk -v t="$tmp/" '
        $2 ~ /(^|\/)pagoda-[a-z]+$/ { for (i = 3; i <= NF; i++) if (index($i, t) == 1) { print $1; break } }'
}
nothing_runs() { [ -z "$(any_pids)" ]; }
lacks() { ! grep -qF -- "$1" "$2"; } # lacks TEXT FILE
gone() { [ -z "$(tr -d '\0' 2>/dev/null <"/proc/$1/cmdline")" ]; } # gone PID (a zombie is gone)
alive() { ! gone "$1"; }
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
# The pid of the program (kvpool, worker, scheduler, router) with DIR as an argument (its
# --run-dir). Reads /proc with bash builtins only: a fork per process made each call take
# seconds on a busy machine, and the retries below call it hundreds of times.
pid_of() { # program dir
    local d a args
    for d in /proc/[0-9]*; do
        mapfile -d '' -t args 2>/dev/null <"$d/cmdline" || continue
        [ "${#args[@]}" -gt 0 ] && [ "${args[0]##*/}" = "pagoda-$1" ] || continue
        for a in "${args[@]}"; do
            if [ "$a" = "$2" ]; then
                echo "${d#/proc/}"
                break
            fi
        done
    done
}
up() { # DIR ARGS...
    local dir=$1
    shift
    [ -d "$dir" ] || mkdir -m 0700 "$dir"
    local pool=(--kv-blocks 256) # an engine's setting: a router alone refuses it
    [ "${1:-} ${2:-}" != "--role router" ] || pool=()
    "$deploy/pagoda-up" --run-dir "$dir" --bin-dir "$bin_dir" --model "$tmp/model" \
        "${pool[@]}" "$@"
}
ask() { # URL
    timeout 30 "$bin_dir/pagoda" --url "$1" generate --tokens 1,2,3 --max-tokens 4
}
# refused WHAT MESSAGE ARGS...: pagoda-up ARGS exits 2 saying MESSAGE, and nothing runs.
refused() {
    local what=$1 says=$2
    shift 2
    local rc=0
    up "$tmp/refused" "$@" >/dev/null 2>"$tmp/refused.err" || rc=$?
    check "$what is refused (exit $rc)" [ "$rc" = 2 ]
    check "$what: the refusal says '$says'" grep -qF -- "$says" "$tmp/refused.err"
    check "$what: nothing was started" nothing_runs
}

"$bin_dir/pagoda-mkmodel" --preset tiny --seed 1 --out "$tmp/model" >/dev/null

# -- refused before anything starts.
refused "a client address with no port" "--listen tcp://127.0.0.1: the port is missing" \
    --listen tcp://127.0.0.1
refused "a scheduler port out of range" "port 70000 is out of range (1..65535)" \
    --scheduler-listen tcp://127.0.0.1:70000
refused "an unknown scheme" "--worker-listen udp://127.0.0.1:1: expected ipc://PATH or tcp://HOST:PORT" \
    --worker-listen udp://127.0.0.1:1
long=ipc:///tmp/$(printf 'x%.0s' $(seq 1 120)).ipc
refused "a socket path too long" "a Unix socket path holds at most 107" --kvpool-listen "$long"
refused "--cuda-graphs neither on nor off" "--cuda-graphs maybe: expected on or off" \
    --cuda-graphs maybe
refused "--cuda-graphs without the CUDA backend" "--cuda-graphs needs --backend cuda" \
    --cuda-graphs off
refused "--cuda-pdl neither on nor off" "--cuda-pdl 1: expected on or off" --cuda-pdl 1
refused "--cuda-pdl without the CUDA backend" "--cuda-pdl needs --backend cuda" --cuda-pdl off
refused "--cuda-residual-gemm neither on nor off" "--cuda-residual-gemm no: expected on or off" \
    --cuda-residual-gemm no
refused "--cuda-residual-gemm without the CUDA backend" \
    "--cuda-residual-gemm needs --backend cuda" --cuda-residual-gemm off
refused "--cuda-tma neither on, off nor stream-k" "--cuda-tma yes: expected on, off or stream-k" \
    --cuda-tma yes
refused "--cuda-tma without the CUDA backend" "--cuda-tma needs --backend cuda" --cuda-tma off
refused "--kv-cache-dtype neither auto nor fp8" \
    "--kv-cache-dtype fp16: expected auto, fp8 or fp8_e4m3" --kv-cache-dtype fp16
refused "--kv-cache-dtype fp8 without the CUDA backend" \
    "--kv-cache-dtype fp8 needs --backend cuda" --kv-cache-dtype fp8
# pagoda-kvpool itself (the supervisor passes the flag on): the same refusals, exit 2.
for a in "fp8 --backend cpu:--kv-cache-dtype fp8 needs --backend cuda" \
    "fp16:--kv-cache-dtype fp16: expected auto, fp8 or fp8_e4m3"; do
    rc=0
    # shellcheck disable=SC2086 # the flags' words
    "$bin_dir/pagoda-kvpool" --run-dir "$tmp" --model "$tmp/model" --kv-cache-dtype ${a%%:*} \
        >/dev/null 2>"$tmp/kvpool.err" || rc=$?
    check "pagoda-kvpool --kv-cache-dtype ${a%%:*} is refused (exit $rc)" [ "$rc" = 2 ]
    check "pagoda-kvpool --kv-cache-dtype ${a%%:*}: the refusal says '${a#*:}'" \
        grep -qF -- "${a#*:}" "$tmp/kvpool.err"
done
refused "--tp-timeout-ms below a second" "--tp-timeout-ms: a whole number of milliseconds" \
    --tensor-parallel 2 --tp-timeout-ms 999
refused "--tp-timeout-ms without tensor parallelism" \
    "--tp-timeout-ms needs --tensor-parallel 2 or more" --tp-timeout-ms 5000
refused "an ipc:// scheduler address for 2 engines" "several engines need a tcp://HOST:PORT" \
    --role engine --engines 2 --scheduler-listen "ipc://$tmp/s.ipc"
refused "--scheduler without --role router" "--scheduler is for --role router" \
    --scheduler tcp://127.0.0.1:$port
refused "--role router without engines" "--role router needs its engines" --role router
# An engine's settings with --role router would be taken and go nowhere.
refused "--role router with an engine's setting (--max-seqs)" \
    "--scheduler-arg --max-seqs with --role router: an engine's setting" \
    --role router --scheduler tcp://127.0.0.1:$port --max-seqs 8
refused "--role router with --kv-blocks" "--kv-blocks with --role router: an engine's setting" \
    --role router --scheduler tcp://127.0.0.1:$port --kv-blocks 64
refused "--role router with --block-size" "--block-size with --role router: an engine's setting" \
    --role router --scheduler tcp://127.0.0.1:$port --block-size 32
refused "an empty option value" "--kv-cache-dtype needs a value (got an empty one)" \
    --kv-cache-dtype ""
refused "--workers 2" "run several engines: --engines N" --workers 2
# The supervisor itself, started without pagoda-up: refused at once (exit 2), no crash loop.
mkdir -m 0700 "$tmp/sup"
rc=0
timeout 10 "$bin_dir/pagoda-supervisor" --run-dir "$tmp/sup" --bin-dir "$bin_dir" \
    --model "$tmp/model" --workers 2 >/dev/null 2>"$tmp/sup.err" || rc=$?
check "the supervisor refuses --workers 2 at once (exit $rc)" [ "$rc" = 2 ]
check "the supervisor's refusal points to --engines" grep -qF -- "--engines N" "$tmp/sup.err"
check "the supervisor started nothing for --workers 2" nothing_runs
rc=0
timeout 10 "$bin_dir/pagoda-supervisor" --run-dir "$tmp/sup" --bin-dir "$bin_dir" \
    --model "$tmp/model" --scheduler-listen tcp://h:0 >/dev/null 2>"$tmp/sup.err" || rc=$?
check "the supervisor refuses port 0 (exit $rc)" [ "$rc" = 2 ]
check "the supervisor's refusal names the flag" grep -qF -- "--scheduler-listen tcp://h:0" "$tmp/sup.err"

# Ports of different links that overlap (engine I of N listens on PORT+I) are refused: they
# would cross-wire one engine's worker onto another's router link, or take --listen's port.
refused "a worker port range that overlaps the scheduler's" \
    "--worker-listen tcp://127.0.0.1:$((port + 9)) and --scheduler-listen tcp://127.0.0.1:$((port + 10)) use the same ports" \
    --role engine --engines 2 --worker-listen "tcp://127.0.0.1:$((port + 9))" \
    --scheduler-listen "tcp://127.0.0.1:$((port + 10))"
refused "a scheduler port that is --listen's" "use the same port" \
    --listen "tcp://127.0.0.1:$((port + 9))" --scheduler-listen "tcp://0.0.0.0:$((port + 9))"
refused "a kvpool port that is --http-listen's" "and --http-listen 127.0.0.1:$((port + 9)) use the same port" \
    --http-listen "127.0.0.1:$((port + 9))" --kvpool-listen "tcp://127.0.0.1:$((port + 9))"
rc=0
"$bin_dir/pagoda-supervisor" --run-dir "$tmp/sup" --bin-dir "$bin_dir" --model "$tmp/model" \
    --check-args --scheduler-listen tcp://127.0.0.1:7449 --engines 2 >/dev/null \
    2>"$tmp/sup.err" || rc=$?
check "the supervisor refuses engine 1's scheduler on the default --listen (exit $rc)" [ "$rc" = 2 ]
check "its refusal names both flags" \
    grep -qF -- "--scheduler-listen tcp://127.0.0.1:7449 and --listen tcp://127.0.0.1:7450 use the same ports" "$tmp/sup.err"
# A flag that only dials names a peer, not every interface.
refused "--scheduler tcp://*:PORT" "--scheduler tcp://*:$port: this flag dials" \
    --role router --scheduler "tcp://*:$port"
refused "--scheduler tcp://0.0.0.0:PORT" "this flag dials" --role router --scheduler "tcp://0.0.0.0:$port"
# An engine alone serves a router on another host: an ipc:// scheduler link cannot.
refused "--role engine on the ipc:// default" "cannot reach an ipc:// scheduler link" --role engine

# -- one group, every link on tcp:// on localhost.
tcp=$tmp/tcp
# --listen on every interface (tcp://*:PORT): what dials it (the gateway, DIR/ready, pagoda-up's
# health call) dials the loopback.
url=$(up "$tcp" --listen "tcp://*:$port" --scheduler-listen "tcp://127.0.0.1:$((port + 1))" \
    --worker-listen "tcp://0.0.0.0:$((port + 2))" --kvpool-listen "tcp://127.0.0.1:$((port + 3))" \
    --http-listen "127.0.0.1:$((port + 6))" 2>"$tmp/tcp.err") || { cat "$tmp/tcp.err" >&2; false; }
check "the tcp group prints its tcp address, dialable" [ "$url" = "tcp://127.0.0.1:$port" ]
check "DIR/ready holds the address to dial" [ "$(cat "$tcp/ready")" = "tcp://127.0.0.1:$port" ]
check "the gateway reaches the router listening on *" \
    curl -sf -o /dev/null --max-time 10 "http://127.0.0.1:$((port + 6))/health"
out=$(ask "$url" 2>&1) || true
check "the tcp group answers a request ($out)" grep -qE '^[0-9]+(,[0-9]+){3}$' <<<"$out"
check "the scheduler listens on tcp for the router" \
    grep -qF "listening on tcp://127.0.0.1:$((port + 1))" "$tcp/scheduler.log"
check "the worker dials its scheduler on the loopback" \
    grep -qF "dialing the scheduler at tcp://127.0.0.1:$((port + 2))" "$tcp/worker-0.log"
check "no ipc socket of the engine's links in the run dir" \
    [ -z "$(find "$tcp" -maxdepth 1 \( -name 'scheduler.ipc' -o -name 'worker-0.ipc' -o -name 'kvpool.ipc' \))" ]
"$deploy/pagoda-down" --run-dir "$tcp" >"$tmp/down.out" 2>&1 && rc=0 || rc=$?
check "the tcp group stops clean (exit $rc)" [ "$rc" = 0 ]

# -- a router started before its engines: it is up and waits for them (pagoda-up succeeds).
rtr=$tmp/rtr
url=$(up "$rtr" --role router --scheduler "tcp://127.0.0.1:$((port + 5))" \
    --listen "ipc://$rtr/client.ipc" 2>"$tmp/rtr.err") && rc=0 || rc=$?
check "--role router before its engines: pagoda-up succeeds (exit $rc)" [ "$rc" = 0 ]
check "--role router before its engines: it says it waits for them" \
    grep -qF "the router is up and waits for its engines" "$tmp/rtr.err"
check "--role router before its engines: the router runs" [ -n "$(pid_of router "$rtr")" ]

# -- two engines alone on every interface, and the router given one of them.
eng=$tmp/eng
up "$eng" --role engine --engines 2 --scheduler-listen "tcp://0.0.0.0:$((port + 4))" \
    >"$tmp/eng.out" 2>"$tmp/eng.err" || { cat "$tmp/eng.err" >&2; false; }
host=$(hostname -f 2>/dev/null || true)
check "--role engine prints both schedulers' addresses by this host's name ($(tr '\n' ' ' <"$tmp/eng.out"))" \
    [ "$(cat "$tmp/eng.out")" = "tcp://$host:$((port + 4))"$'\n'"tcp://$host:$((port + 5))" ]
check "--role engine prints no address of every interface" lacks 0.0.0.0 "$tmp/eng.out"
check "--role engine says the addresses name this host" grep -qF "name this host as" "$tmp/eng.err"
for e in 0 1; do
    for p in kvpool worker scheduler; do
        check "engine $e has its $p" [ -n "$(pid_of "$p" "$eng/engine-$e")" ]
    done
    check "engine $e has its own logs" [ -s "$eng/engine-$e/worker-0.log" ]
done
check "--role engine starts no router" [ -z "$(pid_of router "$eng")" ]
# pagoda-status and pid_of each read /proc at their own moment: asked again while they disagree
# (a fresh-clone CI run under ASan saw them differ once, 2026-12-03).
status_lists_worker() {
    local pid
    pid=$(pid_of worker "$eng/engine-1")
    [ -n "$pid" ] && grep -q "engine-1/worker-0 .*pid $pid\$" \
        <("$deploy/pagoda-status" --run-dir "$eng" 2>&1)
}
if ! retry 50 status_lists_worker; then
    echo "pid_of: $(pid_of worker "$eng/engine-1" | tr '\n' ' ')" >&2
    "$deploy/pagoda-status" --run-dir "$eng" >&2 || true
fi
check "pagoda-status lists engine 1's worker" status_lists_worker
answers() { # a request through the router started before its engines is answered
    local out
    out=$(timeout 10 "$bin_dir/pagoda" --url "$url" generate --tokens 1,2,3 --max-tokens 4 2>&1) &&
        grep -qE '^[0-9]+(,[0-9]+){3}$' <<<"$out"
}
check "the router started first answers through engine 1 once it serves" retry 100 answers
check "--role router starts no engine" [ -z "$(pid_of kvpool "$rtr")" ]

before=$(for e in 0 1; do for p in kvpool worker scheduler; do pid_of "$p" "$eng/engine-$e"; done; done)
victim=$(pid_of worker "$eng/engine-1")
kill -9 "$victim"
restarted() {
    local now
    now=$(pid_of worker "$eng/engine-1")
    [ -n "$now" ] && [ "$now" != "$victim" ] &&
        grep -q "engine-1/worker-0 (pid $now) is ready again" "$eng/supervisor.log"
}
check "engine 1's worker is restarted after kill -9" retry 300 restarted
after=$(for e in 0 1; do for p in kvpool worker scheduler; do pid_of "$p" "$eng/engine-$e"; done; done)
check "only that worker was replaced" \
    [ "$(comm -23 <(sort <<<"$before") <(sort <<<"$after"))" = "$victim" ]
out=$(ask "$url" 2>&1) || true
check "the router's requests are answered again ($out)" grep -qE '^[0-9]+(,[0-9]+){3}$' <<<"$out"
"$deploy/pagoda-down" --run-dir "$rtr" >/dev/null 2>&1 && rc=0 || rc=$?
check "the router group stops clean (exit $rc)" [ "$rc" = 0 ]
"$deploy/pagoda-down" --run-dir "$eng" >"$tmp/down.out" 2>&1 && rc=0 || rc=$?
check "the engines stop clean (exit $rc)" [ "$rc" = 0 ]
check "pagoda-down checked both engines' dirs" \
    [ "$(grep -c 'ok: no socket (\*.ipc) left in .*/engine-[01]$' "$tmp/down.out")" = 2 ]
check "nothing runs after the stops" nothing_runs

# -- two engines behind one router.
all=$tmp/all
if "$bin_dir/pagoda-router" --help 2>&1 | grep -q -- '--routing'; then
    url=$(up "$all" --engines 2 --routing round-robin --listen "ipc://$all/client.ipc" \
        2>"$tmp/all.err") || { cat "$tmp/all.err" >&2; false; }
    for i in 1 2 3 4; do
        out=$(ask "$url" 2>&1) || true
        check "request $i to two engines is answered ($out)" grep -qE '^[0-9]+(,[0-9]+){3}$' <<<"$out"
    done
    "$deploy/pagoda-down" --run-dir "$all" >/dev/null 2>&1 && rc=0 || rc=$?
    check "the two-engine group stops clean (exit $rc)" [ "$rc" = 0 ]
else
    refused "--engines 2 with a router of one scheduler" "has no --routing flag yet" --engines 2
fi
# -- pagoda-down DIR leaves alone a group of its own run in DIR/engine-1 (stand-ins: copies of
# bash named as pagoda's programs, a "worker" whose parent is its own "supervisor"), and still
# stops a program of DIR/engine-1 that no supervisor owns (one orphaned by a killed supervisor).
own=$tmp/own
mkdir -m 0700 "$own" "$own/engine-1" "$tmp/fake"
cp "$(command -v bash)" "$tmp/fake/pagoda-supervisor"
cp "$(command -v bash)" "$tmp/fake/pagoda-worker"
# shellcheck disable=SC2016 # $0 and $1 are the stand-in's
# Their output goes to /dev/null: a killed stand-in leaves its sleep running, and a sleep that
# held the test's stdout kept ctest waiting for the end of the output for the whole minute.
"$tmp/fake/pagoda-supervisor" -c '"$0" -c "sleep 60; :" --run-dir "$1" & wait' \
    "$tmp/fake/pagoda-worker" "$own/engine-1" --run-dir "$own/engine-1" >/dev/null 2>&1 &
fake_sup=$!
"$tmp/fake/pagoda-worker" -c 'sleep 60; :' --run-dir "$own/engine-1" >/dev/null 2>&1 &
orphan=$!
fake_worker() { pgrep -P "$fake_sup" -x pagoda-worker; }
check "the stand-in group runs" retry 50 fake_worker
other=$(fake_worker || true)
"$deploy/pagoda-down" --run-dir "$own" --timeout 5 >"$tmp/own.out" 2>&1 || true
check "pagoda-down DIR leaves DIR/engine-1's own group running" alive "$other"
check "pagoda-down DIR leaves that group's supervisor running" alive "$fake_sup"
check "pagoda-down DIR does not name that group's worker" lacks "$other (pagoda-worker)" "$tmp/own.out"
check "pagoda-down DIR stops a program of DIR/engine-1 that no supervisor owns" \
    retry 50 gone "$orphan"
touch "$own/engine-1/supervisor.pid" "$own/engine-1/x.ipc"
"$deploy/pagoda-down" --run-dir "$own" --timeout 5 >"$tmp/own.out" 2>&1 || true
check "pagoda-down DIR leaves the files of a group run in DIR/engine-1" [ -e "$own/engine-1/x.ipc" ]
kill "$other" "$fake_sup" 2>/dev/null || true
wait "$fake_sup" "$orphan" 2>/dev/null || true
check "nothing runs at the end" retry 50 nothing_runs
check_summary
