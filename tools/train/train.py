#!/usr/bin/env python3
"""Trains pagoda's bundled English model, pagoda-brown, on the Brown corpus (run on the GPU).

    train.py --corpus brown.jsonl --out DIR [--seed 0]

brown.jsonl is tools/train/brown_text.py's output (500 documents in file-name order). Writes:
  DIR/model/      config.json, model.safetensors (bf16), tokenizer.json, tokenizer_config.json:
                  the Hugging Face layout, LlamaForCausalLM
  DIR/loss.png    the training loss and the held-out (dev) loss of each run
  DIR/golden.json the reference greedy continuations of the saved model (reference.py:
                  transformers, float32, on the CPU), 64 tokens for each of its ten prompts
                  with the top two logits at every step: tests/data/pagoda-brown-golden.json
  DIR/log.txt     everything printed
How it is made (the model card, assets/pagoda-brown/README.md, reports the numbers):
- Split, by document index i (0..499): i % 20 == 0 is the test set (25 documents, reported),
  i % 20 == 10 the dev set (25, chooses the run), the other 450 train.
- Tokenizer: byte-level BPE (GPT-2's pre-tokenizer and byte map) of VOCAB tokens trained on the
  train documents with the Hugging Face `tokenizers` library; one special token,
  <|endoftext|> (id 0), BOS and EOS alike, which opens every document in training. Nothing is
  added to a text when it is encoded (no post-processor).
- Model: Llama (SHAPE below: GQA, RoPE theta 10000, SwiGLU, RMSNorm, tied embeddings), about
  8M parameters so that the bf16 file stays under 16 MiB.
- Training: random windows of SEQ+1 tokens from the train documents concatenated, batches of
  BATCH windows, AdamW (betas 0.9/0.95, weight decay 0.1 on
  the matrices, the embedding's or not as RUNS say), linear warm-up then
  cosine decay to a tenth, bf16 autocast, gradient clipping at 1. One run per entry of RUNS
  (each a whole schedule from the same initialization); keep() chooses the run kept: the lowest
  dev loss among the runs sharp enough for greedy comparisons (SHARP_MIN), and its test
  perplexity is reported (non-overlapping windows of SEQ tokens).
Everything random draws from --seed; a GPU run is reproducible up to the nondeterminism of
its kernels' reductions.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import reference

VOCAB = 8192
EOT = "<|endoftext|>"
SHAPE = dict(hidden_size=256, intermediate_size=704, num_hidden_layers=8,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             max_position_embeddings=1024, rms_norm_eps=1e-5)
ROPE_THETA = 10000.0
SEQ = 512
BATCH = 32
LR = 3e-3
WARMUP = 100
EVALS_PER_RUN = 12
# The runs: (epochs, weight decay on the embedding too). Each is a whole schedule from the same
# initialization; see keep() for which one is kept.
RUNS = ((12, True), (12, False), (16, False))
MARGIN = 0.05  # a near tie: the top two logits closer than this (tests/gpu's rule)
SHARP_MIN = 40  # greedy tokens before the first near tie, mean over SELECT_PROMPTS
# Prompts that measure a run's sharpness (not the reference's PROMPTS).
SELECT_PROMPTS = [
    "The committee met on Monday and decided",
    "He opened the door and",
    "The value of the land",
    "In the spring of that year, the farmers",
    "The governor told reporters that the state",
    "Many of the children in the school",
    "The story begins with",
    "According to the report, the company",
    "There is no doubt that the",
    "When the music stopped, she",
]


def log(*a):
    print(*a, flush=True)


def split(docs):
    train, dev, test = [], [], []
    for i, d in enumerate(docs):
        (test if i % 20 == 0 else dev if i % 20 == 10 else train).append(d["text"])
    return train, dev, test


def make_tokenizer(texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOT], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    assert tok.token_to_id(EOT) == 0, tok.token_to_id(EOT)
    if tok.get_vocab_size() != VOCAB:
        log(f"FAIL: the tokenizer has {tok.get_vocab_size()} tokens, not {VOCAB}")
        sys.exit(1)
    return tok


def stream(tok, texts):
    ids = []
    for t in texts:
        ids.append(0)
        ids.extend(tok.encode(t).ids)
    return torch.tensor(ids, dtype=torch.long)


def make_config():
    return LlamaConfig(vocab_size=VOCAB, hidden_act="silu", tie_word_embeddings=True,
                       bos_token_id=0, eos_token_id=0, attention_bias=False, mlp_bias=False,
                       rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
                       **SHAPE)


@torch.no_grad()
def mean_loss(model, data, dtype=torch.bfloat16):
    """Mean next-token loss over non-overlapping windows of SEQ + 1 tokens (each predicts SEQ)."""
    model.eval()
    n = (len(data) - 1) // SEQ
    total, count = 0.0, 0
    for start in range(0, n, 64):
        rows = [data[j * SEQ:j * SEQ + SEQ + 1] for j in range(start, min(n, start + 64))]
        x = torch.stack(rows).cuda()
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            logits = model(input_ids=x[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1),
                                                 reduction="sum")
        total += loss.item()
        count += x[:, 1:].numel()
    model.train()
    return total / count


def train_run(epochs, decay_embed, train_ids, dev_ids, init_state, seed):
    model = LlamaForCausalLM(make_config()).cuda()
    model.load_state_dict(init_state)
    decayed = {n for n, p in model.named_parameters()
               if p.dim() >= 2 and (decay_embed or "embed_tokens" not in n)}
    decay = [p for n, p in model.named_parameters() if n in decayed]
    other = [p for n, p in model.named_parameters() if n not in decayed]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), fused=True)
    steps = epochs * len(train_ids) // (SEQ * BATCH)
    gen = torch.Generator().manual_seed(seed)
    every = max(1, steps // EVALS_PER_RUN)
    curve, dev_curve = [], []
    t0 = time.time()
    for step in range(steps):
        lr = LR * (step + 1) / WARMUP if step < WARMUP else \
            LR * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - WARMUP) / max(1, steps - WARMUP))))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train_ids) - SEQ - 1, (BATCH,), generator=gen)
        x = torch.stack([train_ids[s:s + SEQ + 1] for s in starts.tolist()]).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        curve.append(loss.item())
        if (step + 1) % every == 0 or step + 1 == steps:
            d = mean_loss(model, dev_ids)
            dev_curve.append((step + 1, d))
            log(f"  epochs {epochs:2d} step {step + 1:5d}/{steps} lr {lr:.2e} "
                f"train {sum(curve[-every:]) / len(curve[-every:]):.3f} dev {d:.3f} "
                f"({time.time() - t0:.0f} s)")
    return model, curve, dev_curve


@torch.no_grad()
def sharpness(model, tok):
    """Mean greedy tokens before the first near tie over SELECT_PROMPTS (at most 64 each), in
    float32 over the weights rounded to bf16 as they are shipped."""
    shipped = LlamaForCausalLM(make_config()).cuda().eval()
    shipped.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in
                             model.state_dict().items()})
    total = 0
    for text in SELECT_PROMPTS:
        _, margins = reference.greedy_margins(shipped, tok.encode(text).ids,
                                              reference.GREEDY_TOKENS, "cuda")
        total += next((i for i, m in enumerate(margins) if m < MARGIN), len(margins))
    return total / len(SELECT_PROMPTS)


def keep(runs):
    """The run of the lowest dev loss among those sharp enough (SHARP_MIN: the greedy
    comparisons of tests/gpu stop at the first near tie, and the model is there to make them
    compare dozens of tokens); the sharpest when none is."""
    sharp = [r for r in runs if r["sharpness"] >= SHARP_MIN]
    if sharp:
        return min(sharp, key=lambda r: r["dev"])
    return max(runs, key=lambda r: r["sharpness"])


def plot(runs, best, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, r in enumerate(runs):
        curve, dev_curve = r["curve"], r["dev_curve"]
        color = f"C{i}"
        k = 20
        smooth = [sum(curve[max(0, j - k + 1):j + 1]) / len(curve[max(0, j - k + 1):j + 1])
                  for j in range(len(curve))]
        label = r["name"] + (" (kept)" if r is best else "")
        ax.plot(range(1, len(curve) + 1), smooth, color=color, alpha=0.6, lw=1,
                label=f"train, {label}")
        ax.plot([s for s, _ in dev_curve], [d for _, d in dev_curve], "o-", color=color, ms=3,
                lw=1.5, label=f"dev, {label}")
    ax.set_xlabel("step (32 x 512 tokens)")
    ax.set_ylabel("loss (nats per token)")
    ax.set_ylim(2.5, 7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("pagoda-brown: Brown corpus, byte-level BPE 8192, Llama 8M")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def save(model, tok, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out_dir)
    gen = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOT,
                   "eos_token": EOT, "add_bos_token": False, "add_eos_token": False,
                   "clean_up_tokenization_spaces": False,
                   "model_max_length": SHAPE["max_position_embeddings"]}, f, indent=2)
        f.write("\n")
    # pagoda reads either spelling of RoPE; older readers want the top-level rope_theta too.
    path = os.path.join(out_dir, "config.json")
    cfg = json.load(open(path))
    cfg.setdefault("rope_theta", ROPE_THETA)
    cfg["dtype"] = "bfloat16"
    if "torch_dtype" in cfg:
        cfg["torch_dtype"] = "bfloat16"
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.time()
    docs = [json.loads(line) for line in open(a.corpus, encoding="utf-8")]
    assert len(docs) == 500, len(docs)
    train, dev, test = split(docs)
    tok = make_tokenizer(train)
    train_ids, dev_ids, test_ids = stream(tok, train), stream(tok, dev), stream(tok, test)
    chars = sum(len(t) for t in train)
    log(f"documents: train {len(train)}, dev {len(dev)}, test {len(test)}; tokens: train "
        f"{len(train_ids)} ({chars / len(train_ids):.2f} characters each), dev {len(dev_ids)}, "
        f"test {len(test_ids)}; tokenizer {time.time() - t0:.0f} s")
    init = LlamaForCausalLM(make_config())
    n_params = sum(p.numel() for p in init.parameters())
    log(f"parameters: {n_params} (tied embeddings counted once)")
    init_state = {k: v.clone() for k, v in init.state_dict().items()}
    runs = []
    for i, (epochs, decay_embed) in enumerate(RUNS):
        model, curve, dev_curve = train_run(epochs, decay_embed, train_ids, dev_ids, init_state,
                                            a.seed + i)
        name = f"{epochs} ep" + ("" if decay_embed else ", emb. not decayed")
        r = {"name": name, "epochs": epochs, "decay_embed": decay_embed, "model": model,
             "curve": curve, "dev_curve": dev_curve, "dev": dev_curve[-1][1],
             "sharpness": sharpness(model, tok)}
        runs.append(r)
        log(f"run {name}: final dev loss {r['dev']:.4f} (perplexity {math.exp(r['dev']):.1f}), "
            f"greedy tokens before the first near tie {r['sharpness']:.1f}")
    best = keep(runs)
    log(f"kept: {best['name']}")
    plot(runs, best, os.path.join(a.out, "loss.png"))
    model = best["model"]
    test_bf16 = mean_loss(model, test_ids)
    model_dir = os.path.join(a.out, "model")
    save(model, tok, model_dir)
    # The shipped weights (bf16) in float32, as pagoda and the reference run them.
    shipped = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda()
    test_f32 = mean_loss(shipped, test_ids, dtype=torch.float32)
    dev_f32 = mean_loss(shipped, dev_ids, dtype=torch.float32)
    train_f32 = mean_loss(shipped, train_ids[:len(test_ids)], dtype=torch.float32)
    del shipped
    summary = {"parameters": n_params, "kept": best["name"], "epochs": best["epochs"],
               "decay_embed": best["decay_embed"], "seed": a.seed,
               "tokens": {"train": len(train_ids), "dev": len(dev_ids), "test": len(test_ids)},
               "loss_f32_shipped": {"train_sample": train_f32, "dev": dev_f32, "test": test_f32},
               "perplexity_f32_shipped": {"train_sample": math.exp(train_f32),
                                          "dev": math.exp(dev_f32), "test": math.exp(test_f32)},
               "test_loss_bf16_autocast_before_rounding": test_bf16,
               "runs": [{"name": r["name"], "dev_loss": r["dev"], "sharpness": r["sharpness"]}
                        for r in runs]}
    log("summary: " + json.dumps(summary))
    reference.write(os.path.join(a.out, "golden.json"), reference.reference(model_dir), summary)
    log(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
