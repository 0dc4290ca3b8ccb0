#!/usr/bin/env bash
# The bundled model (assets/pagoda-brown, trained by tools/train/): it loads and is what its card
# says (pagoda-model-info), and pagoda on the CPU continues the ten prompts of its transformers
# reference (tests/data/pagoda-brown-golden.json) token for token, its logits teacher-forced
# along the reference where a near tie lets the greedy paths part (tests/tools/brown_golden.py).
# Usage: tests/tools/test_brown_model.sh BINDIR
set -euo pipefail
# shellcheck source=tests/check.sh
. "$(dirname "$0")/../check.sh"
bin=${1:?usage: $0 BINDIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
model=$root/assets/pagoda-brown
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin/pagoda-model-info" "$model" >"$tmp/info"
check "pagoda-model-info: Llama, 8 layers, GQA 4/2, head dim 64, vocab 8192, tied, bf16" bash -c "
    grep -q '^architecture: *LlamaForCausalLM' '$tmp/info' && grep -q '^layers: *8$' '$tmp/info' &&
    grep -q '^heads: *4 (KV heads 2, head dim 64)' '$tmp/info' &&
    grep -q '^vocab: *8192$' '$tmp/info' && grep -q '^tied: *yes' '$tmp/info' &&
    grep -q '^dtype: *bfloat16' '$tmp/info'"
check "the weights stay under 16 MiB (one file)" \
    test "$(stat -c %s "$model/model.safetensors")" -le $((16 << 20))
rc=0
python3 "$root/tests/tools/brown_golden.py" "$bin" "$model" \
    "$root/tests/data/pagoda-brown-golden.json" >"$tmp/golden" || rc=$?
cat "$tmp/golden"
check "pagoda on the CPU equals the transformers reference (brown_golden.py)" test "$rc" = 0
check_summary
