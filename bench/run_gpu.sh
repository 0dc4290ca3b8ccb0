#!/usr/bin/env bash
# bench/run_gpu.sh BUILD_DIR [PART...]: pagoda-bench on the GPU machine, then a table.
#
# BUILD_DIR is a build made with CUDA (scripts/build build-gpu -DPAGODA_CUDA=ON, taken along).
# The model is a Llama-3-8B shape (config.json written here, weights drawn on the GPU by
# --load-format random), unless MODEL_DIR names another. Parts, in this order by default (each
# writes its JSON into OUT_DIR, so that parts can run in separate calls of at most 10 minutes
# and `table` prints whatever is there):
#   hf       the random workload dumped by pagoda-bench (--dump-workload) through Hugging Face
#            transformers generate, static cache, compiled (bench/hf_baseline.py): the baseline
#   random   pagoda, random workload, all at once (--rate inf), prefix cache on and off
#   shared   pagoda, shared-prefix workload (the common defaults: 64 x 16, 2048 + 128, 256),
#            prefix cache on and off
#   ttft     one prompt of TTFT_LEN (8000) tokens alone: pagoda's time to first token (pagoda-bench,
#            5 prompts one at a time, the whole prompt in one step) against transformers + SDPA
#            (cuDNN), one forward pass (bench/hf_ttft.py); not in the default parts
#   floor    pagoda, closed loops of batch 1, 16 and 64 (prompt 1024, 256 tokens each): the
#            measured decode step against the bandwidth floor (weights + K/V bytes read per step
#            over BANDWIDTH_GBS, the device-to-device copy figure of shared/GPU.md)
#   throughput  issue 15's throughput figure: the matrix rate measured first (bench/matrix_rate.py:
#            torch bf16 GEMMs, cuBLAS), then TP_NUM_PROMPTS (512) prompts of TP_INPUT_LEN (128) +
#            TP_OUTPUT_LEN (1024) tokens, TP_CONCURRENCY (256) in flight, through transformers
#            generate (static cache, compiled; HF_BATCH_SIZES; a size that does not fit the GPU
#            falls back to the next smaller power of two) and through pagoda, then the 1024 +
#            256 random workload through pagoda; each pagoda run with its compute-and-bandwidth
#            bound (pagoda-bench --matrix-tflops; MATRIX_TFLOPS skips the measurement; TP_SKIP_1024
#            skips the 1024 + 256 run); then its table; not in the default parts
#   long     an 8-minute run (LONG_DURATION, 480 s) of the realistic workload, LONG_CLIENTS (128)
#            clients, with its timeline (long.json, long.png); not in the default parts
#   engines  two engines sharing the GPU (pagoda-up --engines 2, ENGINES_KV_BYTES (20e9) of pool
#            each) behind one router, cache-aware and round-robin, against one engine with both
#            pools (2 x ENGINES_KV_BYTES): a shared-prefix workload (ENG_GROUPS 32 x ENG_PPG 8,
#            ENG_SYSTEM_LEN 2048 + ENG_QUESTION_LEN 128, ENG_OUTPUT_LEN 64 out, ENG_CONCURRENCY 128):
#            hit rate and throughput;
#            not in the default parts
#   pagesize the page size study: for each of PAGE_SIZES (8 16 32 64) a group with that block
#            size and a pool of PAGE_POOL_BYTES (16e9: about 122k tokens of the 8B shape, so the
#            pool binds), the realistic workload (PAGE_CLIENTS, 256, closed loop) and the
#            shared-prefix workload (32 groups x 16, 2048 + 128, 128 out; 128 clients), each for
#            PAGE_DURATION (40 s); then pagesize_table; not in the default parts
#   pagesize_table  the page size table (also reads kernels.json of bench/run_kernels.sh in
#            OUT_DIR for decode attention TB/s per block size, when there)
#   step     decode_step's step of STEP_BATCH (256) sequences at STEP_CONTEXT (640) keys, six runs
#            of 200 steps back to back (about 15 s at the power limit), with the clock sampled: to
#            set beside the throughput run's ITL on the same machine; STEP_CONTEXT may list several
#            contexts ("128 384 640 896 1152": the run's mean step is their mean only if the step
#            is linear in its context), each in turn; not in the default parts
#   split    the throughput run (TP_* as above) with the worker at debug level, its steps' device
#            time split into staging, layers and LM head, sampling and the idle time before each
#            (bench/step_split.py over its log, graph replays and eager steps apart), then
#            decode_step's step of STEP_BATCH at STEP_CONTEXT (its first; six runs of 200 steps,
#            as the step part) split the same way (split.txt, with the SM clock and power through
#            each): where a run's step is longer than decode_step's, which part is; not in the
#            default parts
#   table    the results as markdown tables
# Where nvidia-smi is found, each pagoda-bench run (and the step part) also samples the GPUs' SM
# clock and power every 250 ms (OUT_DIR/clocks/NAME.csv, summarized in clocks/NAME.json over the
# samples above 40% of the power limit), and the floor and throughput tables show them.
# Prefix cache on/off needs deploy/pagoda-up --prefix-cache; without it each run is done once
# with the engine's default and the table says "default".
#
# Environment (defaults): OUT_DIR (BUILD_DIR/bench-gpu), MODEL_DIR (OUT_DIR/llama3-8b),
# SEED (1), NUM_PROMPTS (512), INPUT_LEN (1024), OUTPUT_LEN (256), SP_GROUPS (64), SP_PPG (16),
# SP_SYSTEM_LEN (2048), SP_QUESTION_LEN (128), SP_OUTPUT_LEN (256), MAX_CONCURRENCY (256),
# HF_BATCH_SIZES (64,256), HF_COMPILE (auto), BANDWIDTH_GBS (4300),
# FLOOR_BATCHES (1 16 64), BACKEND (cuda; cpu with a small MODEL_DIR tries the script here),
# LOAD_FORMAT (random; safetensors reads MODEL_DIR's weights), CUDA_GRAPHS (unset: the worker's
# default, on; off runs every step launch by launch), CUDA_TMA (unset: the worker's default, on;
# off runs a layer's linears of 2 to 16 rows through the GEMVs and cuBLAS, not linear_tma;
# stream-k runs linear_tma with stream-K where it balances), KV_CACHE_DTYPE (unset: bf16; fp8 serves
# with an 8-bit K/V pool, pagoda-up --kv-cache-dtype fp8, and counts one byte a K/V element in the
# floors and bounds), PACK_OUT (unset; 1 packs OUT_DIR into OUT_DIR.tar.gz when the parts are
# done, one file where a device tool returns only so many files from a call).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd -P)
build=$(cd "${1:?usage: bench/run_gpu.sh BUILD_DIR [hf|random|shared|floor|table ...]}" && pwd -P)
shift
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(hf random shared floor table)
bin=$build/bin
out=${OUT_DIR:-$build/bench-gpu}
mkdir -p "$out"
out=$(cd "$out" && pwd -P)
seed=${SEED:-1}
num_prompts=${NUM_PROMPTS:-512}
input_len=${INPUT_LEN:-1024}
output_len=${OUTPUT_LEN:-256}
sp_groups=${SP_GROUPS:-64}
sp_ppg=${SP_PPG:-16}
max_conc=${MAX_CONCURRENCY:-256}
bandwidth=${BANDWIDTH_GBS:-4300}
backend=${BACKEND:-cuda}
load_format=${LOAD_FORMAT:-random}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1

