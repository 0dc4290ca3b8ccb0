#!/usr/bin/env bash
# The golden-logit test: regenerates the models of tests/hf/make_models.sh, checks that each is
# byte-for-byte the model the golden logits were computed from (SHA-256 in the manifest), then
# compares the CPU forward pass with them (golden_check).
# usage: run_golden.sh BUILD_DIR
set -euo pipefail
build=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bash "$root/tests/hf/make_models.sh" "$tmp" "$build/bin" >/dev/null
python3 - "$root/tests/golden/data/manifest.json" "$tmp" <<'PY'
import hashlib, json, os, sys
manifest, models = sys.argv[1], sys.argv[2]
bad = 0
for m in json.load(open(manifest))["models"]:
    for name, digest in m["files"].items():
        path = os.path.join(models, m["name"], name)
        got = hashlib.sha256(open(path, "rb").read()).hexdigest() if os.path.exists(path) else None
        if got != digest:
            print(f"golden: {m['name']}/{name} differs from the model the golden logits were "
                  f"made from: regenerate them (tests/golden/make_on_gpu.sh)")
            bad += 1
sys.exit(1 if bad else 0)
PY
"$build/tests/golden_check" "$root/tests/golden/data" "$tmp"
