#!/usr/bin/env bash
# bench/run_cpu.sh [BUILD_DIR] [OUT_DIR]: the CPU runs of pagoda-bench recorded in
# bench/RESULTS.md. Starts a group on the bundled tiny model (deploy/pagoda-up, private run dir
# and ipc:// address, the tenants of bench/tenants-multi.json), runs each workload and a rate
# sweep with its plot (OUT_DIR/sweep-cpu.png), keeps every report (OUT_DIR/*.json, *.txt,
# *.jsonl) and prints a table last. Each run has its own seed: prompts the prefix cache has seen
# would hit. Not a test.
#
# The router and pagoda-bench both read bench/tenants-multi.json (groups, a pin, an admin key
# for the figures). PREFIX_CACHE=on|off is passed to pagoda-up --prefix-cache.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd -P)
build=$(cd "${1:-$root/build}" && pwd -P)
out=${2:-$(mktemp -d /tmp/pagoda-bench-cpu-XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd -P)
bin=$build/bin
model=$root/models/tiny
[ -f "$model/config.json" ] ||
    "$bin/pagoda-mkmodel" --preset tiny --seed 1 --out "$model" >/dev/null

bench_tenants=$root/bench/tenants-multi.json
router_tenants=$bench_tenants
stats_key=bench-admin
up_flags=()
[ -z "${PREFIX_CACHE:-}" ] || up_flags+=(--prefix-cache "$PREFIX_CACHE")

run=$(mktemp -d /tmp/pagoda-bc-XXXXXX)
url=ipc://$run/client.ipc
trap '"$root/deploy/pagoda-down" --run-dir "$run" >/dev/null 2>&1 || true; rm -rf "$run"' EXIT
echo "== pagoda-up (router tenants: $(basename "$router_tenants"))"
"$root/deploy/pagoda-up" --run-dir "$run" --bin-dir "$bin" --model "$model" --listen "$url" \
    --kv-blocks 4096 --tenants "$router_tenants" "${up_flags[@]}" >/dev/null

bench() { # NAME FLAGS...
    local name=$1
    shift
    echo "== pagoda-bench $name: $*"
    "$bin/pagoda-bench" --url "$url" --model "$model" --stats-api-key "$stats_key" \
        --json "$out/$name.json" --output-requests "$out/$name.jsonl" "$@" | tee "$out/$name.txt"
}

bench random-rate --api-key bench-carol --workload random --num-prompts 200 \
    --input-len 32:512 --output-len 16:128 --ignore-eos --seed 1 --rate 2
bench random-conc --api-key bench-carol --workload random --num-prompts 200 \
    --input-len 32:512 --output-len 16:128 --ignore-eos --seed 2 --concurrency 16
bench shared-prefix --api-key bench-carol --workload shared-prefix --groups 8 \
    --prompts-per-group 16 --system-prompt-len 1024 --question-len 64 --output-len 64 \
    --ignore-eos --seed 3 --concurrency 16
bench multi-tenant --workload multi-tenant --tenants "$bench_tenants" --num-prompts 100 \
    --system-prompt-len 256 --question-len 64 --output-len 64 --ignore-eos --seed 4 --rate 2
bench sweep --api-key bench-dave --workload random --num-prompts 64 --input-len 32:256 \
    --output-len 16:64 --ignore-eos --seed 10 --sweep 1,2,4,8,16,32 \
    --plot "$out/sweep-cpu.png" \
    --title "pagoda-bench on the CPU: tiny model, random workload (64 requests of 32-256 + \
16-64 tokens per rate)"

python3 - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
def f(v, spec=".1f"):
    return "n/a" if v is None else format(v, spec)
print()
print("| run | arrivals | done | failed | s | req/s | in tok/s | out tok/s | TTFT p50 | TTFT p99 "
      "| TPOT p50 | TPOT p99 | ITL p50 | ITL p99 | E2E p50 | E2E p99 | shared-poll tokens "
      "| cached tokens | hit rate | peak KV | frag. mean | preempt |")
print("|" + "---|" * 22)
rows = []
for name in ["random-rate", "random-conc", "shared-prefix", "multi-tenant"]:
    rows.append((name, json.load(open(os.path.join(out, name + ".json")))))
for r in json.load(open(os.path.join(out, "sweep.json")))["sweep"]:
    rows.append(("sweep", r))
for name, r in rows:
    e = r["engine"]
    arr = (f"rate {r['request_rate']:g}" if r["mode"] == "rate" and r["request_rate"] else
           "all at once" if r["mode"] == "rate" else f"{r['concurrency']} clients")
    print(f"| {name} ({r['workload']}) | {arr} | {r['completed']} | {r['failed']} "
          f"| {r['duration_s']:.1f} | {r['request_throughput']:.2f} | {r['input_tps']:.0f} "
          f"| {r['output_tps']:.0f} | {f(r['ttft_ms']['p50'])} | {f(r['ttft_ms']['p99'])} "
          f"| {f(r['tpot_ms']['p50'], '.2f')} | {f(r['tpot_ms']['p99'], '.2f')} "
          f"| {f(r['itl_ms']['p50'], '.2f')} | {f(r['itl_ms']['p99'], '.2f')} "
          f"| {f(r['e2e_ms']['p50'])} | {f(r['e2e_ms']['p99'])} "
          f"| {100 * (r['polls']['shared_fraction'] or 0):.1f} % | {r['cached_tokens']} "
          f"| {f(e['prefix_hit_rate'], '.3f')} | {f(e['peak_kv_usage'], '.3f')} "
          f"| {f(e['fragmentation_mean'], '.3f')} | {e['preemptions']} |")
print(f"\n(latencies in ms; reports in {out})")
EOF
