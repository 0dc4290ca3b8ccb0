#!/usr/bin/env python3
"""The GPU's measured matrix rate, for pagoda-bench --matrix-tflops (the compute half of the
workload bound): bf16 GEMMs through torch (cuBLAS), f32 accumulation, the shapes a prefill step
of the 8B shape runs (2048 tokens through QKV, O, gate/up and down) and a square 8192 one; the
rate is the best median of those shapes, in TFLOP/s.

    python3 bench/matrix_rate.py [--json OUT] [--reps 20]
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("matrix_rate.py: no CUDA device", file=sys.stderr)
        return 1
    shapes = [(2048, 4096, 6144), (2048, 4096, 4096), (2048, 4096, 28672), (2048, 14336, 4096),
              (8192, 8192, 8192)]
    results = []
    for m, k, n in shapes:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            torch.matmul(x, w.t())
        times = []
        for _ in range(a.reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            torch.matmul(x, w.t())
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        times.sort()
        t = times[len(times) // 2]
        results.append({"m": m, "k": k, "n": n, "s": t, "tflops": 2 * m * k * n / t / 1e12})
        print(f"  {m} x {k} x {n}: {results[-1]['tflops']:.0f} TFLOP/s")
    best = max(r["tflops"] for r in results)
    doc = {"tflops": best, "shapes": results, "gpu": torch.cuda.get_device_name(),
           "method": "torch.matmul bf16 (cuBLAS), median of %d, best shape" % a.reps}
    print(json.dumps({"tflops": best}))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
