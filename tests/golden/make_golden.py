#!/usr/bin/env python3
"""Golden logits from Hugging Face transformers, for the CPU forward pass to be checked against.

Runs on the GPU machine (torch and transformers are installed there, not here). For every model
directory under MODELS_DIR (written by tests/hf/make_models.sh with pagoda-mkmodel), loads the
model in float64 on the same BF16 weights with the eager attention implementation, runs prompts
of lengths 1, 17 and 100 (token ids from a fixed generator, recorded in the manifest) and writes
the logits of every position as little-endian float32 to OUT_DIR/<model>.p<len>.f32, plus
OUT_DIR/manifest.json naming each model's files with their SHA-256, so the check knows the
golden data belongs to the model it regenerates.

usage: make_golden.py MODELS_DIR OUT_DIR
"""
import hashlib
import json
import os
import random
import sys

import torch
from transformers import AutoModelForCausalLM

PROMPT_LENGTHS = (1, 17, 100)


def file_hashes(model_dir):
    out = {}
    for name in sorted(os.listdir(model_dir)):
        with open(os.path.join(model_dir, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def main():
    models_dir, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    torch.set_grad_enabled(False)
    manifest = {"generator": "transformers " + __import__("transformers").__version__
                + ", torch " + torch.__version__ + ", float64, eager attention",
                "models": []}
    for name in sorted(os.listdir(models_dir)):
        model_dir = os.path.join(models_dir, name)
        if not os.path.isfile(os.path.join(model_dir, "config.json")):
            continue
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64,
                                                     attn_implementation="eager")
        model.eval()
        vocab = model.config.vocab_size
        rng = random.Random(sum(map(ord, name)))  # fixed per model, not per run
        entry = {"name": name, "files": file_hashes(model_dir), "vocab_size": vocab,
                 "prompts": []}
        for length in PROMPT_LENGTHS:
            tokens = [rng.randrange(vocab) for _ in range(length)]
            ids = torch.tensor([tokens], dtype=torch.long)
            logits = model(input_ids=ids).logits[0]  # [length, vocab], float64
            assert torch.isfinite(logits).all()
            fname = f"{name}.p{length}.f32"
            logits.to(torch.float32).numpy().astype("<f4").tofile(os.path.join(out_dir, fname))
            entry["prompts"].append({"tokens": tokens, "file": fname})
            print(f"{name:28s} len {length:4d}  logits std {logits.std().item():.3f}")
        manifest["models"].append(entry)
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
