#!/usr/bin/env bash
# bench/run_kernels.sh BUILD_DIR: pagoda's CUDA kernels against PyTorch on the GPU machine, in
# one run: correctness first, then timings, then one table.
#   1. tests/gpu's kernel suites (test_cuda_kernels, test_cuda_attention: every kernel against
#      the CPU implementation)
#   2. kernel_bench: pagoda's kernels timed on device buffers (the attention pools allocated as
#      pagoda-kvpool does, by CUDA VMM; KERNEL_BENCH_ARGS="--pool malloc" for cudaMalloc), JSON
#      in OUT_DIR/kernel_bench.json
#   3. bench/kernel_competitor.py: PyTorch SDPA (cuDNN, FlashAttention-2) and torch.matmul on the
#      same shapes and data, checksums compared with pagoda's, the table; JSON in
#      OUT_DIR/kernels.json
# BUILD_DIR is a CUDA build (scripts/build build-gpu -DPAGODA_CUDA=ON, taken along). OUT_DIR
# defaults to $OUT when set (the GPU machine's returned folder), else BUILD_DIR/kernel-bench.
# KERNEL_BENCH_ARGS (e.g. --quick) go to kernel_bench; SKIP_TESTS=1 skips step 1.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd -P)
build=$(cd "${1:?usage: bench/run_kernels.sh BUILD_DIR}" && pwd -P)
out=${OUT_DIR:-${OUT:-$build/kernel-bench}}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
    2>/dev/null || true

if [ "${SKIP_TESTS:-0}" != 1 ]; then
    for t in test_cuda_kernels test_cuda_attention; do
        echo "=== correctness: $t"
        "$build/kernels/$t" 2>&1 | tee "$out/$t.log" | grep -v '^ok'
        [ "${PIPESTATUS[0]}" = 0 ] || { echo "run_kernels.sh: $t failed: no timings"; exit 1; }
    done
fi
echo "=== kernel_bench"
# shellcheck disable=SC2086
"$build/bin/kernel_bench" --json "$out/kernel_bench.json" ${KERNEL_BENCH_ARGS:-} ||
    { echo "run_kernels.sh: kernel_bench failed"; exit 1; }
echo "=== competitor (PyTorch) and the table"
python3 "$root/bench/kernel_competitor.py" "$out/kernel_bench.json" "$out/kernels.json"
