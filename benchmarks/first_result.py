"""Time from a fresh process to its first checked result, with empty compile caches.

    python3 benchmarks/first_result.py [--runs 3] [--json first_result.json]

Each method runs in a new interpreter: import, open the device, compile a new axpy (a unique
comment in the source, and empty cache directories, so nothing is found on disk), launch it
on 2^20 floats, copy back and check against numpy. The figure is the wall time of the whole
process, the median of ``--runs``; methods are interleaved run by run. The "warm" column runs
the same source again in a second process with the caches the first one filled (numba's
``@cuda.jit`` keeps no cache across processes here, so its warm run compiles again).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _axpy import AXPY_SRC

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")


CHECK = """
import numpy as np
want = 2.0 * x0.astype(np.float64) + y0
assert np.allclose(out, want, rtol=1e-6), "wrong result"
"""

SCRIPTS = {
    "tenferro (README quickstart)": """
import numpy as np
import tenferro as tf
n = 1 << 20
x0 = np.random.rand(n).astype(np.float32); y0 = np.random.rand(n).astype(np.float32)
with tf.Session(device=0) as s:
    x, y = s.upload(x0), s.upload(y0)
    axpy = s.compile(SRC).function("axpy")
    s.launch(axpy, tf.LaunchConfig.flat(n, 256), [s.tensor_mut(y), s.tensor(x), tf.f32(2.0),
                                                  tf.u32(n)])
    out = s.download(y)
""",
    "CuPy RawKernel": """
import numpy as np
import cupy as cp
n = 1 << 20
x0 = np.random.rand(n).astype(np.float32); y0 = np.random.rand(n).astype(np.float32)
x, y = cp.asarray(x0), cp.asarray(y0)
k = cp.RawKernel(SRC, "axpy")
k(((n + 255) // 256,), (256,), (y, x, np.float32(2.0), np.uint32(n)))
out = cp.asnumpy(y)
""",
    "cuda.core Program + launch": """
import numpy as np
from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch
import cupy as cp
n = 1 << 20
x0 = np.random.rand(n).astype(np.float32); y0 = np.random.rand(n).astype(np.float32)
dev = Device(0); dev.set_current(); st = dev.create_stream()
arch = "sm_" + "".join(map(str, dev.compute_capability))
k = Program(SRC, "c++", ProgramOptions(arch=arch)).compile("cubin").get_kernel("axpy")
x, y = cp.asarray(x0), cp.asarray(y0)
cp.cuda.Device().synchronize()
launch(st, LaunchConfig(grid=(n + 255) // 256, block=256), k, y.data.ptr, x.data.ptr,
       np.float32(2.0), np.uint32(n))
st.sync()
out = cp.asnumpy(y)
""",
    "numba @cuda.jit": """
import numpy as np
from numba import cuda
n = 1 << 20
x0 = np.random.rand(n).astype(np.float32); y0 = np.random.rand(n).astype(np.float32)

@cuda.jit
def axpy(y, x, a, n):
    i = cuda.grid(1)
    if i < n:
        y[i] = a * x[i] + y[i]

x, y = cuda.to_device(x0), cuda.to_device(y0)
axpy[(n + 255) // 256, 256](y, x, np.float32(2.0), np.uint32(n))
out = y.copy_to_host()
""",
}


def _process(name: str, body: str, src: str, cache: str) -> float:
    """Wall seconds of one fresh interpreter running ``body`` with caches under ``cache``."""
    env = dict(
        os.environ,
        TENFERRO_CACHE_DIR=os.path.join(cache, "tf"),
        CUPY_CACHE_DIR=os.path.join(cache, "cupy"),
        PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
    )
    code = f"SRC = {src!r}\n{body}\n{CHECK}"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"{name} failed:\n{r.stderr[-2000:]}")
    return dt


def _run(name: str, body: str, tag: int) -> tuple[float, float]:
    """(cold, warm): a new source with empty caches, then the same source again."""
    src = AXPY_SRC + f"\n// {name} run {tag} {time.time_ns()}\n"
    with tempfile.TemporaryDirectory() as cache:
        return _process(name, body, src, cache), _process(name, body, src, cache)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    cold: dict[str, list[float]] = {name: [] for name in SCRIPTS}
    warm: dict[str, list[float]] = {name: [] for name in SCRIPTS}
    for run in range(ns.runs):
        for name, body in SCRIPTS.items():
            c, w = _run(name, body, run)
            cold[name].append(c)
            warm[name].append(w)
    base = statistics.median(cold["CuPy RawKernel"])
    print(f"{'method':<32} {'cold s':>7} {'x CuPy':>7} {'warm s':>7}   cold runs")
    for name in SCRIPTS:
        c, w = statistics.median(cold[name]), statistics.median(warm[name])
        print(
            f"{name:<32} {c:>7.2f} {c / base:>7.2f} {w:>7.2f}   "
            + " ".join(f"{t:.2f}" for t in cold[name])
        )
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(
                {
                    name: {
                        "cold_s": statistics.median(cold[name]),
                        "warm_s": statistics.median(warm[name]),
                    }
                    for name in SCRIPTS
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
