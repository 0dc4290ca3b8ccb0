#!/usr/bin/env python3
"""The reference greedy continuations of a model directory (Hugging Face transformers).

    reference.py MODEL_DIR OUT.json

For each of PROMPTS: 64 greedy tokens from transformers in float32 on the CPU over the
directory's weights, each token from a full forward pass over the prompt and the tokens before
it, with the top two ids and logits at every step. The prompt's ids come from the directory's
tokenizer.json (`tokenizers`, nothing added); AutoTokenizer must load the directory and agree.
tests/tools/test_brown_model.sh compares pagoda on the CPU with this file
(tests/data/pagoda-brown-golden.json); tests/gpu/hf_compare.py and cuda_vs_cpu.py take its
prompts. train.py writes it for the model it trains.
"""
import json
import os
import sys

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

GREEDY_TOKENS = 64
# The ten prompts of the reference continuations; the first is the README's.
PROMPTS = [
    "The president of the United States said that",
    "In the morning, the old man walked down to the river and",
    "The results of the experiment show that",
    "She looked at him and said",
    "The city council voted on Tuesday to",
    "It was a cold night in the small town of",
    "The church has always been",
    "Most of the students at the university",
    "After the war, the government",
    "The new method of teaching",
]


def log(*a):
    print(*a, flush=True)


@torch.no_grad()
def greedy_margins(model, prompt, steps, device):
    """Greedy tokens with a KV cache and the top-two logit margin at every step."""
    ids = torch.tensor([prompt], device=device)
    out, margins, past = [], [], None
    for _ in range(steps):
        res = model(input_ids=ids, past_key_values=past, use_cache=True)
        past = res.past_key_values
        top = torch.topk(res.logits[0, -1].double(), 2).values
        margins.append((top[0] - top[1]).item())
        tok = int(torch.argmax(res.logits[0, -1]).item())
        out.append(tok)
        ids = torch.tensor([[tok]], device=device)
    return out, margins


@torch.no_grad()
def reference(model_dir, prompts=PROMPTS):
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    try:
        hf_tok = AutoTokenizer.from_pretrained(model_dir)
    except Exception as e:  # reported; the ids then come from `tokenizers` alone
        log(f"  FAIL: AutoTokenizer cannot load {model_dir}: {e}")
        hf_tok = None
    out = []
    for text in prompts:
        ids = tok.encode(text).ids
        if hf_tok is not None and hf_tok(text)["input_ids"] != ids:
            log(f"  FAIL: AutoTokenizer encodes {text!r} as {hf_tok(text)['input_ids']}, "
                f"tokenizers as {ids}")
        seq, steps = list(ids), []
        for _ in range(GREEDY_TOKENS):
            logits = model(input_ids=torch.tensor([seq])).logits[0, -1].double()
            top = torch.topk(logits, 2)
            steps.append({"top": [int(i) for i in top.indices],
                          "logits": [round(float(v), 6) for v in top.values]})
            seq.append(int(top.indices[0]))
        gen = seq[len(ids):]
        out.append({"prompt": text, "prompt_ids": ids, "tokens": gen, "text": tok.decode(gen),
                    "steps": steps})
        log(f"  {text!r} -> {tok.decode(gen)!r}")
    return out


def write(path, prompts, summary=None):
    doc = {"about": "transformers float32 on the CPU over the model's bf16 weights; greedy, each "
                    "step a full forward pass; steps[i].top: the top two ids, .logits: theirs "
                    "(tools/train/reference.py)",
           "summary": summary, "prompts": prompts}
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    write(out, reference(model_dir))


if __name__ == "__main__":
    sys.exit(main())
