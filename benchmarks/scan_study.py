"""Where the inclusive scan's time goes: variants of it timed alone, on the GPU machine.

    python3 benchmarks/scan_study.py [parts of variants' names]

Each variant (scan_study.cu, compiled after rows.cu's source, float32) is first checked against
numpy's float64 cumsum on odd sizes, then timed on 256 MiB: the mean of 20 back-to-back
launches queued behind a spin kernel, each with its own state zeroed beforehand (or, for the
self-clearing variant, one state), so the device's time of the kernel alone is measured. The
library's `kernels.cumsum` (which zeroes its state each call), torch's copy and cumsum are
timed the same way. Not a test: the numbers go to RESULTS.md.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tenferro as tf
from tenferro import LaunchConfig, u64
from tenferro import kernels as k
from tenferro.kernels._build import _source

N = (256 << 20) // 4
REPS = 20
SPIN = r"""extern "C" __global__ void spin(unsigned long long cycles) {
    unsigned long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}"""
SIZES = (1, 31, 33, 16385, 1228805, (1 << 20) + 7, (1 << 24) + 3)


def _padded(threads: int, items: int) -> int:
    return threads * items * 33 // 32 * 4


# name -> (tile elements, shared bytes, block threads, clears its own state, blocks an SM
# of a persistent grid or 0, gives the right sums)
VARIANTS = {
    "scan_order<512, 32, 3, true>": (16384, _padded(512, 32), 512, False, 0, True),
    "scan_order<512, 32, 3, false>": (16384, _padded(512, 32), 512, False, 0, True),
    **{
        f"scan_mode<{t}, 32, {b}, {m}>": (t * 32, _padded(t, 32), t, False, 0, m == 2)
        for t, b in ((512, 3), (256, 6), (512, 2))
        for m in (0, 1, 2)
    },
    "scan_vec<512, 3>": (16384, 65536, 512, False, 0, True),
    "scan_vec<256, 6>": (8192, 32768, 256, False, 0, True),
    **{
        f"scan_lookahead<{t}, 32, {b}, {c}>": (t * 32, _padded(t, 32), t + 32, c == "true", 0, True)
        for t, b in ((480, 3), (352, 4), (224, 6))
        for c in ("true", "false")
    },
    **{
        f"copy_bulk<{t}, {b}, {c}, {w}>": (t * 32, t * 128, t, False, 0, False)
        for t, b in ((512, 3), (256, 6))
        for c in (1, 8)
        for w in ("false", "true")
    },
    **{
        f"scan_bulk_study<{t}, {b}, {c}, {w}>": (t * 32, t * 128, t, False, 0, True)
        for t, b in ((512, 3), (256, 6), (512, 2))
        for c in (1, 8)
        for w in ("false", "true")
    },
    **{
        f"scan_order<{t}, 32, {b}, false, {a}, {w}>": (t * 32, _padded(t, 32), t, False, 0, True)
        for t, b, a, w in (
            (512, 3, 66, "false"),
            (512, 3, 99, "false"),
            (512, 3, 132, "false"),
            (512, 3, 165, "false"),
            (512, 3, 198, "false"),
            (512, 3, 99, "true"),
            (512, 3, 132, "true"),
            (512, 3, 165, "true"),
            (256, 6, 198, "false"),
            (256, 6, 264, "false"),
            (256, 6, 330, "false"),
            (512, 2, 132, "false"),
        )
    },
    **{
        f"scan_persistent<{t}, {i}, {b}, {h}>": (t * i, 2 * _padded(t, i), t, False, b, True)
        for t, i, b, h in ((256, 32, 3, "false"), (256, 32, 3, "true"), (512, 16, 3, "false"))
    },
}


def main() -> int:
    """Check every variant (or those whose names hold an argument), then time them, twice."""
    if len(sys.argv) > 1:
        for name in [v for v in VARIANTS if not any(a in v for a in sys.argv[1:])]:
            del VARIANTS[name]
    with tf.Session(device=0) as s:
        src = (
            _source("rows.cu")
            + open(os.path.join(os.path.dirname(__file__), "scan_study.cu")).read()
        )
        mod = s.compile(src, options=["-std=c++17"], name_expressions=list(VARIANTS))
        spin = s.compile(SPIN).function("spin")
        sms = s.context.attribute("MULTIPROCESSOR_COUNT")
        rng = np.random.default_rng()
        kept = {}

        def launch(name, n, x, y, reps):
            tile, smem, threads, clean, per_sm, _ = VARIANTS[name]
            tiles = (n + tile - 1) // tile
            grid = min(tiles, per_sm * sms) if per_sm else tiles
            words = 16 * tiles + 16
            if clean:
                state = kept.setdefault((name, words), s.alloc_zeros((words,), np.uint64))
                states = [state] * reps
            else:
                states = [s.alloc_zeros((words,), np.uint64) for _ in range(reps)]
            fn = mod.function(name)
            config = LaunchConfig(grid, threads, shared_mem_bytes=smem)
            s.launch(spin, LaunchConfig(1, 1), [u64(10_000_000)])
            a = s.record_event()
            for st in states:
                s.launch(fn, config, [s.tensor_mut(y), s.tensor(x), s.tensor_mut(st), u64(n)])
            b = s.record_event()
            b.synchronize()
            return a.elapsed_ms(b) / reps, states[0]

        for n in SIZES:
            xh = rng.standard_normal(n).astype(np.float32)
            x = s.upload(xh)
            ref = np.cumsum(xh.astype(np.float64))
            tol = 1e-4 * (np.abs(ref) + np.sqrt(np.arange(1, n + 1)))
            for name, spec in VARIANTS.items():
                if not spec[5]:
                    continue
                y = s.upload(np.full(n, np.nan, np.float32))
                _, state = launch(name, n, x, y, 2 if spec[3] else 1)
                err = np.abs(s.download(y).astype(np.float64) - ref)
                if not (err <= tol).all():
                    print(f"WRONG {name} n={n}", flush=True)
                    return 1
                if spec[3] and s.download(state).any():
                    print(f"STATE LEFT SET {name} n={n}", flush=True)
                    return 1
        print(f"all variants right at n = {SIZES}", flush=True)

        x = s.upload(rng.standard_normal(N).astype(np.float32))
        y = s.alloc_output((N,), np.float32)
        for _ in range(3):
            k.cumsum(s, y, x)
        s.launch(spin, LaunchConfig(1, 1), [u64(10_000_000)])
        a = s.record_event()
        for _ in range(REPS):
            k.cumsum(s, y, x)
        b = s.record_event()
        b.synchronize()
        _report("kernels.cumsum (state zeroed each call)", a.elapsed_ms(b) / REPS)
        for _ in range(2):
            for name in VARIANTS:
                _report(name, launch(name, N, x, y, REPS)[0])
        _torch()
    return 0


def _report(label: str, ms: float) -> None:
    print(f"{label:44s} {ms * 1e3:7.1f} us {2 * N * 4 / ms / 1e9:5.2f} TB/s", flush=True)


def _torch() -> None:
    import torch

    tx = torch.randn(N, device="cuda")
    ty = torch.empty_like(tx)
    for label, fn in (
        ("torch copy", lambda: ty.copy_(tx)),
        ("torch cumsum", lambda: torch.cumsum(tx, 0, out=ty)),
    ):
        for _ in range(3):
            fn()
        torch.cuda._sleep(10_000_000)
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(REPS):
            fn()
        b.record()
        b.synchronize()
        _report(label, a.elapsed_time(b) / REPS)


if __name__ == "__main__":
    sys.exit(main())