for p in pagoda-bench pagoda-supervisor pagoda-worker; do
    [ -x "$bin/$p" ] || { echo "run_gpu.sh: $bin/$p is missing"; exit 1; }
done
up_help=$("$root/deploy/pagoda-up" --help 2>&1 || true)
if [ "$backend" = cuda ] && ! grep -q -- '--load-format' <<<"$up_help"; then
    echo "run_gpu.sh: deploy/pagoda-up has no --backend cuda / --load-format yet"
    exit 1
fi
if grep -q -- '--prefix-cache' <<<"$up_help"; then
    modes=(on off)
else
    modes=(default)
fi

model=${MODEL_DIR:-$out/llama3-8b}
if [ -z "${MODEL_DIR:-}" ]; then
    # Meta-Llama-3-8B's shape (config.json of the release, rope of Llama 3.0).
    mkdir -p "$model"
    cp "$root/bench/models/llama3-8b.json" "$model/config.json"
fi

random_flags=(--workload random --num-prompts "$num_prompts" --input-len "$input_len"
              --output-len "$output_len" --seed "$seed" --ignore-eos)
shared_flags=(--workload shared-prefix --groups "$sp_groups" --prompts-per-group "$sp_ppg"
              --system-prompt-len "${SP_SYSTEM_LEN:-2048}" --question-len "${SP_QUESTION_LEN:-128}"
              --output-len "${SP_OUTPUT_LEN:-256}" --seed "$seed" --ignore-eos)

