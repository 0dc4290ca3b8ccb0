#!/usr/bin/env bash
# Tests of pagoda-run on the tiny preset: batching (one forward pass per step for the whole
# batch; a prompt's tokens are the same alone and among 8 others), seeded sampling (repeats
# exactly, top-k 1 equals greedy, independent of the position in the batch), and bad input
# (each refused with a message naming it and a non-zero exit, never a crash); pagoda-logits'
# flags too.
# Usage: tests/tools/test_pagoda_run.sh BINDIR
set -euo pipefail
# shellcheck source=tests/check.sh
. "$(dirname "$0")/../check.sh"
bin=${1:?usage: $0 BINDIR}
run=$bin/pagoda-run
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin/pagoda-mkmodel" --preset tiny --seed 7 --out "$tmp/tiny" >/dev/null


p1=1,2,3,4,5
others=(--tokens 9,8,7 --tokens 100,200,300,400,500,6,7,8,9,10,11,12,13,14,15,16,17,18
        --tokens 42 --tokens 5,5,5,5 --tokens 300,301 --tokens 17,1,17,1,17,1,17
        --tokens 250,260,270,280,290,300,310,320,330,340,350,360,370,380,390,400,410)

# --- batching
"$run" --model "$tmp/tiny" --tokens $p1 --max-tokens 12 --ignore-eos --json >"$tmp/alone"
"$run" --model "$tmp/tiny" --tokens $p1 "${others[@]}" --max-tokens 12 --ignore-eos --json \
    --stats >"$tmp/batch" 2>"$tmp/stats"
check "a prompt's greedy tokens alone equal those in a batch of 8" \
    test "$(head -1 "$tmp/alone")" = "$(head -1 "$tmp/batch")"
check "8 prompts answered" test "$(wc -l <"$tmp/batch")" -eq 8
check "one forward pass per step for the whole batch (12 tokens: 12 passes)" \
    grep -q "8 prompts, 12 forward passes" "$tmp/stats"
check "prompt order does not change a prompt's tokens" bash -c "
    '$run' --model '$tmp/tiny' ${others[*]} --tokens $p1 --max-tokens 12 --ignore-eos --json |
        tail -1 | cmp -s - <(head -1 '$tmp/batch')"
# A step budget smaller than the prompts: chunked prefill gives the same tokens.
"$run" --model "$tmp/tiny" --tokens $p1 "${others[@]}" --max-tokens 12 --ignore-eos --json \
    --max-batched-tokens 7 >"$tmp/chunked"
check "chunked prefill (7 tokens a step) gives the same tokens" cmp -s "$tmp/batch" "$tmp/chunked"
"$run" --model "$tmp/tiny" --tokens $p1 "${others[@]}" --max-tokens 12 --ignore-eos --json \
    --attention gather --block-size 8 >"$tmp/gather"
# Another attention sums in another order: the tokens agree, the logprobs to rounding.
check "gather attention and block size 8 give the same tokens" bash -c "
    cmp -s <(cut -d']' -f1 '$tmp/batch') <(cut -d']' -f1 '$tmp/gather')"

# --- sampling
sample=(--temperature 0.9 --top-p 0.95 --min-p 0.01 --seed 1234 --max-tokens 16 --ignore-eos)
"$run" --model "$tmp/tiny" --tokens $p1 "${others[@]}" "${sample[@]}" --json >"$tmp/s1"
"$run" --model "$tmp/tiny" --tokens $p1 "${others[@]}" "${sample[@]}" --json >"$tmp/s2"
check "a seeded run repeats exactly" cmp -s "$tmp/s1" "$tmp/s2"
"$run" --model "$tmp/tiny" --tokens $p1 "${others[@]}" --temperature 0.9 --top-p 0.95 \
    --min-p 0.01 --seed 1235 --max-tokens 16 --ignore-eos --json >"$tmp/s3"
check "another seed draws other tokens" bash -c "! cmp -s '$tmp/s1' '$tmp/s3'"
check "sampled tokens differ from greedy ones" bash -c "
    ! cmp -s <(head -1 '$tmp/s1' | cut -d']' -f1) <(head -1 '$tmp/batch' | cut -d']' -f1)"
