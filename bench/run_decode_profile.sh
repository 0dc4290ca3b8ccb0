#!/usr/bin/env bash
# bench/run_decode_profile.sh BUILD_DIR: where the decode step's GPU time goes (issue 15), on the
# GPU machine, in one run: the kernels' tests, the step timed, the linears against cuBLAS and
# cuBLASLt, then a per-kernel profile of one step per batch and version.
#   1. kernels/test_cuda_kernels and test_cuda_attention (SKIP_TESTS=1 skips them)
#   2. decode_step: the Llama-3-8B shape (random weights), batches 1, 16 and 64 at context 1100,
#      the kernels before issue 15, the shipped ones and the ones with cuda_gemv; device time
#      per step against the bandwidth floor, logits and tokens against the baseline's
#   3. kernel_bench --quick --filter linear_: each linear at 1 to 64 rows through the worker's
#      cublasGemmEx, cuda_gemv and cuBLASLt's heuristic algorithms
#   4. ncu (--clock-control none --cache-control none) over decode_step --profile for each
#      version in VERSIONS (default "baseline cublas"), read by bench/profile_decode.py: time,
#      DRAM bytes and bandwidth per kernel class
# BUILD_DIR is a CUDA build (scripts/build build-gpu -DPAGODA_CUDA=ON). OUT_DIR defaults to $OUT
# when set, else BUILD_DIR/decode-profile. NCU_TIMEOUT (default 60 s) bounds each profile.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd -P)
build=$(cd "${1:?usage: bench/run_decode_profile.sh BUILD_DIR}" && pwd -P)
out=${OUT_DIR:-${OUT:-$build/decode-profile}}
mkdir -p "$out/model"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
    2>/dev/null || true
# Meta-Llama-3-8B's shape (bench/models/llama3-8b.json, as bench/run_gpu.sh uses it).
cp "$root/bench/models/llama3-8b.json" "$out/model/config.json"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    for t in test_cuda_kernels test_cuda_attention; do
        echo "=== correctness: $t"
        "$build/kernels/$t" >"$out/$t.log" 2>&1 ||
            { grep FAIL "$out/$t.log"; echo "$t failed: no timings"; exit 1; }
        tail -1 "$out/$t.log"
    done
fi
echo "=== decode_step"
"$build/bin/decode_step" "$out/model" --reps 30 | tee "$out/decode_step.log" ||
    { echo "decode_step failed"; exit 1; }
echo "=== linears"
"$build/bin/kernel_bench" --json "$out/linears.json" --quick --filter linear_ |
    tee "$out/linears.log" || { echo "kernel_bench failed"; exit 1; }
for v in ${VERSIONS:-baseline cublas}; do
    echo "=== ncu: $v"
    timeout "${NCU_TIMEOUT:-60}" ncu --profile-from-start off --clock-control none \
        --cache-control none --csv --print-units base \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        "$build/bin/decode_step" "$out/model" --reps 1 --profile --only "$v" \
        >"$out/ncu_$v.csv" 2>"$out/ncu_$v.err" || { echo "ncu $v failed"; tail -3 "$out/ncu_$v.err"; }
    python3 "$root/bench/profile_decode.py" "$out/ncu_$v.csv" "$v" 1,16,64
done