run=/tmp/pagoda-gpu-bench-$$
url=ipc://$run.client.ipc
down() { "$root/deploy/pagoda-down" --run-dir "$run" --timeout 120 >/dev/null 2>&1 || true; }
trap 'down; rm -rf "$run"' EXIT

up() { # up MODE [FLAG...]: a group serving the model, prefix cache MODE (on, off or default)
    local mode=$1
    shift
    local args=(--run-dir "$run" --bin-dir "$bin" --model "$model" --listen "$url"
                --backend "$backend" --timeout 600)
    [ "$backend" = cpu ] || args+=(--load-format "$load_format" --seed "$seed")
    [ -z "${CUDA_GRAPHS:-}" ] || args+=(--cuda-graphs "$CUDA_GRAPHS")
    [ -z "${CUDA_TMA:-}" ] || args+=(--cuda-tma "$CUDA_TMA")
    [ -z "${KV_CACHE_DTYPE:-}" ] || args+=(--kv-cache-dtype "$KV_CACHE_DTYPE")
    [ "$mode" = default ] || args+=(--prefix-cache "$mode")
    args+=("$@")
    echo "== pagoda-up ${args[*]}"
    if ! "$root/deploy/pagoda-up" "${args[@]}" >/dev/null; then
        echo "run_gpu.sh: the group did not start"
        exit 1
    fi
}

bench() { # bench NAME FLAGS...: pagoda-bench against the group, report in OUT/NAME.json
    local name=$1 rc=0
    shift
    # an 8-bit pool's K/V bytes in the floors and bounds
    case " $* " in
    *" --bandwidth-gbs "*) [[ ${KV_CACHE_DTYPE:-auto} != fp8* ]] || set -- "$@" --kv-dtype-bytes 1 ;;
    esac
    echo "== pagoda-bench $name: $*"
    clocks_start "$name"
    "$bin/pagoda-bench" --url "$url" --model "$model" --json "$out/$name.json" "$@" \
        | tee "$out/$name.txt" || rc=$?
    clocks_stop
    return "$rc"
}

# The GPUs' SM clock and power through a run (OUT/clocks/NAME.json): at 256 sequences the H200
# holds its 700 W limit at 1,500-1,700 MHz, and the clock differs between machines by more than
# most changes gain (bench/RESULTS.md, thirty-third session). Nothing without nvidia-smi.
clocks_name='' clocks_pid=''
clocks_start() { # clocks_start NAME: samples every 250 ms into OUT/clocks/NAME.csv
    command -v nvidia-smi >/dev/null 2>&1 || return 0
    mkdir -p "$out/clocks"
    clocks_name=$1
    nvidia-smi --query-gpu=clocks.sm,power.draw,power.limit,clocks_throttle_reasons.active \
        --format=csv,noheader,nounits -lms 250 >"$out/clocks/$1.csv" 2>/dev/null &
    clocks_pid=$!
}
clocks_stop() { # the sampling of clocks_start ends; its summary into OUT/clocks/NAME.json
    [ -n "$clocks_pid" ] || return 0
    kill "$clocks_pid" 2>/dev/null || true
    wait "$clocks_pid" 2>/dev/null || true
    clocks_pid=''
    clocks_summary "$out/clocks/$clocks_name.csv" >"$out/clocks/$clocks_name.json" || true
    cat "$out/clocks/$clocks_name.json"
}

clocks_summary() { # clocks_summary CSV: JSON of the samples drawing over 40% of the power limit,
    # with "summary", the tables' cell ("n/a" without such samples)
    python3 - "$1" <<'EOF2'
import json, sys
busy, n = [], 0
for line in open(sys.argv[1]):
    p = [x.strip() for x in line.split(",")]
    try:
        sm, w, limit, why = float(p[0]), float(p[1]), float(p[2]), int(p[3], 16)
    except (ValueError, IndexError):
        continue
    n += 1
    if w > 0.4 * limit:
        busy.append((sm, w, limit, why))
r = {"samples": n, "busy_samples": len(busy)}
if busy:
    r.update(sm_mhz_mean=sum(b[0] for b in busy) / len(busy), sm_mhz_min=min(b[0] for b in busy),
             sm_mhz_max=max(b[0] for b in busy), power_w_mean=sum(b[1] for b in busy) / len(busy),
             power_limit_w=busy[0][2],
             power_capped_fraction=sum(1 for b in busy if b[3] & 0x4) / len(busy))
r["summary"] = "n/a" if not busy else (
    f"{r['sm_mhz_mean']:.0f} MHz, {r['power_w_mean']:.0f} W"
    f"{', capped' if r['power_capped_fraction'] > 0.5 else ''}")
print(json.dumps(r))
EOF2
}

