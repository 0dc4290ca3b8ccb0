#!/usr/bin/env python3
"""The competitor of bench/kernel_bench on the same shapes and the same data, then one table.

    kernel_competitor.py PAGODA_JSON OUT_JSON

Reads kernel_bench's JSON, rebuilds each case's inputs in PyTorch from the same generator
(cuda_fill_random_bf16 of kernels/cuda/util.cu: splitmix64 of (seed, stream id, index), std 1,
offset 0; checked against the first elements kernel_bench recorded), lays each sequence's K/V
out contiguously from the same pool bytes through the same block table, and times:
  - attention: torch SDPA with the cuDNN backend and with the FlashAttention-2 backend
    (decode: the query heads of one KV head as the queries of that head, which reads each K/V
    byte once, and enable_gqa where the backend takes it: the faster counts; prefill: causal;
    append: bottom-right causal, 512 queries against 4608 keys);
  - linears: torch.matmul(x, w.T) (cuBLAS), weights rotated among as many copies as kernel_bench
    used.
Each competitor's output is compared with pagoda's checksum (sum |x|, sum x * (i % 7 - 3)).
Prints the table (time, TB/s or TFLOP/s, ratio pagoda / competitor in speed) and writes OUT_JSON.
"""
import json
import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

M64 = (1 << 64) - 1
WARMUP, REPS = 3, 15


def s64(c):
    c &= M64
    return c - (1 << 64) if c >= (1 << 63) else c


def srl(x, k):  # logical right shift of int64 bit patterns
    return (x >> k) & ((1 << (64 - k)) - 1)


def splitmix64(x):
    x = x + s64(0x9E3779B97F4A7C15)
    x = (x ^ srl(x, 30)) * s64(0xBF58476D1CE4E5B9)
    x = (x ^ srl(x, 27)) * s64(0x94D049BB133111EB)
    return x ^ srl(x, 31)


def fill_bf16(n, seed, stream_id, std=1.0):
    """cuda_fill_random_bf16(dst, n, seed, stream_id, std, 0.0) in PyTorch, on the GPU."""
    key = s64((seed * 0x2545F4914F6CDD1D) ^ ((stream_id + 1) * 0x9E3779B97F4A7C15))
    a = torch.tensor(1.7320508, dtype=torch.float32) * torch.tensor(std, dtype=torch.float32)
    out = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    chunk = 1 << 26
    for s in range(0, n, chunk):
        i = torch.arange(s, min(n, s + chunk), dtype=torch.int64, device="cuda")
        r = splitmix64(splitmix64(i) ^ key)
        u = srl(r, 40).to(torch.float32) * (1.0 / 16777216.0)
        out[s:s + i.numel()] = (a.cuda() * (2.0 * u - 1.0)).to(torch.bfloat16)
        del i, r, u
    return out


def checksum(y):
    y = y.reshape(-1).double()
    w = (torch.arange(y.numel(), device=y.device) % 7 - 3).double()
    return y.abs().sum().item(), (y * w).sum().item()


