"""Time to compile a new CUDA C source, and to find it again in the disk cache (no GPU needed).

    python3 benchmarks/compile.py [--runs 15] [--json compile.json]

``tf.compile_cuda`` of the README's axpy with a unique comment each run (an empty cache
directory, so every run is a miss: NVRTC for the kernels and the C-type probe), then the same
source again (a hit). The figure is the median of ``--runs``. This is the compile a fresh
process pays on its way to its first result (`benchmarks/first_result.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from first_result import KERNEL as SRC  # noqa: E402  (the kernel the first result compiles)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    os.environ["TENFERRO_CACHE_DIR"] = tempfile.mkdtemp(prefix="tenferro-compile-bench-")
    import tenferro as tf

    tf.compile_cuda(SRC + "// warm-up\n")  # NVRTC loaded once, as a session's first compile
    miss, hit = [], []
    for i in range(ns.runs):
        src = SRC + f"// run {i} {time.time_ns()}\n"
        t0 = time.perf_counter()
        r = tf.compile_cuda(src)
        miss.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        tf.compile_cuda(src)
        hit.append(time.perf_counter() - t0)
    assert (
        r.signatures["axpy"].declaration() == "axpy(float* y, const float* x, float a, "
        "unsigned int n)"
    )
    res = {"miss_ms": statistics.median(miss) * 1e3, "hit_ms": statistics.median(hit) * 1e3}
    print(
        f"new source (cache miss) {res['miss_ms']:7.1f} ms   cache hit {res['hit_ms']:6.2f} ms"
        f"   (median of {ns.runs}, {os.cpu_count()} CPUs)"
    )
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
