#!/usr/bin/env bash
# The process group on the GPU through deploy/, on the GPU machine, from a build with CUDA.
#
#   tests/gpu/group_gpu.sh BUILD_DIR
#
# 1. deploy/pagoda-up --backend cuda --load-format random --seed 7 on a config-only model of the
#    Llama shape tests/gpu uses, the pool sized by default: kvpool logs the pool's size in
#    blocks and tokens, the pool takes most of the GPU, a request is answered; after
#    deploy/pagoda-down the GPU's free memory is back to what it was before the start.
# 2. A --kv-bytes that leaves the worker 2 GiB (its weights alone take 2.3 GB): the worker
#    refuses to start and says by how much, the supervisor does not restart it, pagoda-up fails,
#    and the memory is back.
# 3. kill -9 of kvpool with the default pool (deploy/keeper.h): the supervisor offers the pool
#    its predecessor deposited to the restarted kvpool, which re-adopts it (the same pool id, no
#    second pool's memory taken); a repeated 64-token prompt still finds its prefix cached and
#    gets the same greedy tokens (the KV survived). Then kill -9 of kvpool and the worker
#    together, so that the supervisor alone holds the pool until they are back: the same again.
#    After pagoda-down the memory is back.
# Prints a line per check and "N passed, M failed"; exits 77 when there is no CUDA device.
set -uo pipefail
# shellcheck source=tests/check.sh
. "$(dirname "$0")/../check.sh"
build=$(cd "${1:?usage: group_gpu.sh BUILD_DIR}" && pwd -P)
root=$(cd "$(dirname "$0")/../.." && pwd -P)
bin=$build/bin
meminfo=$build/tests/gpu_meminfo
# Free memory may differ this much between two measures with the same processes.
tolerance=$((64 << 20))
if [ ! -x "$meminfo" ] || ! "$meminfo" >/dev/null 2>&1; then
    echo "SKIP group_gpu: no CUDA build or no CUDA device here (GPU tests run on the GPU machine)"
    exit 77
fi
tmp=$(mktemp -d /tmp/pagoda-gpu-XXXXXX)
cleanup() {
    for r in "$tmp"/run*; do
        [ -d "$r" ] && "$root/deploy/pagoda-down" --run-dir "$r" --timeout 60 >/dev/null 2>&1
    done
    rm -rf -- "$tmp"
}
trap cleanup EXIT
free_bytes() { "$meminfo" | cut -d' ' -f1; }
mib() { echo $(($1 >> 20)); }
# Waits up to 30 s for the free memory to be back at $1 (within the tolerance); prints it.
wait_back() {
    local f i
    for ((i = 0; i < 60; i++)); do
        f=$(free_bytes)
        [ $((f + tolerance)) -lt "$1" ] || break
        sleep 0.5
    done
    echo "$f"
}
# Checks that the free memory comes back to $before (within the tolerance): check "$1: ...".
check_memory_back() {
    local after
    after=$(wait_back "$before")
    check "$1: $(mib "$after") MiB free after, $(mib "$before") before" \
        [ $((after + tolerance)) -ge "$before" ]
}
show_logs() {
    for f in "$1"/supervisor.log "$1"/kvpool.log "$1"/worker-0.log; do
        [ -f "$f" ] && { echo "---- tail of $f"; tail -n 12 "$f"; }
    done
}

model=$tmp/llama-4l
mkdir -p "$model"
cat >"$model/config.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
 "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
 "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 8,
 "head_dim": 128, "max_position_embeddings": 4096, "rms_norm_eps": 1e-05,
 "rope_theta": 500000.0, "tie_word_embeddings": false, "attention_bias": false,
 "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}
EOF
up() { # up RUN_DIR FLAGS...: pagoda-up on the GPU with random weights
    local run=$1
    shift
    "$root/deploy/pagoda-up" --run-dir "$run" --bin-dir "$bin" --model "$model" \
        --listen "ipc://$run.client.ipc" --backend cuda --load-format random --seed 7 \
        --timeout 180 "$@"
}

# ---- 1. the default pool, a request, the memory released --------------------------------------
run=$tmp/run1
before=$(free_bytes)
echo "GPU 0: $(mib "$before") MiB free before the group starts"
up "$run" >"$tmp/up1.out" 2>"$tmp/up1.err" && rc=0 || rc=$?
check "pagoda-up --backend cuda starts the group (exit $rc)" [ "$rc" = 0 ]
[ "$rc" = 0 ] || { cat "$tmp/up1.err"; show_logs "$run"; }
grep -h 'by default\|kv pool on GPU\|handed the KV pool' "$run/kvpool.log" 2>/dev/null
grep -h 'mapped the KV pool\|beside the KV pool' "$run/worker-0.log" 2>/dev/null
line=$(grep -h 'kv pool on GPU' "$run/kvpool.log" 2>/dev/null | tail -n 1)
tokens=$(sed -n 's/.* usable, \([0-9]*\) tokens).*/\1/p' <<<"$line")
check "kvpool reports the pool's size in blocks and tokens (${tokens:-no} tokens)" \
    [ "${tokens:-0}" -gt 0 ]
during=$(free_bytes)
check "the default pool takes most of the GPU ($(mib "$during") MiB free while it runs)" \
    [ $((during * 10)) -lt "$before" ]
answer=$("$bin/pagoda" --url "ipc://$run.client.ipc" generate --tokens 1,2,3,4,5 \
    --max-tokens 8 --ignore-eos --json 2>"$tmp/gen.err")
echo "$answer"
n=$(python3 -c 'import json,sys; print(len(json.loads(sys.stdin.read())["token_ids"]))' \
    <<<"$answer" 2>/dev/null)
