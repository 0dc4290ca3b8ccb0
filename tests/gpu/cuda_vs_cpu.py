#!/usr/bin/env python3
"""pagoda-run --backend cuda against the CPU backend on the tiny model, a batch of 16 prompts.

Greedy tokens must be equal up to the first position where the CPU reference's top two logits
are within 0.05 (the margins come from teacher-forced CPU logits, pagoda-logits). Prints a line
per prompt and "N passed, M failed".

usage: cuda_vs_cpu.py BIN_DIR
"""
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

MARGIN = 0.05
NEW_TOKENS = 32


def run(bin_dir, args):
    return subprocess.run([os.path.join(bin_dir, args[0])] + args[1:], check=True,
                          capture_output=True, text=True).stdout


def main():
    bin_dir = sys.argv[1]
    tmp = tempfile.mkdtemp()
    model = os.path.join(tmp, "tiny")
    run(bin_dir, ["pagoda-mkmodel", "--preset", "tiny", "--seed", "5", "--out", model])
    vocab = json.load(open(os.path.join(model, "config.json")))["vocab_size"]
    rng = random.Random(16)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 200))] for _ in range(16)]
    args = []
    for p in prompts:
        args += ["--tokens", ",".join(map(str, p))]
    common = ["--model", model, "--max-tokens", str(NEW_TOKENS), "--ignore-eos", "--json"]
    cpu = [json.loads(l)["token_ids"] for l in run(bin_dir, ["pagoda-run", "--backend", "cpu"]
                                                   + common + args).splitlines()]
    gpu = [json.loads(l)["token_ids"] for l in run(bin_dir, ["pagoda-run", "--backend", "cuda"]
                                                   + common + args).splitlines()]
    passed = failed = 0
    for i, (p, want, got) in enumerate(zip(prompts, cpu, gpu)):
        seq = p + want[:-1]
        out = os.path.join(tmp, "logits.f32")
        run(bin_dir, ["pagoda-logits", "--model", model, "--backend", "cpu", "--out", out,
                      "--tokens", ",".join(map(str, seq))])
        logits = np.fromfile(out, dtype="<f4").reshape(len(seq), vocab)[len(p) - 1:]
        top2 = np.sort(logits, axis=1)[:, -2:]
        margins = top2[:, 1] - top2[:, 0]
        tie = next((j for j, m in enumerate(margins) if m < MARGIN), NEW_TOKENS)
        first_diff = next((j for j in range(NEW_TOKENS) if got[j] != want[j]), NEW_TOKENS)
        ok = first_diff >= tie or first_diff == NEW_TOKENS
        passed += ok
        failed += not ok
        print(f"prompt {i:2d} (len {len(p):3d}): first difference at {first_diff}, "
              f"first near tie at {tie}: {'ok' if ok else 'FAIL'}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