"$run" --model "$tmp/tiny" "${others[@]}" --tokens $p1 "${sample[@]}" --json >"$tmp/s4"
check "a sequence draws the same tokens whatever its position in the batch" \
    test "$(tail -1 "$tmp/s4")" = "$(head -1 "$tmp/s1")"
"$run" --model "$tmp/tiny" --tokens $p1 --temperature 1.5 --top-k 1 --seed 9 --max-tokens 12 \
    --ignore-eos --json >"$tmp/k1"
check "top-k 1 equals greedy" test "$(cat "$tmp/k1")" = "$(cat "$tmp/alone")"

# --- bad input: a clear message naming the problem, a non-zero exit, no crash
refused() { # refused NAME PATTERN ARGS... (of pagoda-run, or of $prog when set)
    local name=$1 pattern=$2
    shift 2
    local rc=0
    "${prog:-$run}" "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
    if [[ $rc -ne 0 && $rc -lt 128 ]] && grep -q -- "$pattern" "$tmp/err"; then
        passed=$((passed + 1))
        echo "ok   refused: $name"
    else
        failed=$((failed + 1))
        echo "FAIL refused: $name (exit $rc)"
        sed 's/^/     /' "$tmp/err" | head -3
    fi
}
refused "token id at the vocabulary size" "token id 512 is outside the vocabulary" \
    --model "$tmp/tiny" --tokens 1,512 --max-tokens 2
refused "negative token id" "--tokens" --model "$tmp/tiny" --tokens 1,-3 --max-tokens 2
long=$(seq -s, 1 2048 | sed 's/[0-9]\+/7/g')
refused "prompt as long as the model's positions" "2048 positions" \
    --model "$tmp/tiny" --tokens "$long" --max-tokens 2
refused "negative temperature" "--temperature" --model "$tmp/tiny" --tokens 1 --temperature -1
refused "top-p above 1" "--top-p" --model "$tmp/tiny" --tokens 1 --top-p 1.5
refused "top-p of 0" "--top-p: 0 must be in" --model "$tmp/tiny" --tokens 1 --top-p 0
refused "top-k not a number" "--top-k" --model "$tmp/tiny" --tokens 1 --top-k many
refused "min-p above 1" "--min-p" --model "$tmp/tiny" --tokens 1 --min-p 2
refused "zero repetition penalty" "--repetition-penalty: 0 must be" --model "$tmp/tiny" --tokens 1 \
    --repetition-penalty 0
refused "max-tokens 0" "--max-tokens" --model "$tmp/tiny" --tokens 1 --max-tokens 0
refused "block size 7" "--block-size" --model "$tmp/tiny" --tokens 1 --block-size 7
refused "missing model" "config.json" --model "$tmp/nothing" --tokens 1
refused "no prompt" "usage" --model "$tmp/tiny"
refused "--cuda-graphs neither on nor off" "--cuda-graphs: 'maybe' is not on or off" \
    --model "$tmp/tiny" --tokens 1 --cuda-graphs maybe
# The CPU backend has no graphs: the flag is accepted and changes nothing.
"$run" --model "$tmp/tiny" --tokens $p1 --max-tokens 12 --ignore-eos --json --cuda-graphs off \
    >"$tmp/graphs_off"
check "--cuda-graphs off on the CPU backend gives the same tokens" cmp -s "$tmp/alone" \
    "$tmp/graphs_off"

prog=$bin/pagoda-logits
refused "pagoda-logits --backend tpu" "--backend tpu: expected cpu or cuda" \
    --model "$tmp/tiny" --tokens 1,2 --out "$tmp/l" --backend tpu
refused "pagoda-logits --cuda-tma on the CPU" "--cuda-tma needs --backend cuda" \
    --model "$tmp/tiny" --tokens 1,2 --out "$tmp/l" --cuda-tma off
refused "pagoda-logits --cuda-tma neither on, off nor stream-k" \
    "--cuda-tma: 'yes' is not on, off or stream-k" \
    --model "$tmp/tiny" --tokens 1,2 --out "$tmp/l" --backend cuda --cuda-tma yes
unset prog
"$bin/pagoda-logits" --model "$tmp/tiny" --tokens 1,2,3 --out "$tmp/l" --backend cpu
check "pagoda-logits --backend cpu writes 3 positions of the vocabulary's float32 logits" \
    test "$(stat -c %s "$tmp/l")" = $((3 * 512 * 4))

check_summary
