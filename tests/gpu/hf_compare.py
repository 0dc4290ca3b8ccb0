#!/usr/bin/env python3
"""The CUDA forward pass against Hugging Face transformers (float32 on the same BF16 weights).

Runs on the GPU machine. For each model directory given: teacher-forced logits of prompts of
1, 100 and 1000 tokens through `pagoda-logits --backend cuda` compared per position with
transformers' (||logits - ref|| / ||ref|| < 2e-2), and 64 greedy tokens through
`pagoda-run --backend cuda` compared with transformers' greedy continuation up to the first
position where the reference's top two logits are within 0.05 (bf16 results depend slightly on
batch composition; a near tie may flip). Prints a line per check and returns non-zero when one
fails.

usage: hf_compare.py BIN_DIR MODEL_DIR [MODEL_DIR ...]
"""
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import AutoModelForCausalLM

REL_TOL = 2e-2
MARGIN = 0.05
GREEDY_TOKENS = 64


def pagoda_logits(bin_dir, model_dir, tokens, vocab):
    with tempfile.NamedTemporaryFile(suffix=".f32") as f:
        subprocess.run([os.path.join(bin_dir, "pagoda-logits"), "--model", model_dir,
                        "--backend", "cuda", "--chunk", "512", "--out", f.name,
                        "--tokens", ",".join(map(str, tokens))], check=True)
        return np.fromfile(f.name, dtype="<f4").reshape(len(tokens), vocab)


def reference_greedy(model, prompt, steps):
    """Greedy continuation with the reference's logits at every generated position."""
    ids = torch.tensor([prompt], device="cuda")
    out, margins, past = [], [], None
    for _ in range(steps):
        res = model(input_ids=ids, past_key_values=past, use_cache=True)
        past = res.past_key_values
        logits = res.logits[0, -1].double()
        top2 = torch.topk(logits, 2).values
        margins.append((top2[0] - top2[1]).item())
        tok = int(torch.argmax(logits).item())
        out.append(tok)
        ids = torch.tensor([[tok]], device="cuda")
    return out, margins


def compare_tokens(got, want, margins):
    """Equal up to the first near tie of the reference; returns (ok, compared, first_tie)."""
    first_tie = next((i for i, m in enumerate(margins) if m < MARGIN), len(want))
    for i in range(min(first_tie + 1, len(want))):
        if i >= len(got) or got[i] != want[i]:
            return i >= first_tie, i, first_tie
    return True, min(first_tie + 1, len(want)), first_tie


def main():
    bin_dir, model_dirs = sys.argv[1], sys.argv[2:]
    torch.set_grad_enabled(False)
    failed = 0
    rows = []
    for model_dir in model_dirs:
        name = os.path.basename(model_dir.rstrip("/"))
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                     attn_implementation="sdpa").cuda().eval()
        vocab = model.config.vocab_size
        rng = random.Random(1234)
        for length in (1, 100, 1000):
            prompt = [rng.randrange(vocab) for _ in range(length)]
            ref = model(input_ids=torch.tensor([prompt], device="cuda")).logits[0]
            ref = ref.double().cpu().numpy()
            got = pagoda_logits(bin_dir, model_dir, prompt, vocab).astype(np.float64)
            rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
            ok = bool(rel.max() < REL_TOL)
            failed += not ok
            rows.append((name, f"teacher-forced len {length}",
                         f"max rel err {rel.max():.2e} (mean {rel.mean():.2e})", ok))
        for length in (1, 100):
            rng = random.Random(length)
            prompt = [rng.randrange(vocab) for _ in range(length)]
            want, margins = reference_greedy(model, prompt, GREEDY_TOKENS)
            res = subprocess.run([os.path.join(bin_dir, "pagoda-run"), "--backend", "cuda",
                                  "--model", model_dir, "--tokens", ",".join(map(str, prompt)),
                                  "--max-tokens", str(GREEDY_TOKENS), "--ignore-eos", "--json"],
                                 check=True, capture_output=True, text=True)
            got = json.loads(res.stdout.splitlines()[0])["token_ids"]
            ok, compared, tie = compare_tokens(got, want, margins)
            failed += not ok
            rows.append((name, f"greedy 64 after {length}",
                         f"equal over {compared} tokens (first near tie at {tie})", ok))
        del model
        torch.cuda.empty_cache()
    for name, check, figure, ok in rows:
        print(f"{name:16s} {check:26s} {figure:48s} {'ok' if ok else 'FAIL'}")
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
