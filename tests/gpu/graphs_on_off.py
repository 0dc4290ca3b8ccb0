#!/usr/bin/env python3
"""pagoda-run --backend cuda with CUDA graphs on against off: greedy outputs equal, token for token.

Decode steps replay a captured graph with --cuda-graphs on (the default) and run launch by launch
with off (worker/cuda_backend.h). pagoda-run sizes the backend for its prompts, so every decode
step of these runs is a graph's exact batch size: the same kernels and cuBLAS algorithms, hence
the same tokens, bit for bit. Also checks, from --stats, that the run with graphs replayed them
(and the one without did not).

usage: graphs_on_off.py BIN_DIR [tiny|8b ...]   (default: tiny)
  tiny: the random-weight tiny model (pagoda-mkmodel --preset tiny), 16 prompts of random ids
        and lengths, 32 tokens each;
  8b:   the Llama-3-8B shape (bench/models/llama3-8b.json), weights drawn on the GPU
        (--load-format random), 64 prompts of 64 random ids, 64 tokens each.
Prints a line per case and "N passed, M failed".
"""
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(bin_dir, args):
    p = subprocess.run([os.path.join(bin_dir, args[0])] + args[1:], capture_output=True,
                       text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"{args[0]} failed ({p.returncode}): {p.stderr[-2000:]}")
    return p.stdout, p.stderr


def generate(bin_dir, model, prompts, new_tokens, graphs, extra):
    args = ["pagoda-run", "--backend", "cuda", "--model", model, "--max-tokens", str(new_tokens),
            "--ignore-eos", "--json", "--stats", "--cuda-graphs", graphs] + extra
    for p in prompts:
        args += ["--tokens", ",".join(map(str, p))]
    out, err = run(bin_dir, args)
    outputs = [json.loads(line)["token_ids"] for line in out.splitlines() if line.strip()]
    m = re.search(r"(\d+) forward passes \((\d+) replayed a CUDA graph\)", err)
    passes, replays = (int(m.group(1)), int(m.group(2))) if m else (0, -1)
    return outputs, passes, replays


def case(bin_dir, name, model, prompts, new_tokens, extra):
    on, passes_on, replays_on = generate(bin_dir, model, prompts, new_tokens, "on", extra)
    off, passes_off, replays_off = generate(bin_dir, model, prompts, new_tokens, "off", extra)
    same = sum(a == b for a, b in zip(on, off))
    tokens = sum(len(a) for a in on)
    ok = (len(on) == len(prompts) and same == len(prompts) and replays_on > 0 and
          replays_off == 0 and all(len(a) == new_tokens for a in on))
    first = next((i for i, (a, b) in enumerate(zip(on, off)) if a != b), None)
    print(f"{name}: {len(prompts)} prompts, {tokens} tokens: {same}/{len(prompts)} outputs equal; "
          f"graphs on: {replays_on} of {passes_on} passes replayed a graph; off: {replays_off} of "
          f"{passes_off}" + ("" if first is None else f"; first difference in prompt {first}"))
    return ok


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: graphs_on_off.py BIN_DIR [tiny|8b ...]")
    bin_dir = sys.argv[1]
    cases = sys.argv[2:] or ["tiny"]
    tmp = tempfile.mkdtemp()
    passed = failed = 0
    try:
        for c in cases:
            rng = random.Random(15)
            if c == "tiny":
                model = os.path.join(tmp, "tiny")
                run(bin_dir, ["pagoda-mkmodel", "--preset", "tiny", "--seed", "5", "--out", model])
                vocab = json.load(open(os.path.join(model, "config.json")))["vocab_size"]
                prompts = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 200))]
                           for _ in range(16)]
                ok = case(bin_dir, "tiny, batch 16", model, prompts, 32, [])
            elif c == "8b":
                model = os.path.join(tmp, "llama3-8b")
                os.makedirs(model)
                shutil.copy(os.path.join(ROOT, "bench/models/llama3-8b.json"),
                            os.path.join(model, "config.json"))
                vocab = json.load(open(os.path.join(model, "config.json")))["vocab_size"]
                prompts = [[rng.randrange(vocab) for _ in range(64)] for _ in range(64)]
                ok = case(bin_dir, "Llama-3-8B shape (random weights), batch 64", model, prompts,
                          64, ["--load-format", "random", "--seed", "1"])
            else:
                sys.exit(f"graphs_on_off.py: unknown case {c}")
            passed += ok
            failed += not ok
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
