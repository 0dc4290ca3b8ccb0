#!/usr/bin/env bash
# Writes the small models the Hugging Face check (tests/hf/check_load.py) loads, one directory
# each under OUTDIR, with build/bin/pagoda-mkmodel. Every model is small (hidden 64 to 128, two
# layers, vocabulary 256 to 512), so the whole set is a few MB and can be copied to the GPU
# machine. Usage: tests/hf/make_models.sh OUTDIR [BINDIR]
set -euo pipefail
if [[ $# -lt 1 ]]; then
    echo "usage: $0 OUTDIR [BINDIR]" >&2
    exit 2
fi
out=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${2:-$root/build/bin}
mkmodel=$bin/pagoda-mkmodel
[[ -x $mkmodel ]] || { echo "$0: $mkmodel not found (build first)" >&2; exit 1; }
mkdir -p "$out"

small=(--vocab 256 --hidden 64 --intermediate 172 --layers 2 --heads 4 --kv-heads 2)
wide=(--vocab 384 --hidden 128 --intermediate 344 --layers 2 --heads 4 --kv-heads 2)
seed=100
model() {
    local name=$1
    shift
    seed=$((seed + 1))
    "$mkmodel" --out "$out/$name" --force --seed "$seed" "$@"
}

model llama-gqa "${wide[@]}"
model llama-tied "${small[@]}" --tie-embeddings
model llama-mha "${small[@]}" --kv-heads 4
model llama-bias "${small[@]}" --attention-bias
model llama-headdim "${small[@]}" --head-dim 32
model llama3-legacy "${wide[@]}" --rope-type llama3 --rope-factor 8 --rope-low-freq-factor 1 \
    --rope-high-freq-factor 4 --rope-original-max-positions 256 --max-positions 4096 \
    --rope-theta 500000 --legacy-rope
model llama3-params "${small[@]}" --rope-type llama3 --rope-factor 4 \
    --rope-original-max-positions 512 --max-positions 2048 --rope-theta 500000
model llama-linear "${small[@]}" --rope-type linear --rope-factor 2 --legacy-rope
model llama-eos-list "${small[@]}" --bos 0 --eos 1,2,3 --rms-eps 1e-6
model mistral --arch mistral "${small[@]}" --rope-theta 1000000
model qwen2 --arch qwen2 --vocab 512 --hidden 128 --intermediate 256 --layers 2 --heads 4 \
    --kv-heads 2 --rms-eps 1e-6 --rope-theta 1000000
model qwen2-tied --arch qwen2 --vocab 512 --hidden 64 --intermediate 128 --layers 2 --heads 2 \
    --kv-heads 1 --tie-embeddings
model llama-sharded "${small[@]}" --shards 3
model tiny --preset tiny
echo "$0: models in $out: $(du -sh "$out" | cut -f1)"
