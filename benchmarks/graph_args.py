"""New arguments for a captured graph: a kernel node changed in place against a capture again.

    python3 benchmarks/graph_args.py [--json graph_args.json]

A graph of 20 axpy kernels (y += a x on 2^16 elements). Each step changes the scalar ``a`` of
one kernel and replays the graph, four ways: ``GraphKernel.update`` of that argument;
``GraphKernel.set_args`` with fresh spans and scalars (what a user writes who rebuilds the
list); ``s.capture(update=graph)`` capturing the 20 launches again; and a new capture with its
instantiation. Host µs a step (change and replay enqueued, the stream synchronized once a
round), the median of rounds, interleaved; the result of each way is compared with numpy first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _axpy import AXPY_SRC

import tenferro as tf

KERNELS, STEPS, ROUNDS = 20, 50, 15


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    n = 1 << 16
    rng = np.random.default_rng(0)
    x0, y0 = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    with tf.Session(0) as s:
        name = s.context.name
        axpy = s.compile(AXPY_SRC).function("axpy")
        cfg = tf.LaunchConfig.flat(n)
        x, y = s.upload(x0), s.upload(y0)

        def work(a_last: float) -> None:
            for k in range(KERNELS):
                a = a_last if k == KERNELS - 1 else 0.0
                s.launch(axpy, cfg, [s.tensor_mut(y), s.tensor(x), tf.f32(a), tf.u32(n)])

        graphs = {}
        for way in ("update", "set_args", "capture(update=)", "new capture"):
            with s.capture() as cap:
                work(1.0)
            graphs[way] = cap.graph

        def by_update(a: float) -> None:
            g = graphs["update"]
            g.kernels[-1].update(2, tf.f32(a))
            g.launch()

        def by_set_args(a: float) -> None:
            g = graphs["set_args"]
            g.kernels[-1].set_args([s.tensor_mut(y), s.tensor(x), tf.f32(a), tf.u32(n)])
            g.launch()

        def by_recapture(a: float) -> None:
            g = graphs["capture(update=)"]
            with s.capture(update=g):
                work(a)
            g.launch()

        def by_new_capture(a: float) -> None:
            with s.capture() as cap:
                work(a)
            graphs["new capture"] = cap.graph
            cap.graph.launch()

        ways = {
            "GraphKernel.update": by_update,
            "GraphKernel.set_args": by_set_args,
            "s.capture(update=graph)": by_recapture,
            "new capture": by_new_capture,
        }
        for label, step in ways.items():  # each way's result against numpy first
            s.copy(y, s.upload(y0))
            step(0.25)
            step(-0.5)
            got = s.download(y)
            want = y0 + (0.25 - 0.5) * x0.astype(np.float64)
            if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
                raise SystemExit(f"{label}: the result is wrong")
        times: dict[str, list[float]] = {label: [] for label in ways}
        for _ in range(ROUNDS):
            for label, step in ways.items():
                s.synchronize()
                t0 = time.perf_counter()
                for i in range(STEPS):
                    step(1e-3 * (i % 3))
                s.synchronize()
                times[label].append((time.perf_counter() - t0) * 1e6 / STEPS)
    rows = {label: statistics.median(t) for label, t in times.items()}
    print(f"{name}: a graph of {KERNELS} kernels, one kernel's scalar changed and replayed,")
    print(f"host µs a step (median of {ROUNDS} rounds of {STEPS}):")
    base = rows["s.capture(update=graph)"]
    for label, us in rows.items():
        print(f"  {label:<26} {us:8.1f}   {us / base:5.2f}x capture(update=)")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"device": name, "kernels": KERNELS, "us": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