def time_ms(fn):
    for _ in range(WARMUP):
        fn(0)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(REPS)]
    for i, (a, b) in enumerate(ev):
        a.record()
        fn(i)
        b.record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(b) for a, b in ev)
    return t[REPS // 2]


def same(c, y):
    """pagoda's checksum against this output's: equal data and function, bf16 rounding aside."""
    sa, sw = checksum(y)
    scale = max(c["sum_abs"], 1e-30)
    err = max(abs(sa - c["sum_abs"]), abs(sw - c["sum_w"])) / scale
    return err, err < 2e-3


def attention_case(c, seed):
    nh, nkv, hd, bs = c["num_heads"], c["num_kv_heads"], c["head_dim"], c["block_size"]
    B, ctx, ql = c["batch"], c["context_len"], c["query_len"]
    nblk = c["num_blocks"]
    pool = fill_bf16(nblk * 2 * nkv * bs * hd, seed, 1)
    q = fill_bf16(B * ql * nh * hd, seed, 2)
    gen_ok = (pool[:4].view(torch.int16).tolist() == [x - 65536 if x >= 32768 else x for x in c["pool_head"]]
              and q[:4].view(torch.int16).tolist() == [x - 65536 if x >= 32768 else x for x in c["q_head"]])
    nb = (ctx + bs - 1) // bs
    total = B * nb
    i = torch.arange(total, dtype=torch.int64, device="cuda")
    if c["shuffled"]:
        table = 1 + (i * c["shuffle_mult"] + total // 3) % total
    else:
        table = 1 + i
    table = table.view(B, nb)
    pool = pool.view(nblk, 2, nkv, bs, hd)
    # [B, nb, nkv, bs, hd] -> [B, nkv, nb * bs, hd] -> the first ctx keys
    k = pool[table, 0].permute(0, 2, 1, 3, 4).reshape(B, nkv, nb * bs, hd)[:, :, :ctx].contiguous()
    v = pool[table, 1].permute(0, 2, 1, 3, 4).reshape(B, nkv, nb * bs, hd)[:, :, :ctx].contiguous()
    del pool
    q = q.view(B, ql, nh, hd)
    scale = 1.0 / math.sqrt(hd)
    g = nh // nkv
    variants = {}
    if c["kind"] == "decode":
        # the g query heads of a KV head as g queries of that head (no mask): K/V read once
        qg = q.view(B, nkv, g, hd)
        variants["grouped"] = (lambda: F.scaled_dot_product_attention(qg, k, v, scale=scale),
                               lambda y: y.reshape(B, 1, nh, hd))
        qt = q.permute(0, 2, 1, 3)  # [B, nh, 1, hd]
        variants["enable_gqa"] = (lambda: F.scaled_dot_product_attention(qt, k, v, scale=scale, enable_gqa=True),
                                  lambda y: y.permute(0, 2, 1, 3))
    else:
        qt = q.permute(0, 2, 1, 3).contiguous()  # [B, nh, ql, hd]
        ke = k.repeat_interleave(g, dim=1)
        ve = v.repeat_interleave(g, dim=1)
        back = lambda y: y.permute(0, 2, 1, 3)
        if ql == ctx:
            variants["causal"] = (lambda: F.scaled_dot_product_attention(qt, ke, ve, is_causal=True, scale=scale), back)
        else:
            from torch.nn.attention.bias import causal_lower_right
            bias = causal_lower_right(ql, ctx)
            variants["causal_lower_right"] = (lambda: F.scaled_dot_product_attention(qt, ke, ve, attn_mask=bias, scale=scale), back)
            mask = torch.ones(ql, ctx, dtype=torch.bool, device="cuda").tril(diagonal=ctx - ql)
            variants["bool_mask"] = (lambda: F.scaled_dot_product_attention(qt, ke, ve, attn_mask=mask, scale=scale), back)
    res = {"generator_ok": gen_ok}
    for backend, bname in ((SDPBackend.CUDNN_ATTENTION, "cudnn"), (SDPBackend.FLASH_ATTENTION, "flash2")):
        best = None
        for vname, (fn, back) in variants.items():
            try:
                with sdpa_kernel([backend]):
                    y = fn()
                    torch.cuda.synchronize()
                    ms = time_ms(lambda _: fn())
            except Exception as e:  # this backend refuses this form
                res.setdefault("refused", []).append(f"{bname}/{vname}: {str(e).splitlines()[0][:100]}")
                continue
            err, ok = same(c, back(y))
            if best is None or ms < best["ms"]:
                best = {"ms": ms, "variant": vname, "checksum_err": err, "checksum_ok": ok}
        res[bname] = best
    return res


def linear_case(c, seed):
    rows, fin, fout, copies = c["rows"], c["in"], c["out"], c["copies"]
    x = fill_bf16(rows * fin, seed, 3).view(rows, fin)
    ws = [fill_bf16(fout * fin, seed, 4 + 16 * i).view(fout, fin) for i in range(copies)]
    y = torch.matmul(x, ws[0].t())
    err, ok = same(c, y)
    ms = time_ms(lambda r: torch.matmul(x, ws[r % copies].t()))
    return {"generator_ok": True, "cublas": {"ms": ms, "variant": "torch.matmul", "checksum_err": err, "checksum_ok": ok}}


def main():
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        bench = json.load(f)
    seed = bench["seed"]
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    rows = []
    bad = 0
    for c in bench["cases"]:
        comp = {}
        if c["kind"] in ("decode", "prefill", "append"):
            comp = attention_case(c, seed)
        elif c["kind"] == "linear":
            comp = linear_case(c, seed)
        torch.cuda.empty_cache()
        c["competitor"] = comp
        for r in comp.get("refused", []):
            print(f"  {c['name']}: refused {r}")
        if comp and not comp.get("generator_ok", True):
            print(f"  {c['name']}: the generator does not reproduce kernel_bench's data")
            bad += 1
        for k in ("cudnn", "flash2", "cublas"):
            if comp.get(k) and not comp[k]["checksum_ok"]:
                print(f"  {c['name']}: {k} output differs from pagoda's (checksum error {comp[k]['checksum_err']:.2e})")
                bad += 1
        rows.append(c)
        print(f"  done {c['name']}", flush=True)
    with open(dst, "w") as f:
        json.dump(bench, f, indent=1)

    def rate(c, ms):
        if c["kind"] in ("prefill", "append", "linear") and c["flops"] > 0 and (c["kind"] != "linear" or c["rows"] >= 256):
            return f"{c['flops'] / ms * 1e-9:7.1f} TFLOP/s"
        return f"{c['bytes'] / ms * 1e-9:7.3f} TB/s"

    print()
    print(f"| case | pagoda ms | pagoda rate | competitor | its ms | its rate | ratio (speed) | flash2 ms | ratio to flash2 |")
    print(f"|---|---|---|---|---|---|---|---|---|")
    for c in rows:
        comp = c["competitor"]
        main_k = "cudnn" if "cudnn" in comp else ("cublas" if "cublas" in comp else None)
        line = f"| {c['name']} | {c['ms']:.4f} | {rate(c, c['ms'])} |"
        m = comp.get(main_k) if main_k else None
        if m:
            line += f" {main_k} ({m['variant']}) | {m['ms']:.4f} | {rate(c, m['ms'])} | {m['ms'] / c['ms']:.2f} |"
        else:
            line += " - | - | - | - |"
        fl = comp.get("flash2")
        line += f" {fl['ms']:.4f} | {fl['ms'] / c['ms']:.2f} |" if fl else " - | - |"
        print(line)
    print(f"\nJSON: {dst}; {bad} check(s) failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
