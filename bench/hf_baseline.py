#!/usr/bin/env python3
"""The offline baseline of pagoda-bench: the same workload through Hugging Face transformers.

    python3 bench/hf_baseline.py --model DIR --workload FILE [--batch-sizes 64,256]
                                 [--compile auto|forward|none] [--json OUT]

FILE is what `pagoda-bench --dump-workload FILE` wrote (same flags and seed as the pagoda run, so
the same prompts and output lengths). DIR holds the model's config.json; with safetensors there
the weights are loaded, otherwise random weights of that shape are drawn on the GPU (as pagoda's
--load-format random does): the speed does not depend on the values, since EOS is ignored on both
sides.

How it runs, as fast as transformers goes offline: greedy `generate` with a static KV cache
(`cache_implementation="static"`), bf16, on one GPU. Every batch has the same shape -- prompts
left-padded to the workload's longest, `max_new_tokens` the workload's largest, the last batch
filled with copies -- so the compiled graphs are made once per batch size, in an untimed warm-up
batch. `--compile auto` leaves compilation to generate (transformers compiles the decoding
forward pass itself when the cache is static, on CUDA); `forward` compiles model.forward with
torch.compile(mode="reduce-overhead", fullgraph=True) instead, as the transformers guide shows;
`none` runs eager (for comparison). Each batch size in --batch-sizes is timed over the whole
workload; the best is the baseline. A batch size whose static cache and activations do not fit
the GPU (torch's out-of-memory error: 256 of 128 + 1024 tokens on the 8B shape on an 80 GB H100)
is recorded as such and the next smaller power of two is tried in its place, down to 1, stopping
at a size already tried or no larger than one that fit: the baseline is then the largest that
fits, as one would run transformers there.

Throughput counted two ways: `output_tps` counts the tokens the workload asks for (each request's
max_tokens: what pagoda generates with --ignore-eos), which is the figure to compare pagoda's
output tokens/s with; `generated_tps` counts every token generate produced, padding rows and
tokens past a request's max_tokens included.

Prints one JSON line per batch size (an out-of-memory one as {"batch_size": B, "error": ...}) and,
last, {"best": ...}; --json writes all of it ("out_of_memory": the batch sizes that did not fit).
"""
import argparse
import json
import os
import sys
import time


def load_workload(path):
    with open(path) as f:
        w = json.load(f)
    reqs = w["requests"]
    if not reqs:
        sys.exit(f"{path}: no requests")
    prompts = [r["prompt"] for r in reqs]
    outs = [int(r["max_tokens"]) for r in reqs]
    return w, prompts, outs


def load_model(model_dir, torch, transformers):
    config = transformers.AutoConfig.from_pretrained(model_dir)
    has_weights = any(n.endswith(".safetensors") for n in os.listdir(model_dir))
    cls = transformers.AutoModelForCausalLM
    if has_weights:
        try:
            model = cls.from_pretrained(model_dir, dtype=torch.bfloat16, device_map="cuda")
        except TypeError:  # transformers 4: torch_dtype
            model = cls.from_pretrained(model_dir, torch_dtype=torch.bfloat16, device_map="cuda")
    else:
        # Random weights drawn on the GPU: an 8B model initialised on the CPU takes minutes.
        with torch.device("cuda"):
            try:
                model = cls.from_config(config, dtype=torch.bfloat16)
            except TypeError:
                model = cls.from_config(config, torch_dtype=torch.bfloat16)
    if model.dtype != torch.bfloat16:  # an older transformers may ignore dtype=
        model = model.to(torch.bfloat16)
    model.eval()
    return model, has_weights


def run_batch_size(model, torch, prompts, outs, batch, compile_mode, pad_id):
    """Times the whole workload in batches of `batch`; returns a result dict."""
    n = len(prompts)
    width = max(len(p) for p in prompts)
    new_tokens = max(outs)
    dev = "cuda"

    def make_batch(rows):
        ids = torch.full((batch, width), pad_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i in range(batch):
            p = prompts[rows[i % len(rows)]]  # the last batch is filled with copies
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        return ids.to(dev), mask.to(dev)

    gen_kwargs = dict(
        max_new_tokens=new_tokens,
        do_sample=False,
        cache_implementation="static",
        pad_token_id=pad_id,
        eos_token_id=None,  # EOS ignored, as pagoda-bench --ignore-eos
    )
    if compile_mode != "auto":
        gen_kwargs["disable_compile"] = True

    batches = [list(range(s, min(s + batch, n))) for s in range(0, n, batch)]
    # Warm-up (compilation, the static cache's allocation): one batch, not timed.
    ids, mask = make_batch(batches[0])
    with torch.inference_mode():
        t = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, **gen_kwargs)
        torch.cuda.synchronize()
        warmup_s = time.perf_counter() - t
    if out.shape[1] != width + new_tokens:
        sys.exit(f"generate stopped early: {out.shape[1] - width} of {new_tokens} tokens")

    inputs = [make_batch(rows) for rows in batches]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.inference_mode():
        for ids, mask in inputs:
            out = model.generate(input_ids=ids, attention_mask=mask, **gen_kwargs)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    useful = sum(outs)
    generated = len(batches) * batch * new_tokens
    return {
        "batch_size": batch,
        "batches": len(batches),
        "requests": n,
        "prompt_width": width,
        "max_new_tokens": new_tokens,
        "input_tokens": sum(len(p) for p in prompts),
        "output_tokens": useful,
        "time_s": elapsed,
        "warmup_s": warmup_s,
        "output_tps": useful / elapsed,
        "generated_tps": generated / elapsed,
        "request_throughput": n / elapsed,
    }


