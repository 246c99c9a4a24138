"""Host cost of zero-copy imports and exports, side by side, in one process.

    python3 benchmarks/interop.py --json interop.json

Each figure is the median over ROUNDS rounds of the mean of BATCH calls, the methods
interleaved round by round (shuffled). Every call produces a new view of the same 1 Mi-element
float32 array; the views are dropped as they come (their deleters run inside the timing).
torch works on a non-default stream, so the producers that order streams do so with an event.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tenferro as tf

BATCH, ROUNDS = 500, 40


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    import cupy as cp
    import torch

    n = 1 << 20
    results: dict[str, float] = {}
    with tf.Session(device=0) as s:
        side = torch.cuda.Stream()
        torch.cuda.set_stream(side)
        tt = torch.rand(n, device="cuda")
        ct = cp.random.rand(n, dtype=cp.float32)
        t = s.upload(np.random.rand(n).astype(np.float32))
        methods = {
            "s.tensor(torch tensor)": lambda: s.tensor(tt),
            "s.tensor(cupy array)": lambda: s.tensor(ct),
            "s.tensor(tf.Tensor)": lambda: s.tensor(t),
            "tf.from_dlpack(torch tensor)": lambda: tf.from_dlpack(tt),
            "torch.from_dlpack(tf.Tensor)": lambda: torch.from_dlpack(t),
            "torch.from_dlpack(cupy array)": lambda: torch.from_dlpack(ct),
            "cupy.from_dlpack(torch tensor)": lambda: cp.from_dlpack(tt),
            "cupy.from_dlpack(tf.Tensor)": lambda: cp.from_dlpack(t),
        }
        per: dict[str, list[float]] = {k: [] for k in methods}
        for fn in methods.values():  # warm up: first-use imports and caches
            for _ in range(50):
                fn()
        order = list(methods)
        rng = random.Random(0)
        for _ in range(ROUNDS):
            rng.shuffle(order)
            for name in order:
                fn = methods[name]
                t0 = time.perf_counter()
                for _ in range(BATCH):
                    fn()
                per[name].append((time.perf_counter() - t0) / BATCH * 1e6)
                s.synchronize()
        torch.cuda.synchronize()
        for name, xs in per.items():
            results[name] = statistics.median(xs)
        # Zero-copy, checked once more: every view points at the producer's memory.
        assert s.tensor(tt).ptr == tt.data_ptr()
        assert torch.from_dlpack(t).data_ptr() == t.ptr
        assert cp.from_dlpack(t).data.ptr == t.ptr
    print(f"{'operation':<34} {'us per call':>12}")
    for name, us in results.items():
        print(f"{name:<34} {us:12.2f}")
    if ns.json:
        meta = {
            "date": time.strftime("%Y-%m-%d"),
            "batch": BATCH,
            "rounds": ROUNDS,
            "torch": torch.__version__,
            "cupy": cp.__version__,
        }
        with open(ns.json, "w") as f:
            json.dump({"meta": meta, "results_us": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
