"""``python -m tenferro demo``: compile and launch real kernels, check them, time them."""

from __future__ import annotations

import time

import numpy as np

from .args import f32, u32
from .compiler import cache_stats
from .errors import ValidationError
from .launch_config import LaunchConfig
from .session import Session

__all__ = ["run_demo"]

SOURCE = r"""
extern "C" __global__ void axpy(float* y, const float* x, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
// One block a row: out[r] = sum of row r, through shared memory.
extern "C" __global__ void row_sum(double* out, const double* x, unsigned rows, unsigned cols) {
    extern __shared__ double part[];
    unsigned r = blockIdx.x;
    double acc = 0.0;
    for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) acc += x[(size_t)r * cols + c];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0 && r < rows) out[r] = part[0];
}
"""


def run_demo(device: int = 0) -> int:
    """Run the demo on ``device``; return the process exit status (0: every check passed)."""
    rng = np.random.default_rng()
    ok = True
    with Session(device=device) as s:
        major, minor = s.context.compute_capability
        print(f"session: device {device} (sm_{major}{minor}), stream 0x{s.stream:x}")
        t0 = time.perf_counter()
        mod = s.compile(SOURCE)
        ms = (time.perf_counter() - t0) * 1e3
        print(f"compiled 2 kernels with NVRTC in {ms:.1f} ms (cache {cache_stats()})")
        axpy, row_sum = mod.function("axpy"), mod.function("row_sum")
        print(f"  {axpy}\n  {row_sum}")

        n = 1 << 20
        x0 = rng.standard_normal(n).astype(np.float32)
        y0 = rng.standard_normal(n).astype(np.float32)
        x, y = s.upload(x0), s.upload(y0)
        cfg = LaunchConfig.flat(n, 256)
        args = [s.tensor_mut(y), s.tensor(x), f32(2.0), u32(n)]
        s.launch(axpy, cfg, args)
        got = s.download(y)
        want = 2.0 * x0.astype(np.float64) + y0
        err = float(np.max(np.abs(got - want)))
        ok &= err < 1e-5
        print(f"axpy, n={n}: max |error| vs numpy float64 = {err:.2e}")

        rows, cols = 1000, 3001
        a = rng.standard_normal((rows, cols))
        out = s.upload(np.full(rows, np.nan))
        s.launch(
            row_sum,
            LaunchConfig(rows, 256, shared_mem_bytes=256 * 8),
            [s.tensor_mut(out), s.tensor(s.upload(a)), rows, cols],
        )
        err = float(np.max(np.abs(s.download(out) - a.sum(axis=1))))
        ok &= err < 1e-9
        print(f"row_sum, {rows}x{cols}: max |error| vs numpy = {err:.2e}")

        reps = 2000
        s.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            s.launch(axpy, cfg, args)
        host_us = (time.perf_counter() - t0) / reps * 1e6
        start = s.record_event()
        s.launch(axpy, cfg, args)
        end = s.record_event()
        end.synchronize()
        gpu_ms = start.elapsed_ms(end)
        print(
            f"s.launch host cost: {host_us:.2f} us a launch (checked, {reps} launches); "
            f"one axpy on the GPU: {gpu_ms * 1e3:.1f} us"
        )

        try:
            s.launch(axpy, cfg, [s.tensor_mut(y), s.tensor(y), f32(2.0), u32(n)])
        except ValidationError as exc:
            print(f"refused as it should be: {exc}")
        else:
            ok = False
            print("ERROR: an overlapping launch was not refused")
    print("demo: all checks passed" if ok else "demo: a check FAILED")
    return 0 if ok else 1