baseline_tps() { # baseline_tps [FILE]: the best output tokens/s of FILE (hf.json), or nothing
    local f=${1:-$out/hf.json}
    [ -f "$f" ] && python3 -c 'import json,sys
print(json.load(open(sys.argv[1]))["best"]["output_tps"])' "$f" || true
}

part_hf() {
    "$bin/pagoda-bench" --model "$model" "${random_flags[@]}" \
        --dump-workload "$out/random-workload.json"
    echo "== hf_baseline.py (batch sizes ${HF_BATCH_SIZES:-64,256}, compile ${HF_COMPILE:-auto})"
    rm -f "$out/hf.json" # never an earlier run's baseline beside this run's figures
    python3 "$root/bench/hf_baseline.py" --model "$model" --workload "$out/random-workload.json" \
        --batch-sizes "${HF_BATCH_SIZES:-64,256}" --compile "${HF_COMPILE:-auto}" \
        --seed "$seed" --json "$out/hf.json" || baseline_failed $?
}

# A baseline that fails (its exit status and its last lines above) does not stop the parts after
# it, whose device time would be lost with it: they run without a baseline, and the script exits
# with 1 at the end.
status=0
baseline_failed() {
    echo "run_gpu.sh: hf_baseline.py failed (exit $1): the runs go on without a baseline" >&2
    status=1
}

part_random() {
    local m base
    base=$(baseline_tps)
    for m in "${modes[@]}"; do
        up "$m"
        bench "random-$m" "${random_flags[@]}" --rate inf --max-concurrency "$max_conc" \
            ${base:+--baseline-tps "$base"}
        down
    done
}

part_shared() {
    local m
    for m in "${modes[@]}"; do
        up "$m"
        bench "shared-$m" "${shared_flags[@]}" --rate inf --max-concurrency "$max_conc"
        down
    done
}

part_floor() {
    local b
    up "${modes[0]}"
    for b in ${FLOOR_BATCHES:-1 16 64}; do
        bench "floor-$b" --workload random --num-prompts "$b" --concurrency "$b" \
            --input-len "$input_len" --output-len "$output_len" --seed "$seed" --ignore-eos \
            --warmup 2 --bandwidth-gbs "$bandwidth" --weight-dtype-bytes 2 --kv-dtype-bytes 2
    done
    down
}

part_ttft() { # one long prompt alone: pagoda's time to first token against transformers'
    local len=${TTFT_LEN:-8000}
    echo "== hf_ttft.py (one prompt of $len tokens, SDPA cuDNN)"
    python3 "$root/bench/hf_ttft.py" --model "$model" --input-len "$len" --seed "$seed" \
        --json "$out/ttft-hf.json"
    # The whole prompt in one step (as transformers does it), the prefix cache off (every prompt
    # is new anyway), a 40 GB pool: the worker's activations at 8192 tokens fit beside it.
    up "${modes[-1]}" --max-batched-tokens "${TTFT_MAX_BATCHED:-8192}" --kv-bytes 40000000000
    bench ttft --workload random --num-prompts 5 --concurrency 1 --input-len "$len" \
        --output-len 1 --seed "$seed" --ignore-eos --warmup 1
    down
}

part_long() {
    local d=${LONG_DURATION:-480}
    up "${modes[0]}"
    bench long --workload realistic --concurrency "${LONG_CLIENTS:-128}" --duration "$d" \
        --timeline-interval 10 --timeline-plot "$out/long.png" --seed "$seed" --ignore-eos \
        --title "pagoda-bench realistic workload, Llama-3-8B shape on the H200, ${d} s"
    down
}

