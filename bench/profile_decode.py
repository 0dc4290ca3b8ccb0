#!/usr/bin/env python3
"""Per-kernel breakdown of decode steps from an Nsight Compute CSV (issue 15).

usage: profile_decode.py NCU_CSV LABEL BATCHES [WEIGHT_BYTES_JSON]

NCU_CSV is `ncu --csv --print-units base --metrics gpu__time_duration.sum,dram__bytes_read.sum,
dram__bytes_write.sum` over `decode_step --profile --only VERSION --batches BATCHES`: one step
per batch, in order, each starting at its embedding kernel. Kernels are classed by name, and the
linears (cuBLAS's kernels or cuda_gemv's) by where they sit in the layer: after the first
RMSNorm of a layer the QKV projection, after attention the O projection, after the second
RMSNorm gate/up, after SiLU-mul the down projection, after the final gather the LM head; where
the RMSNorm is inside the linear (cuda_gemv_row_norm, one row), gate/up is the linear after O
and QKV the one after down (or after the embedding).
Prints per batch and class: launches, summed kernel time, DRAM bytes and bandwidth, and the
class's share of the step's summed kernel time. Kernel times are measured one kernel at a time
(ncu serialises), so their sum leaves out launch gaps: decode_step's event time minus this sum
is what the gaps cost."""
import csv
import sys
from collections import OrderedDict

OURS = {
    "embedding_kernel": "embedding",
    "add_rmsnorm_kernel": "rmsnorm",
    "add_rmsnorm_reg_kernel": "rmsnorm",
    "rope_kernel": "rope",
    "reshape_and_cache_kernel": "kv_write",
    "rope_cache_kernel": "rope+kv_write",
    "decode_kernel": "attention",
    "prefill_kernel": "attention",
    "silu_mul_kernel": "silu_mul",
    "gather_rows_kernel": "gather",
    "gather_tokens": "token_gather",  # the step's tokens from the device (closed loops)
    "sample_rows": "sampler",
    "add_bias_kernel": "bias",
    "fill_random_kernel": "fill",
}


def base_name(name):
    n = name.split("(")[0].strip()
    for prefix in ("void ", "(anonymous namespace)::", "<unnamed>::"):
        n = n.replace(prefix, "")
    n = n.split("<")[0].strip()
    return n.split("::")[-1]


def classify(name):
    b = base_name(name)
    if b == "gemv_kernel":
        return None  # a linear of ours
    if b in OURS:
        return OURS[b]
    if "sampl" in b or "topk" in b.lower() or "radix" in b.lower() or "sort" in b.lower():
        return "sampler"
    return None  # cuBLAS: a linear


def main():
    path, label, batches = sys.argv[1], sys.argv[2], [int(b) for b in sys.argv[3].split(",")]
    kernels = OrderedDict()
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    for row in csv.DictReader(lines):
        kid = int(row["ID"])
        k = kernels.setdefault(kid, {"name": row["Kernel Name"], "t": 0.0, "rd": 0.0, "wr": 0.0})
        v = float(row["Metric Value"].replace(",", "") or 0)
        m = row["Metric Name"]
        if m == "gpu__time_duration.sum":
            k["t"] = v * 1e-3  # ns -> us
        elif m == "dram__bytes_read.sum":
            k["rd"] = v
        elif m == "dram__bytes_write.sum":
            k["wr"] = v
    steps = []
    for k in kernels.values():
        if classify(k["name"]) == "embedding" or not steps:
            steps.append([])
        steps[-1].append(k)
    steps = [s for s in steps if any(classify(k["name"]) == "embedding" for k in s)]
    if len(steps) != len(batches):
        print(f"{label}: {len(steps)} steps in the profile, {len(batches)} batches expected")
    for B, step in zip(batches, steps):
        acc = OrderedDict()
        last, norms, since = None, 0, 0
        for k in step:
            c = classify(k["name"])
            if c is None:
                # A linear whose RMSNorm is inside it (cuda_gemv_row_norm at one row) follows
                # another linear: gate/up after O, the next layer's QKV after down.
                role = {"rmsnorm": ["qkv" if norms % 2 == 1 else "gate_up"],
                        "attention": ["o", "gate_up"], "silu_mul": ["down", "qkv"],
                        "embedding": ["qkv"], "gather": ["lm_head"]}.get(last, [])
                if "splitKreduce" in base_name(k["name"]) and since > 0:
                    since -= 1  # cuBLAS's split-K reduction: the same linear's second kernel
                c = "linear " + (role[since] if since < len(role) else "linear?")
                since += 1
            else:
                if c == "rmsnorm":
                    norms += 1
                last, since = c, 0
            a = acc.setdefault(c, [0, 0.0, 0.0, set()])
            a[0] += 1
            a[1] += k["t"]
            a[2] += k["rd"] + k["wr"]
            a[3].add(base_name(k["name"])[:48])
        total = sum(a[1] for a in acc.values())
        print(f"\n{label}, batch {B}: {len(step)} kernels, {total / 1e3:.3f} ms of kernel time")
        print(f"{'class':<16} {'launches':>8} {'us':>9} {'us/launch':>9} {'MB':>9} {'TB/s':>6} "
              f"{'share':>6}  kernels")
        for c, (n, t, by, names) in sorted(acc.items(), key=lambda kv: -kv[1][1]):
            bw = by / (t * 1e-6) / 1e12 if t > 0 else 0.0
            print(f"{c:<16} {n:>8} {t:>9.1f} {t / n:>9.2f} {by / 1e6:>9.1f} {bw:>6.2f} "
                  f"{100 * t / total:>5.1f}%  {', '.join(sorted(names))[:90]}")


if __name__ == "__main__":
    main()
