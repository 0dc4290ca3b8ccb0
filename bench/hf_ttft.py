#!/usr/bin/env python3
"""Time to first token of one long prompt through Hugging Face transformers: the competitor of
`bench/run_gpu.sh ttft`.

    python3 bench/hf_ttft.py --model DIR --input-len 8000 [--repeats 5] [--seed 1] [--json OUT]

DIR holds the model's config.json (random weights drawn on the GPU, as pagoda's --load-format
random does, through hf_baseline.load_model). One forward pass over the whole prompt (bf16, one
GPU, SDPA restricted to the cuDNN backend, logits of the last position only) and the argmax of
its logits: the first token. Timed with CUDA synchronisation after one untimed warm-up, a fresh
random prompt each time; prints the median and every time in ms as one JSON line.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_baseline import load_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--input-len", type=int, default=8000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch
    import transformers
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(a.seed)
    model, _ = load_model(a.model, torch, transformers)
    model.config._attn_implementation = "sdpa"
    vocab = model.config.vocab_size
    times = []
    with torch.inference_mode(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for i in range(a.repeats + 1):
            ids = torch.randint(0, vocab, (1, a.input_len), device="cuda")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(input_ids=ids, logits_to_keep=1, use_cache=True)
            out.logits[:, -1].argmax(-1).item()
            torch.cuda.synchronize()
            if i > 0:
                times.append((time.perf_counter() - t0) * 1000.0)
    r = {"input_len": a.input_len, "ttft_ms_median": statistics.median(times),
         "ttft_ms": times, "torch": torch.__version__, "transformers": transformers.__version__,
         "gpu": torch.cuda.get_device_name(0), "sdpa": "cudnn"}
    print(json.dumps(r))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