part_engines() { # two engines on the one GPU behind one router against one engine with their memory
    local kv=${ENGINES_KV_BYTES:-20000000000} n
    local flags=(--workload shared-prefix --groups "${ENG_GROUPS:-32}"
                 --prompts-per-group "${ENG_PPG:-8}" --system-prompt-len "${ENG_SYSTEM_LEN:-2048}"
                 --question-len "${ENG_QUESTION_LEN:-128}" --output-len "${ENG_OUTPUT_LEN:-64}" --seed "$seed" --ignore-eos --rate inf
                 --max-concurrency "${ENG_CONCURRENCY:-128}")
    up "${modes[0]}" --kv-bytes $((2 * kv))
    bench engines-1 "${flags[@]}"
    down
    for n in cache-aware round-robin; do
        up "${modes[0]}" --engines 2 --kv-bytes "$kv" --routing "$n"
        bench "engines-2-$n" "${flags[@]}"
        down
    done
    python3 - "$out" <<'EOF2'
import json, os, sys
out = sys.argv[1]
print("| group | completed | output tok/s | TTFT p50 ms | TTFT p95 ms | TPOT p50 ms | prefix hit rate |")
print("|---|---|---|---|---|---|---|")
for name in ("engines-1", "engines-2-cache-aware", "engines-2-round-robin"):
    p = os.path.join(out, name + ".json")
    if not os.path.exists(p):
        print(f"| {name} | missing | | | | | |")
        continue
    r = json.load(open(p))
    e = r["engine"]
    hr = e.get("prefix_hit_rate")
    print(f"| {name} | {r['completed']} | {r['output_tps']:.0f} | {r['ttft_ms']['p50']:.1f} "
          f"| {r['ttft_ms']['p95']:.1f} | {r['tpot_ms']['p50']:.2f} "
          f"| {'n/a' if hr is None else format(hr, '.3f')} |")
EOF2
}

# The throughput workload's pagoda-bench flags (TP_*; the throughput and split parts).
tp_workload=(--workload random --num-prompts "${TP_NUM_PROMPTS:-512}"
             --input-len "${TP_INPUT_LEN:-128}" --output-len "${TP_OUTPUT_LEN:-1024}"
             --seed "$seed" --ignore-eos)
tp_concurrency=${TP_CONCURRENCY:-256}

part_throughput() { # issue 15: 128 + 1024 at 256 in flight against transformers, with bounds
    local tf
    if [ -n "${MATRIX_TFLOPS:-}" ]; then # given (the CPU try of this script)
        printf '{"tflops": %s, "method": "given (MATRIX_TFLOPS)"}\n' "$MATRIX_TFLOPS" \
            >"$out/matrix-rate.json"
    else
        python3 "$root/bench/matrix_rate.py" --json "$out/matrix-rate.json"
    fi
    tf=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tflops"])' \
        "$out/matrix-rate.json")
    "$bin/pagoda-bench" --model "$model" "${tp_workload[@]}" \
        --dump-workload "$out/tp-workload.json"
    if [ -z "${TP_SKIP_HF:-}" ]; then
        echo "== hf_baseline.py (${TP_INPUT_LEN:-128} + ${TP_OUTPUT_LEN:-1024}, batch sizes" \
            "${HF_BATCH_SIZES:-256})"
        rm -f "$out/tp-hf.json"
        python3 "$root/bench/hf_baseline.py" --model "$model" --workload "$out/tp-workload.json" \
            --batch-sizes "${HF_BATCH_SIZES:-256}" --compile "${HF_COMPILE:-auto}" \
            --seed "$seed" --json "$out/tp-hf.json" || baseline_failed $?
    fi
    local base
    base=$(baseline_tps "$out/tp-hf.json")
    up "${modes[0]}"
    bench tp-main "${tp_workload[@]}" --rate inf --max-concurrency "$tp_concurrency" \
        --bandwidth-gbs "$bandwidth" \
        --matrix-tflops "$tf" ${base:+--baseline-tps "$base"}
    [ -n "${TP_SKIP_1024:-}" ] || # (a call short of device time: the 128 + 1024 run alone)
        bench tp-1024 "${random_flags[@]}" --rate inf --max-concurrency "$max_conc" \
            --bandwidth-gbs "$bandwidth" --matrix-tflops "$tf"
    down
    part_throughput_table
}

# decode_step_sustained CONTEXT [FLAG...]: decode_step's step of STEP_BATCH (256) sequences at
# CONTEXT keys, six runs of 200 steps back to back (about 15 s), so that its clock is the one the
# power limit holds, as a serving run's is (103 steps, 1.3 s, read 581-589 W on an H100 where the
# run held 685): the step and split parts.
decode_step_sustained() {
    local b=${STEP_BATCH:-256} c=$1
    shift
    "$bin/decode_step" "$model" --batches "$b,$b,$b,$b,$b,$b" --context "$c" --only shipped \
        --reps 200 --pipelined --kv-cache-dtype "${KV_CACHE_DTYPE:-auto}" "$@"
}

part_step() { # decode_step's step of 256 at the run's mean context, sustained, clock sampled
    local b=${STEP_BATCH:-256} c
    : >"$out/step.txt"
    clocks_start step
    for c in ${STEP_CONTEXT:-640}; do
        echo "== decode_step: $b sequences at context $c, six runs of 200 steps"
        decode_step_sustained "$c" 2>&1 | grep '^batch' |
            sed "s/^/context $c: /" | tee -a "$out/step.txt" || true
    done
    clocks_stop
}

