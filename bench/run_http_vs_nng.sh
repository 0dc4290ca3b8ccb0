#!/usr/bin/env bash
# The HTTP front's added latency (bench/RESULTS.md): pagoda-bench over NNG (the router) and over
# HTTP (pagoda-gateway, --api openai) on the same CPU group, interleaved, at a few concurrency
# levels, each pair repeated; every run has prompts of its own (a seed of its own: the prefix
# cache must not serve one run what another sent).
#
#   bench/run_http_vs_nng.sh [BUILD_DIR [OUT_DIR]]
#
# The group: the tiny model (pagoda-mkmodel --preset tiny) with tests/data/tiny-text's
# tokenizer, one CPU worker, the gateway on a local port. Environment: LEVELS (concurrency
# levels, default "1 4 16"), REPEATS (default 3), INPUT_LEN (64), OUTPUT_LEN (64). Prints a
# table of the medians over the repeats of each run's mean and p50 TTFT, TPOT and ITL, and the
# difference HTTP - NNG; the JSON reports stay in OUT_DIR.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
out=${2:-$build/http-vs-nng}
bin=$build/bin
levels=${LEVELS:-1 4 16}
repeats=${REPEATS:-3}
input_len=${INPUT_LEN:-64}
output_len=${OUTPUT_LEN:-64}
mkdir -p "$out"
tmp=$(mktemp -d /tmp/pagoda-hvn.XXXXXX)
sup_pid=
cleanup() {
    if [ -n "$sup_pid" ] && kill -0 "$sup_pid" 2>/dev/null; then
        kill -TERM "$sup_pid" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$sup_pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
"$bin/pagoda-mkmodel" --preset tiny --seed 3 --out "$tmp/tiny" >/dev/null
cp "$root/tests/data/tiny-text/tokenizer.json" "$root/tests/data/tiny-text/tokenizer_config.json" \
    "$tmp/tiny/"
mkdir -m 700 "$tmp/run"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
url=ipc://$tmp/client.ipc
"$bin/pagoda-supervisor" --run-dir "$tmp/run" --bin-dir "$bin" --model "$tmp/tiny" --listen "$url" \
    --kv-blocks 4096 --http-listen "127.0.0.1:$port" >"$tmp/supervisor.log" 2>&1 &
sup_pid=$!
for _ in $(seq 1 300); do [ -e "$tmp/run/ready" ] && break; sleep 0.2; done
[ -e "$tmp/run/ready" ] || { cat "$tmp/supervisor.log"; exit 1; }

seed=1000
for c in $levels; do
    n=$((c * 8 > 32 ? c * 8 : 32))
    for r in $(seq 1 "$repeats"); do
        for api in nng http; do
            seed=$((seed + 1))
            args=(--model "$tmp/tiny" --num-prompts "$n" --input-len "$input_len"
                  --output-len "$output_len" --ignore-eos --concurrency "$c" --seed "$seed"
                  --warmup 2 --quiet --json "$out/$api-c$c-r$r.json")
            if [ "$api" = http ]; then
                "$bin/pagoda-bench" --api openai --url "http://127.0.0.1:$port" \
                    --stats-url "$url" "${args[@]}"
            else
                "$bin/pagoda-bench" --url "$url" "${args[@]}"
            fi
        done
    done
done

python3 - "$out" "$levels" "$repeats" <<'PY'
import json, statistics, sys
out, levels, repeats = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
def med(api, c, metric, stat):
    return statistics.median(json.load(open(f"{out}/{api}-c{c}-r{r}.json"))[metric][stat]
                             for r in range(1, repeats + 1))
def tps(api, c):
    return statistics.median(json.load(open(f"{out}/{api}-c{c}-r{r}.json"))["output_tps"]
                             for r in range(1, repeats + 1))
print(f"medians over {repeats} runs each (ms; output tok/s)")
print("| concurrency | metric | NNG | HTTP | HTTP - NNG |")
print("|---|---|---|---|---|")
for c in levels:
    for metric, stat in [("ttft_ms", "mean"), ("ttft_ms", "p50"), ("tpot_ms", "mean"),
                         ("tpot_ms", "p50"), ("itl_ms", "mean"), ("e2e_ms", "mean")]:
        a, b = med("nng", c, metric, stat), med("http", c, metric, stat)
        print(f"| {c} | {metric[:-3].upper()} {stat} | {a:.2f} | {b:.2f} | {b - a:+.2f} |")
    a, b = tps("nng", c), tps("http", c)
    print(f"| {c} | output tok/s | {a:.0f} | {b:.0f} | {b - a:+.0f} |")
PY
