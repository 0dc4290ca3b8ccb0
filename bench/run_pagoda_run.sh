#!/usr/bin/env bash
# pagoda-run tokens/s on the tiny preset (CPU backend, greedy, 32-token prompts, 128 new tokens,
# EOS ignored) at batch 1 and 16; best of 3 runs. Not a test.
# usage: bench/run_pagoda_run.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/bin/pagoda-mkmodel" --preset tiny --seed 1 --out "$tmp/tiny" >/dev/null
echo "| batch | forward passes | tokens | best tokens/s |"
echo "|---|---|---|---|"
for batch in 1 16; do
    args=()
    for i in $(seq 1 "$batch"); do
        args+=(--tokens "$(python3 -c "import random; r = random.Random($i); \
print(','.join(str(r.randrange(512)) for _ in range(32)))")")
    done
    best=0
    for rep in 1 2 3; do
        "$build/bin/pagoda-run" --model "$tmp/tiny" "${args[@]}" --max-tokens 128 --ignore-eos \
            --stats >/dev/null 2>"$tmp/stats"
        tps=$(sed -n 's/.*(\([0-9.]*\) tokens\/s).*/\1/p' "$tmp/stats")
        best=$(python3 -c "print(max($best, $tps))")
    done
    passes=$(sed -n 's/.* \([0-9]*\) forward passes.*/\1/p' "$tmp/stats")
    tokens=$(sed -n 's/.* \([0-9]*\) tokens generated.*/\1/p' "$tmp/stats")
    echo "| $batch | $passes | $tokens | $best |"
done