part_split() { # the throughput run's steps split (worker debug log) beside decode_step's
    local b=${STEP_BATCH:-256} ctx=${STEP_CONTEXT:-640} lines
    ctx=${ctx%% *} # the first context when STEP_CONTEXT lists several
    up "${modes[0]}" --log-level debug
    lines=$(wc -l <"$run/worker-0.log")
    bench tp-split "${tp_workload[@]}" --rate inf --max-concurrency "$tp_concurrency" >/dev/null
    grep -E "Output token throughput|^Worker" "$out/tp-split.txt" | tee "$out/split.txt"
    clocks_line "the run" tp-split | tee -a "$out/split.txt"
    grep -E "decode graph" "$run/worker-0.log" | cut -c1-240 | tee -a "$out/split.txt" || true
    tail -n +"$((lines + 1))" "$run/worker-0.log" | python3 "$root/bench/step_split.py" run |
        tee -a "$out/split.txt" || true
    down
    clocks_start split-decode-step
    decode_step_sustained "$ctx" --max-tokens 2048 --debug 2>&1 |
        python3 "$root/bench/step_split.py" "decode_step_${b}_at_$ctx" |
        tee -a "$out/split.txt" || true
    clocks_stop >/dev/null
    clocks_line "decode_step" split-decode-step | tee -a "$out/split.txt"
}

clocks_line() { # clocks_line LABEL NAME: "SM clock, power (busy), LABEL: ..." from clocks/NAME.json
    [ -f "$out/clocks/$2.json" ] || return 0
    python3 -c 'import json, sys; print("SM clock, power (busy), %s: %s" % (sys.argv[1],
json.load(open(sys.argv[2])).get("summary", "n/a")))' "$1" "$out/clocks/$2.json" || true
}

