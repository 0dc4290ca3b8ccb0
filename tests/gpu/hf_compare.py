#!/usr/bin/env python3
"""The CUDA forward pass against Hugging Face transformers (float32 on the same BF16 weights).

Runs on the GPU machine. For each model directory given: teacher-forced logits of prompts of
1, 100 and 1000 tokens through `pagoda-logits --backend cuda` compared per position with
transformers' (||logits - ref|| / ||ref|| < 2e-2; the prompt of 100 also in chunks of 16 and of
7 tokens, steps whose layer linears kernels/cuda/linear_tma takes, and in chunks of 16 with
`--cuda-tma off`, the GEMVs' and cuBLAS's way, and `--cuda-tma stream-k`), and 64 greedy tokens through
`pagoda-run --backend cuda` compared with transformers' greedy continuation up to the first
position where the reference's top two logits are within 0.05 (bf16 results depend slightly on
batch composition; a near tie may flip), and from there on teacher-forced: pagoda's logits
(`pagoda-logits --backend cuda`) along the reference's 64 tokens must have the reference's token
as their argmax at every position where the reference has no near tie; the tokens compared
are those positions. Prints a line per check and returns non-zero when one fails.

The 8-bit K/V cache (--kv-cache-dtype fp8, each K and V value its nearest E4M3 code): the
prompts of 100 and 1000 tokens teacher-forced through `pagoda-logits --kv-cache-dtype fp8` (the
100 also in chunks of 16, prefill over cached 8-bit blocks) against the same float32 reference,
within REL_TOL_FP8, with the reference's argmax at FP8_ARGMAX of the positions where the
reference has no near tie (FP8_MARGIN); on a trained model's text prompts, the 64 greedy tokens
through `pagoda-run --kv-cache-dtype fp8` (decode steps reading the 8-bit pool) teacher-forced
against the reference as above, at most FP8_WRONG of them not the reference's argmax beyond a
near tie. These bound the cache's error; bf16's own rows beside them show what 8 bits add.

With --golden FILE (the reference file of a trained model, tests/data/pagoda-brown-golden.json),
the prompts of that file (text, encoded) replace the random ones in the greedy checks of the
models that have a tokenizer.json, and two more checks run on them: the ten prompts' 64 greedy
tokens through `pagoda-run` on the GPU and on the CPU, each compared token for token over all
64 positions with transformers' float32 logits teacher-forced along pagoda's tokens (a token
that is not the reference's argmax passes only at a near tie: within MARGIN of it).

usage: hf_compare.py BIN_DIR MODEL_DIR [MODEL_DIR ...] [--golden FILE]
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
# Tokens compared per text prompt (free-running to the first near tie, then teacher-forced past
# the reference's near ties), on average, below which a trained model's greedy check fails
# (issue 17). pagoda-brown: 24.1 before the first near tie alone (2026-12-01; random-weight
# models: 2 to 6).
MIN_MEAN_COMPARED = 32
# The 8-bit K/V cache's bounds (see the docstring). Measured on an H100 (tests/gpu/RESULTS.md,
# thirty-fourth session): max rel err 3.4e-2 to 6.2e-2 (bf16's 5e-3 to 1.2e-2), the reference's
# argmax at every position without a near tie, 7 of pagoda-brown's 640 greedy tokens wrong.
REL_TOL_FP8 = 1e-1
FP8_MARGIN = 0.5
FP8_ARGMAX = 0.98
FP8_WRONG = 0.03


def pagoda_logits(bin_dir, model_dir, tokens, vocab, chunk=512, tma="on", kv="auto"):
    with tempfile.NamedTemporaryFile(suffix=".f32") as f:
        subprocess.run([os.path.join(bin_dir, "pagoda-logits"), "--model", model_dir,
                        "--backend", "cuda", "--chunk", str(chunk), "--out", f.name,
                        "--cuda-tma", tma, "--kv-cache-dtype", kv,
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


def pagoda_greedy(bin_dir, model_dir, backend, prompts, kv="auto"):
    args = [os.path.join(bin_dir, "pagoda-run"), "--backend", backend, "--model", model_dir,
            "--max-tokens", str(GREEDY_TOKENS), "--ignore-eos", "--json"]
    if kv != "auto":
        args += ["--kv-cache-dtype", kv]
    for p in prompts:
        args += ["--tokens", ",".join(map(str, p))]
    res = subprocess.run(args, check=True, capture_output=True, text=True)
    return [json.loads(line)["token_ids"] for line in res.stdout.splitlines()]


def forced_check(model, prompt, got):
    """The reference's logits along pagoda's tokens: (exact, near_ties, bad) over the positions."""
    seq = torch.tensor([prompt + got[:-1]], device="cuda")
    logits = model(input_ids=seq).logits[0, len(prompt) - 1:].double()
    best = logits.max(dim=1).values
    mine = logits[torch.arange(len(got)), torch.tensor(got, device="cuda")]
    exact = int((mine == best).sum().item())
    bad = int((mine < best - MARGIN).sum().item())
    return exact, len(got) - exact - bad, bad


def main():
    argv = sys.argv[1:]
    golden = None
    if "--golden" in argv:
        i = argv.index("--golden")
        if i + 1 >= len(argv):
            sys.exit("usage: hf_compare.py BIN_DIR MODEL_DIR [MODEL_DIR ...] [--golden FILE]")
        golden = json.load(open(argv[i + 1]))
        del argv[i:i + 2]
    bin_dir, model_dirs = argv[0], argv[1:]
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
            # len 100 also in chunks of 16 and 7 tokens: steps of 2 to 16 rows, whose layer
            # linears go through kernels/cuda/linear_tma where their shapes fit it; and in
            # chunks of 16 without it (--cuda-tma off)
            ways = [(512, "on"), (16, "on"), (7, "on"), (16, "off"), (16, "stream-k")] \
                if length == 100 else [(512, "on")]
            for chunk, tma in ways:
                got = pagoda_logits(bin_dir, model_dir, prompt, vocab, chunk,
                                    tma).astype(np.float64)
                rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
                ok = bool(rel.max() < REL_TOL)
                failed += not ok
                how = ("" if chunk == 512 else f" in chunks of {chunk}") + \
                    ("" if tma == "on" else f", --cuda-tma {tma}")
                rows.append((name, f"teacher-forced len {length}{how}",
                             f"max rel err {rel.max():.2e} (mean {rel.mean():.2e})", ok))
            if length == 1:
                continue
            # The 8-bit K/V cache against the same reference.
            top2 = np.sort(ref, axis=1)[:, -2:]
            sure = top2[:, 1] - top2[:, 0] >= FP8_MARGIN
            for chunk in ((512, 16) if length == 100 else (512,)):
                got = pagoda_logits(bin_dir, model_dir, prompt, vocab, chunk,
                                    kv="fp8").astype(np.float64)
                rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
                same = int((np.argmax(got, axis=1) == np.argmax(ref, axis=1))[sure].sum())
                ok = bool(rel.max() < REL_TOL_FP8) and same >= FP8_ARGMAX * int(sure.sum())
                failed += not ok
                how = "" if chunk == 512 else f" in chunks of {chunk}"
                rows.append((name, f"fp8 K/V teacher-forced len {length}{how}",
                             f"max rel err {rel.max():.2e} (mean {rel.mean():.2e}); "
                             f"argmax {same}/{int(sure.sum())}", ok))
        text = golden is not None and os.path.exists(os.path.join(model_dir, "tokenizer.json"))
        if text:
            greedy = [(f"greedy 64 after text {i}", p["prompt_ids"])
                      for i, p in enumerate(golden["prompts"])]
        else:
            greedy = []
            for length in (1, 100):
                rng = random.Random(length)
                greedy.append((f"greedy 64 after {length}",
                               [rng.randrange(vocab) for _ in range(length)]))
        compared_total = 0
        for check, prompt in greedy:
            want, margins = reference_greedy(model, prompt, GREEDY_TOKENS)
            res = subprocess.run([os.path.join(bin_dir, "pagoda-run"), "--backend", "cuda",
                                  "--model", model_dir, "--tokens", ",".join(map(str, prompt)),
                                  "--max-tokens", str(GREEDY_TOKENS), "--ignore-eos", "--json"],
                                 check=True, capture_output=True, text=True)
            got = json.loads(res.stdout.splitlines()[0])["token_ids"]
            ok, free, tie = compare_tokens(got, want, margins)
            # Past the first near tie: teacher-forced along the reference's tokens.
            pl = pagoda_logits(bin_dir, model_dir, prompt + want[:-1], vocab)[len(prompt) - 1:]
            sure = [j for j in range(GREEDY_TOKENS) if margins[j] >= MARGIN]
            wrong = [j for j in sure if int(np.argmax(pl[j])) != want[j]]
            ok = ok and not wrong
            failed += not ok
            compared_total += len(sure)
            rows.append((name, check,
                         f"equal over {free} (first near tie at {tie}); forced: "
                         f"{len(sure) - len(wrong)}/{len(sure)} argmax", ok))
        # A trained model's logits are sharp: its text prompts must be compared far (a property
        # of the model and the prompts that the issue asks of them, checked as such).
        if text:
            mean = compared_total / len(greedy)
            ok = mean >= MIN_MEAN_COMPARED
            failed += not ok
            rows.append((name, "greedy: mean tokens compared",
                         f"{mean:.1f} per prompt (forced past near ties)", ok))
        if text:
            prompts = [p["prompt_ids"] for p in golden["prompts"]]
            for backend in ("cuda", "cpu"):
                outs = pagoda_greedy(bin_dir, model_dir, backend, prompts)
                exact = ties = bad = 0
                for prompt, got in zip(prompts, outs):
                    e, t, b = forced_check(model, prompt, got)
                    exact, ties, bad = exact + e, ties + t, bad + b
                ok = bad == 0 and all(len(o) == GREEDY_TOKENS for o in outs)
                failed += not ok
                rows.append((name, f"10 texts x 64, {backend} vs forced",
                             f"{exact} argmax, {ties} near ties, {bad} wrong of "
                             f"{len(prompts) * GREEDY_TOKENS}", ok))
            outs = pagoda_greedy(bin_dir, model_dir, "cuda", prompts, kv="fp8")
            exact = ties = bad = 0
            for prompt, got in zip(prompts, outs):
                e, t, b = forced_check(model, prompt, got)
                exact, ties, bad = exact + e, ties + t, bad + b
            ok = bad <= FP8_WRONG * len(prompts) * GREEDY_TOKENS and \
                all(len(o) == GREEDY_TOKENS for o in outs)
            failed += not ok
            rows.append((name, "10 texts x 64, cuda fp8 K/V vs forced",
                         f"{exact} argmax, {ties} near ties, {bad} wrong of "
                         f"{len(prompts) * GREEDY_TOKENS}", ok))
        del model
        torch.cuda.empty_cache()
    for name, check, figure, ok in rows:
        print(f"{name:16s} {check:30s} {figure:48s} {'ok' if ok else 'FAIL'}")
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
