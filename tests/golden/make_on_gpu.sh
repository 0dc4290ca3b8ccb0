#!/usr/bin/env bash
# Run on the GPU machine (torch and transformers installed) from the repository root, with the
# models of tests/hf/make_models.sh in MODELS_DIR (written on the development machine and
# carried along): checks that transformers loads every model (tests/hf/check_load.py), then
# writes golden logits (make_golden.py) into OUT_DIR.
# usage: tests/golden/make_on_gpu.sh MODELS_DIR OUT_DIR
set -euo pipefail
models=$1
out=$2
export PYTHONUNBUFFERED=1
echo "== Hugging Face load check"
python3 tests/hf/check_load.py "$models"
echo "== golden logits"
python3 tests/golden/make_golden.py "$models" "$out"