part_throughput_table() {
    python3 - "$out" <<'EOF2'
import json, os, sys
out = sys.argv[1]
def load(n):
    p = os.path.join(out, n + ".json")
    return json.load(open(p)) if os.path.exists(p) else None
m, hf = load("matrix-rate"), load("tp-hf")
if m:
    print(f"matrix rate: {m['tflops']:.0f} TFLOP/s ({m['method']})")
if hf:
    b = hf["best"]
    print(f"transformers generate (static cache, compile {b['compile']}): batch {b['batch_size']}, "
          f"{b['output_tps']:.0f} output tok/s ({b['requests']} requests, {b['time_s']:.1f} s)"
          + (f"; out of memory at batch {', '.join(map(str, hf['out_of_memory']))}"
             if hf.get("out_of_memory") else ""))
def clocks(name):
    return (load(os.path.join("clocks", name)) or {}).get("summary", "n/a")
print("| run | done | failed | out tok/s | / transformers | TTFT p50 ms | TPOT p50 ms | ITL p50 ms "
      "| steps | worker GPU ms a step (wall) "
      "| bound s (prefill + decode) | tok/s at the bound | fraction of the bound "
      "| SM clock, power (busy) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
def num(x, fmt):
    return "n/a" if x is None else format(x, fmt)
for name in ("tp-main", "tp-1024"):
    r = load(name)
    if not r:
        print(f"| {name} | missing | | | | | | | | | | | | |")
        continue
    e = r.get("engine") or {}
    bd = r.get("bound") or {}
    ratio = r["baseline"]["ratio"] if r.get("baseline") else None
    print(f"| {r['workload_params'] or name} | {r['completed']} | {r['failed']} "
          f"| {r['output_tps']:.0f} | {'n/a' if ratio is None else format(ratio, '.2f')} "
          f"| {r['ttft_ms']['p50']:.0f} | {r['tpot_ms']['p50']:.2f} | {r['itl_ms']['p50']:.2f} "
          f"| {e.get('steps', 'n/a')} | {num(e.get('worker_step_device_ms'), '.3f')} "
          f"({num(e.get('worker_step_wall_ms'), '.3f')}) "
          f"| {bd.get('bound_s', float('nan')):.2f} ({bd.get('prefill_s', float('nan')):.2f} + "
          f"{bd.get('decode_s', float('nan')):.2f}) | {bd.get('output_tps', float('nan')):.0f} "
          f"| {bd.get('fraction', float('nan')):.3f} | {clocks(name)} |")
EOF2
}

part_pagesize() {
    local b dur=${PAGE_DURATION:-40}
    for b in ${PAGE_SIZES:-8 16 32 64}; do
        up "${modes[0]}" --block-size "$b" --kv-bytes "${PAGE_POOL_BYTES:-16000000000}"
        bench "page-$b-realistic" --workload realistic --concurrency "${PAGE_CLIENTS:-256}" \
            --duration "$dur" --seed "$seed" --ignore-eos --quiet
        "$bin/pagoda-bench" --model "$model" --workload realistic --seed "$seed" \
            --num-prompts 4096 --dump-workload "$out/page-$b-realistic-workload.json"
        bench "page-$b-shared" --workload shared-prefix --groups 32 --prompts-per-group 16 \
            --system-prompt-len 2048 --question-len 128 --output-len 128 --concurrency 128 \
            --duration "$dur" --seed "$seed" --ignore-eos --quiet
        down
    done
    part_pagesize_table
}

part_pagesize_table() {
    local kv_bytes=2 # the serving runs' K/V element (the kernels' column is bf16's either way)
    [[ ${KV_CACHE_DTYPE:-auto} != fp8* ]] || kv_bytes=1
    python3 - "$out" "${PAGE_POOL_BYTES:-16000000000}" "$kv_bytes" <<'EOF'
import glob, json, math, os, sys
out, pool_bytes, kv_bytes = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
kv_token = 32 * 8 * 128 * 2 * kv_bytes  # the 8B shape: layers x KV heads x head dim x (K, V)
def load(p):
    return json.load(open(p)) if os.path.exists(p) else None
def f(v, spec=".3f"):
    return "n/a" if v is None else format(v, spec)
kern = load(os.path.join(out, "kernels.json"))
tbs = {}
if kern:  # batch 64 x 4096, head dim 128, shuffled tables: decode_b64_c4096_shuf, _bs8, ...
    for c in kern.get("cases", []):
        name = c.get("name", "")
        if (c.get("kind") == "decode" and name.startswith("decode_b64_c4096") and c.get("shuffled")
                and "hd64" not in name and c.get("ms", 0) > 0):
            tbs[c["block_size"]] = c["bytes"] / c["ms"] * 1e-9
print("| block size | workload | done | out tok/s | TTFT p50 | TTFT p95 | TTFT p99 | TPOT p50 "
      "| TPOT p95 | TPOT p99 | frag mean | locality | hit rate | peak running | preempt "
      "| seqs that fit | decode attn TB/s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for p in sorted(glob.glob(os.path.join(out, "page-*-*.json")),
                key=lambda p: (int(os.path.basename(p).split("-")[1]), p)):
    base = os.path.basename(p)[:-5]
    if base.endswith("-workload"):
        continue
    bs, wl = int(base.split("-")[1]), base.split("-", 2)[2]
    r = load(p)
    e = r["engine"]
    fit = None
    w = load(os.path.join(out, f"page-{bs}-realistic-workload.json"))
    if w and wl == "realistic":
        blocks = [math.ceil((len(q["prompt"]) + q["max_tokens"]) / bs) for q in w["requests"]]
        pool_blocks = pool_bytes // (kv_token * bs)
        fit = pool_blocks / (sum(blocks) / len(blocks))
    print(f"| {bs} | {wl} | {r['completed']} | {f(r['output_tps'], '.0f')} "
          f"| {f(r['ttft_ms']['p50'], '.0f')} | {f(r['ttft_ms']['p95'], '.0f')} "
          f"| {f(r['ttft_ms']['p99'], '.0f')} | {f(r['tpot_ms']['p50'], '.2f')} "
          f"| {f(r['tpot_ms']['p95'], '.2f')} | {f(r['tpot_ms']['p99'], '.2f')} "
          f"| {f(e['fragmentation_mean'])} | {f(e['locality_mean'])} | {f(e['prefix_hit_rate'])} "
          f"| {e['running_max']} | {e['preemptions']} | {f(fit, '.0f')} | {f(tbs.get(bs), '.2f')} |")
print(f"\n(pool {pool_bytes / 1e9:.0f} GB for every block size; seqs that fit: pool blocks over "
      f"the realistic workload's mean blocks per sequence at its full length; results in {out})")
EOF
}

part_table() {
    python3 - "$out" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
def load(name):
    p = os.path.join(out, name + ".json")
    return json.load(open(p)) if os.path.exists(p) else None
def f(v, spec=".1f"):
    return "n/a" if v is None else format(v, spec)
hf = load("hf")
if hf:
    b = hf["best"]
    print(f"HF baseline ({b['gpu']}, torch {b['torch']}, transformers {b['transformers']}, "
          f"compile {b['compile']}, {b['weights']} weights): best batch {b['batch_size']}: "
          f"{b['output_tps']:.1f} output tok/s ({b['requests']} requests, {b['time_s']:.1f} s)")
    for r in hf["results"]:
        print(f"  batch {r['batch_size']}: {r['output_tps']:.1f} output tok/s, "
              f"{r['generated_tps']:.1f} generated tok/s")
    for bs in hf.get("out_of_memory", []):
        print(f"  batch {bs}: out of memory")
print()
print("| run | prefix cache | done | failed | req/s | out tok/s | / HF | TTFT p50 | TTFT p99 "
      "| TPOT p50 | TPOT p99 | ITL p99 | E2E p50 | hit rate | peak KV | preempt |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for p in sorted(glob.glob(os.path.join(out, "random-*.json")) +
                glob.glob(os.path.join(out, "shared-*.json"))):
    name = os.path.basename(p)[:-5]
    if name == "random-workload":
        continue
    r = json.load(open(p))
    e = r["engine"]
    ratio = r["baseline"]["ratio"] if r.get("baseline") else (
        r["output_tps"] / hf["best"]["output_tps"] if hf and name.startswith("random") else None)
    print(f"| {r['workload']} | {name.split('-')[-1]} | {r['completed']} | {r['failed']} "
          f"| {f(r['request_throughput'], '.2f')} | {f(r['output_tps'])} | {f(ratio, '.2f')} "
          f"| {f(r['ttft_ms']['p50'])} | {f(r['ttft_ms']['p99'])} "
          f"| {f(r['tpot_ms']['p50'], '.2f')} "
          f"| {f(r['tpot_ms']['p99'], '.2f')} | {f(r['itl_ms']['p99'], '.2f')} "
          f"| {f(r['e2e_ms']['p50'])} | {f(e['prefix_hit_rate'], '.3f')} "
          f"| {f(e['peak_kv_usage'], '.3f')} | {e['preemptions']} |")
ttft, ttft_hf = load("ttft"), load("ttft-hf")
if ttft:
    hf_ms = ttft_hf["ttft_ms_median"] if ttft_hf else None
    p = ttft["ttft_ms"]["p50"]
    print(f"Time to first token, one prompt of {ttft_hf['input_len'] if ttft_hf else '?'} tokens: "
          f"pagoda p50 {f(p)} ms (of {ttft['completed']}), transformers + SDPA (cuDNN) median "
          f"{f(hf_ms)} ms, ratio {f(p / hf_ms if hf_ms else None, '.2f')}")
print()
def clocks(name):
    return (load(os.path.join("clocks", name)) or {}).get("summary", "n/a")
print("| batch | decode step (median ITL) ms | median TPOT ms | wall per engine step ms "
      "| weights GB | K/V GB per step | floor ms | fraction of the floor | SM clock, power (busy) |")
print("|---|---|---|---|---|---|---|---|---|")
for p in sorted(glob.glob(os.path.join(out, "floor-*.json")),
                key=lambda p: int(p.rsplit("-", 1)[1][:-5])):
    r = json.load(open(p))
    fl = r["bandwidth_floor"]
    if not fl:
        print(f"| {os.path.basename(p)} | no floor (failed: {r['failed']}) | | | | | | | |")
        continue
    print(f"| {fl['batch']:.0f} | {fl['decode_step_ms']:.3f} | {f(fl.get('tpot_p50_ms'), '.3f')} "
          f"| {f(fl['step_wall_ms'], '.3f')} "
          f"| {fl['weight_bytes'] / 1e9:.2f} | {fl['kv_bytes_per_step'] / 1e9:.3f} "
          f"| {fl['floor_step_ms']:.3f} | {fl['fraction']:.3f}"
          f"{'' if fl.get('reliable', True) else ' (unreliable: tokens bunched in polls)'} "
          f"| {clocks(os.path.basename(p)[:-5])} |")
print(f"\n(bandwidth {os.environ.get('BANDWIDTH_GBS', '4300')} GB/s; ms; results in {out})")
EOF
}

for p in "${parts[@]}"; do
    case $p in
    hf | random | shared | floor | ttft | long | engines | throughput | throughput_table | split | \
        step | pagesize | pagesize_table | table) "part_$p" ;;
    *) echo "run_gpu.sh: unknown part $p (hf, random, shared, floor, ttft, long, engines," \
            "throughput, throughput_table, split, step, pagesize, pagesize_table, table)"; exit 2 ;;
    esac
done
if [ "${PACK_OUT:-}" = 1 ]; then
    tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
    echo "run_gpu.sh: results packed into $out.tar.gz"
fi
exit $status