def is_out_of_memory(torch, e):
    """torch's out-of-memory error, or one a compiled graph raised with it as its message."""
    return isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and
                                                     "out of memory" in str(e))


def release_batch_state(model, torch):
    """What a batch size left behind, run or out of memory: the static cache generate keeps on the
    model for the next call of that shape, the compiled graphs (their memory pools; and the shapes
    dynamo saw, after which --compile forward, torch.compile's default dynamic=None, would compile
    the next size with dynamic shapes), cached blocks; so that each size runs as if it were the
    first, whatever the order."""
    import gc
    # Gone, not None: generate makes a new cache only where the model has no `_cache` attribute.
    # delattr, not the instance dict: where the cache is a torch Module (some transformers
    # versions) the model holds it among its submodules.
    try:
        delattr(model, "_cache")
    except AttributeError:
        pass
    torch._dynamo.reset()
    # The CUDA graphs of reduce-overhead mode and their memory pool: dynamo's reset frees them
    # only in newer torch versions; the explicit call, where torch has it, frees them in all. A
    # failure here costs memory, not the run: said, and the next size tried all the same.
    try:
        from torch._inductor import cudagraph_trees
        cudagraph_trees.reset_cudagraph_trees()
    except (ImportError, AttributeError):
        pass
    except Exception as e:  # noqa: BLE001 -- cleanup only
        print(f"hf_baseline.py: reset_cudagraph_trees: {e}", file=sys.stderr, flush=True)
    gc.collect()
    torch.cuda.empty_cache()


def smaller_batch_sizes(batch):
    """The sizes tried after `batch` did not fit: the powers of two below it, largest first."""
    b = 1
    while b * 2 < batch:
        b *= 2
    out = []
    while b >= 1 and b < batch:
        out.append(b)
        b //= 2
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--model", required=True, help="model dir (config.json, optional weights)")
    ap.add_argument("--workload", required=True, help="pagoda-bench --dump-workload output")
    ap.add_argument("--batch-sizes", default="64,256", help="comma-separated (default 64,256)")
    ap.add_argument("--compile", choices=["auto", "forward", "none"], default="auto")
    ap.add_argument("--seed", type=int, default=0, help="for the random weights")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    import torch
    import transformers

    if not torch.cuda.is_available():
        sys.exit("hf_baseline.py: no CUDA device")
    torch.manual_seed(args.seed)
    w, prompts, outs = load_workload(args.workload)
    model, has_weights = load_model(args.model, torch, transformers)
    vocab = model.config.vocab_size
    if max(max(p) for p in prompts) >= vocab:
        sys.exit(f"the workload has token ids >= the model's vocabulary ({vocab})")
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions and max(len(p) for p in prompts) + max(outs) > positions:
        sys.exit(f"the padded prompt + max_new_tokens exceed {positions} positions")
    # EOS ignored, as pagoda-bench --ignore-eos: generate stops only at max_new_tokens.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    if args.compile == "forward":
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)

    sizes = [int(x) for x in args.batch_sizes.split(",") if x]
    if not sizes or min(sizes) < 1:
        sys.exit(f"--batch-sizes {args.batch_sizes}: positive integers")
    results, out_of_memory, tried = [], [], set()
    for asked in sizes:
        for b in [asked] + smaller_batch_sizes(asked):
            if b in tried:
                break  # run already (or out of memory) as an earlier size's fallback
            if b != asked and any(r["batch_size"] >= b for r in results):
                break  # a fallback no larger than a size that fit: nothing new to learn
            tried.add(b)
            oom = None
            try:
                r = run_batch_size(model, torch, prompts, outs, b, args.compile, pad_id=0)
            except Exception as e:  # noqa: BLE001 -- only out of memory is caught; others re-raised
                if not is_out_of_memory(torch, e):
                    raise
                oom = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            if oom is not None:
                # Released here, past the except: its traceback held generate's frames (the
                # failed batch's cache and activations) until the block ended.
                release_batch_state(model, torch)
                out_of_memory.append(b)
                print(json.dumps({"batch_size": b, "error": "out of memory: " + oom}), flush=True)
                continue
            r.update(workload=w.get("workload"), seed=w.get("seed"), compile=args.compile,
                     weights="file" if has_weights else "random", torch=torch.__version__,
                     transformers=transformers.__version__, gpu=torch.cuda.get_device_name())
            if b != asked:
                r["asked_batch_size"] = asked
            print(json.dumps(r), flush=True)
            results.append(r)
            release_batch_state(model, torch)
            break
    if not results:
        sys.exit(f"hf_baseline.py: no batch size fit the GPU (out of memory at {out_of_memory})")
    best = max(results, key=lambda r: r["output_tps"])
    print(json.dumps({"best": best}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "best": best, "out_of_memory": out_of_memory}, f,
                      indent=2)


if __name__ == "__main__":
    main()
