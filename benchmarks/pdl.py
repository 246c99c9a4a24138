"""Programmatic dependent launch on a chain of short kernels: device time with and without.

    python3 benchmarks/pdl.py [--json pdl.json]

A chain of dependent kernels, each reading what the one before wrote (y = 0.5 x + 1, ping-pong
between two buffers), launched back to back on one session's stream as a captured graph
(replayed, so host cost is out of the measure) and by ``s.launch``. With ``pdl=True`` each
kernel starts while the one before finishes and waits at ``griddepcontrol.wait`` before its
reads; without it, each starts after the one before has ended. Device time a kernel is timed
between events, the median of rounds; the chain's result is compared with numpy first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tenferro as tf

SRC = r"""
extern "C" __global__ void step(float* y, const float* x, unsigned n) {
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 0.5f * x[i] + 1.0f;
}
"""
KERNELS, ROUNDS = 200, 15


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--n", type=int, default=1 << 14, help="elements a kernel (short kernels)")
    ns = ap.parse_args()
    n = ns.n
    rows: dict[str, float] = {}
    with tf.Session(0) as s:
        name = s.context.name
        if s.context.compute_capability < (9, 0):
            raise SystemExit(f"{name}: programmatic dependent launch needs sm_90 or later")
        step = s.compile(SRC).function("step")
        x0 = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        a, b = s.upload(x0), s.alloc_output(n, np.float32)
        want = x0.astype(np.float64)
        for _ in range(KERNELS):
            want = 0.5 * want + 1.0
        for pdl in (False, True):
            cfg = tf.LaunchConfig((n + 255) // 256, 256, pdl=pdl)
            pair = [
                [s.tensor_mut(b), s.tensor(a), n],
                [s.tensor_mut(a), s.tensor(b), n],
            ]

            def chain(cfg=cfg, pair=pair):
                for k in range(KERNELS):
                    s.launch(step, cfg, pair[k % 2])

            with s.capture() as cap:
                chain()
            graph = cap.graph
            for how, go in (("graph", graph.launch), ("s.launch", chain)):
                s.copy(a, s.upload(x0))
                go()
                got = s.download(a if KERNELS % 2 == 0 else b)
                if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
                    raise SystemExit(f"pdl={pdl} {how}: the chain's result is wrong")
                times = []
                for _ in range(ROUNDS):
                    start = s.record_event()
                    go()
                    end = s.record_event()
                    end.synchronize()
                    times.append(start.elapsed_ms(end) * 1000 / KERNELS)
                rows[f"{how}, pdl={pdl}"] = statistics.median(times)
    print(
        f"{name}: {KERNELS} dependent kernels of {n} elements, "
        f"device µs a kernel (median of {ROUNDS}):"
    )
    for key, us in rows.items():
        print(f"  {key:<22} {us:7.2f}")
    for how in ("graph", "s.launch"):
        off, on = rows[f"{how}, pdl=False"], rows[f"{how}, pdl=True"]
        print(f"  {how}: pdl saves {off - on:.2f} µs a kernel ({on / off:.2f}x the time)")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"device": name, "n": n, "kernels": KERNELS, "us": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
