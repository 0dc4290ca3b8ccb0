#!/usr/bin/env python3
"""bench/step_split.py [NAME] < LOG: the CUDA backend's per-step split of its device time, by mode.

LOG is a debug-level log of the CUDA backend: a worker's (deploy/pagoda-up --log-level debug, the
run dir's worker-0.log) or decode_step's (--pipelined --debug, stderr). Each of its lines "cuda:
step slot S: A us staging, B us the layers and LM head (graph|eager), C us sampling; the device
idle D us before it" is one step (worker/cuda_backend.c). For graph replays and eager steps
apart, prints the count and the 10th, 50th and 90th percentiles and the mean of each part, the
idle time before the step (D; -1, not known, left out and counted) and the step's total
(A + B + C), so that a run's steps can be set beside decode_step's on the same machine: where a
run's step is longer, which part is.
"""
import re
import sys

LINE = re.compile(r"cuda: step slot \d+: (\d+) us staging, (\d+) us the layers and LM head "
                  r"\((\w+)\), (-?\d+) us sampling; the device idle (-?\d+) us")
PARTS = ("staging", "layers", "sampling", "idle", "total")


def quantile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "log"
    steps = {}
    for line in sys.stdin:
        m = LINE.search(line)
        if m:
            staging, layers, mode, sampling, idle = (int(m[1]), int(m[2]), m[3], int(m[4]),
                                                     int(m[5]))
            steps.setdefault(mode, []).append(
                (staging, layers, sampling, idle, staging + layers + sampling))
    if not steps:
        print(f"{name}: no step lines (is the log at debug level?)")
        return 1
    for mode, rows in sorted(steps.items()):
        cols = [list(c) for c in zip(*rows)]
        unknown = sum(1 for v in cols[3] if v < 0)
        cols[3] = [v for v in cols[3] if v >= 0]  # -1: the idle time was not known
        parts = [f"{p} {quantile(c, .1)}/{quantile(c, .5)}/{quantile(c, .9)} "
                 f"mean {sum(c) / len(c):.0f}" if c else f"{p} n/a" for p, c in zip(PARTS, cols)]
        print(f"{name} {mode}: {len(rows)} steps; us, p10/p50/p90: " + "; ".join(parts) +
              (f" (idle not known for {unknown})" if unknown else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