check "the group on the GPU answers a request (${n:-no} tokens of 8)" [ "${n:-0}" = 8 ]
"$root/deploy/pagoda-down" --run-dir "$run" >"$tmp/down1.out" 2>&1 && rc=0 || rc=$?
check "pagoda-down drains and stops the group (exit $rc)" [ "$rc" = 0 ]
grep -h 'released\|handed out' "$run/kvpool.log" 2>/dev/null
check_memory_back "the pool's memory is released"

# ---- 2. a budget that cannot fit: the worker refuses -----------------------------------------
run=$tmp/run2
before=$(free_bytes)
kv=$((before - (2 << 30)))
up "$run" --kv-bytes "$kv" >"$tmp/up2.out" 2>"$tmp/up2.err" && rc=0 || rc=$?
check "pagoda-up fails when the worker cannot fit beside a pool of $(mib "$kv") MiB (exit $rc)" \
    [ "$rc" != 0 ]
refusal=$(grep -h 'refusing to start' "$run/worker-0.log" 2>/dev/null | tail -n 1)
echo "${refusal:-(no refusal logged)}"
check "the worker refuses to start and says by how much" grep -q 'short by [0-9]* MiB' <<<"$refusal"
starts=$(grep -c 'starting worker-0' "$run/worker-0.log" 2>/dev/null)
check "the supervisor did not restart it (${starts:-0} start)" [ "${starts:-0}" = 1 ]
check "the supervisor says why it stopped the group" \
    grep -q 'worker-0.*cannot run as configured' "$run/supervisor.log"
[ "$failed" = 0 ] || show_logs "$run"
check_memory_back "the memory is back after the refusal"

# ---- 3. kill -9 of kvpool: the pool is kept by the supervisor and re-adopted ----------------
run=$tmp/run3
before=$(free_bytes)
up "$run" >"$tmp/up3.out" 2>"$tmp/up3.err" && rc=0 || rc=$?
check "pagoda-up for the kill -9 of kvpool (exit $rc)" [ "$rc" = 0 ]
[ "$rc" = 0 ] || { cat "$tmp/up3.err"; show_logs "$run"; }
prompt=$(seq -s, 101 164)
ask() { # the same 64-token prompt, greedy; prints "TOKENS CACHED" (retried for up to 2 minutes
    # while the group comes back)
    local out deadline=$((SECONDS + 120))
    while [ "$SECONDS" -lt "$deadline" ]; do
        out=$(timeout 30 "$bin/pagoda" --url "ipc://$run.client.ipc" generate --tokens "$prompt" \
            --max-tokens 16 --ignore-eos --json 2>>"$tmp/ask.err") &&
            python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); \
print(",".join(map(str, r["token_ids"])), r["usage"]["cached_tokens"])' <<<"$out" && return 0
        sleep 2
    done
    echo "none -1"
}
pool_id() { sed -n 's/.*kv pool on GPU.*pool id \([0-9a-f]*\).*/\1/p' "$run/kvpool.log" | tail -n 1; }
read -r first _ <<<"$(ask)"
read -r tokens cached <<<"$(ask)"
check "the prompt asked twice gets the same tokens, the second time from the cache ($cached)" \
    [ "$tokens" = "$first" -a "${cached:-0}" -gt 0 ]
id=$(pool_id)
during=$(free_bytes)
echo "pool ${id:-?}, $(mib "$during") MiB free while the group runs"
for round in 1 2; do
    victims=$(pgrep -f "pagoda-kvpool.*$run" | head -n 1)
    what=kvpool
    if [ "$round" = 2 ]; then
        victims="$victims $(pgrep -f "pagoda-worker.*$run" | head -n 1)"
        what="kvpool and the worker"
    fi
    # shellcheck disable=SC2086
    set -- $victims
    check "round $round: $what running (pids: ${victims:-none})" [ "$#" = "$round" ]
    starts=$(grep -c 'kv pool on GPU' "$run/kvpool.log")
    # shellcheck disable=SC2086
    kill -9 $victims
    for ((i = 0; i < 120; i++)); do
        [ "$(grep -c 'kv pool on GPU' "$run/kvpool.log")" -gt "$starts" ] && break
        sleep 0.5
    done
    read -r again cached_again <<<"$(ask)"
    grep -h 're-adopting\|offers pool' "$run/kvpool.log" | tail -n 2
    check "after kill -9 of $what the restarted kvpool re-adopts pool $id ($(pool_id))" \
        [ "$(pool_id)" = "$id" -a "$(grep -c 'left by the kvpool before this one: re-adopting' \
            "$run/kvpool.log")" = "$round" ]
    now=$(free_bytes)
    check "no second pool: $(mib "$now") MiB free, $(mib "$during") before the kill" \
        [ $((now + tolerance)) -ge "$during" ]
    check "after kill -9 of $what the prompt gets the same tokens from the cache ($cached_again)" \
        [ "$again" = "$first" -a "${cached_again:-0}" = "$cached" ]
done
grep -h 'deposited\|offering' "$run/supervisor.log" 2>/dev/null | tail -n 2
"$root/deploy/pagoda-down" --run-dir "$run" >"$tmp/down3.out" 2>&1 && rc=0 || rc=$?
check "pagoda-down stops the group (exit $rc)" [ "$rc" = 0 ]
check "the supervisor lets go of the pool it kept" \
    grep -q "letting go of kvpool's pool" "$run/supervisor.log"
[ "$failed" = 0 ] || show_logs "$run"
check_memory_back "the kept pool's memory is released"

check_summary
