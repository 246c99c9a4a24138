"""Host cost of one launch of the same empty 4-argument kernel, side by side, in one process.

    source .whl/prelude.sh && python3 benchmarks/launch.py --json $OUT/launch.json

The kernel takes (float* a, const float* b, unsigned n, float x) and does nothing, launched with
1 block of 32 threads on a non-default stream. Each method's figure is the median over batches
of BATCH launches (a batch is timed from the first enqueue to the last, the queue is drained
between batches, so it never fills), and the sustained rate over SUSTAINED back-to-back
launches including the final synchronize. Every ratio is given against cuda.core ``launch`` and
against the C++ ``<<<>>>`` floor measured by a small nvcc-built program in the same run.
The tenferro fast paths are then shown still refusing a wrong argument.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tenferro as tf
from tenferro import _driver

SRC = r'''
extern "C" __global__ void empty4(float* a, const float* b, unsigned n, float x) {}
'''
BATCH, BATCHES, SUSTAINED = 200, 60, 20000

CPP = r'''
#include <cstdio>
#include <vector>
#include <algorithm>
#include <chrono>
#include <cuda_runtime.h>
__global__ void empty4(float* a, const float* b, unsigned n, float x) {}
int main() {
    cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float *a, *b; cudaMalloc(&a, 1024); cudaMalloc(&b, 1024);
    const int batch = BATCH_, batches = BATCHES_;
    std::vector<double> per;
    for (int w = 0; w < 3; ++w) {
        for (int i = 0; i < batch; ++i) empty4<<<1, 32, 0, s>>>(a, b, 7u, 1.f);
        cudaStreamSynchronize(s);
    }
    for (int k = 0; k < batches; ++k) {
        cudaStreamSynchronize(s);
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < batch; ++i) empty4<<<1, 32, 0, s>>>(a, b, 7u, 1.f);
        auto t1 = std::chrono::steady_clock::now();
        per.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / batch);
    }
    std::sort(per.begin(), per.end());
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < SUSTAINED_; ++i) empty4<<<1, 32, 0, s>>>(a, b, 7u, 1.f);
    cudaStreamSynchronize(s);
    auto t1 = std::chrono::steady_clock::now();
    printf("%.4f %.4f\n", per[per.size() / 2],
           std::chrono::duration<double, std::micro>(t1 - t0).count() / SUSTAINED_);
    return cudaGetLastError() != cudaSuccess;
}
'''


def measure(launch, sync, batch=BATCH, batches=BATCHES, sustained=SUSTAINED, per_call=1):
    """(median us per launch over batches, sustained us per launch)."""
    for _ in range(3):
        for _ in range(batch):
            launch()
        sync()
    per = []
    for _ in range(batches):
        sync()
        t0 = time.perf_counter()
        for _ in range(batch):
            launch()
        t1 = time.perf_counter()
        per.append((t1 - t0) / (batch * per_call) * 1e6)
    sync()
    n = sustained // per_call
    t0 = time.perf_counter()
    for _ in range(n):
        launch()
    sync()
    t1 = time.perf_counter()
    return statistics.median(per), (t1 - t0) / (n * per_call) * 1e6


def cpp_floor():
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                    if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc is None:
        raise RuntimeError("nvcc not found")
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "floor.cu")
        with open(src, "w") as f:
            f.write(CPP.replace("BATCH_", str(BATCH)).replace("BATCHES_", str(BATCHES))
                    .replace("SUSTAINED_", str(SUSTAINED)))
        exe = os.path.join(d, "floor")
        subprocess.run([nvcc, "-O2", "-arch=sm_90", src, "-o", exe], check=True,
                       capture_output=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", action="store_true", help="cProfile the s.launch hot path")
    ns = ap.parse_args()
    results: dict[str, dict] = {}
    skipped: dict[str, str] = {}

    def record(name, fn):
        try:
            med, sus = fn()
        except Exception as exc:  # an anchor missing on this machine is reported, not fatal
            skipped[name] = f"{type(exc).__name__}: {exc}"
            print(f"{name:<34} skipped: {skipped[name]}")
            return
        results[name] = {"median_us": med, "sustained_us": sus}
        print(f"{name:<34} {med:8.2f} us   sustained {sus:8.2f} us")

    record("C++ <<<>>> (nvcc)", cpp_floor)

    with tf.Session(device=0) as s:
        stream = s.stream_handle
        sync = s.synchronize
        mod = s.compile(SRC)
        fn = mod.function("empty4")
        a, b = s.alloc_zeros(256, np.float32), s.alloc_zeros(256, np.float32)
        cfg = tf.LaunchConfig(1, 32)
        args = [s.tensor_mut(a), s.tensor(b), tf.u32(7), tf.f32(1.0)]

        def bindings_prepacked():
            from cuda.bindings import driver as cu

            vals = (ctypes.c_uint64(a.ptr), ctypes.c_uint64(b.ptr), ctypes.c_uint32(7),
                    ctypes.c_float(1.0))
            ptrs = (ctypes.c_void_p * 4)(*(ctypes.addressof(v) for v in vals))
            addr = ctypes.addressof(ptrs)
            f, st = cu.CUfunction(fn.handle), cu.CUstream(stream)
            launch_kernel = cu.cuLaunchKernel

            def go():
                launch_kernel(f, 1, 1, 1, 32, 1, 1, 0, st, addr, 0)
            return measure(go, sync)

        def cuda_core():
            try:
                from cuda.core import Device, LaunchConfig, ObjectCode, launch
            except ImportError:
                from cuda.core.experimental import Device, LaunchConfig, ObjectCode, launch
            dev = Device(0)
            dev.set_current()

            class _S:
                def __cuda_stream__(self):
                    return (0, stream)
            cst = dev.create_stream(_S())
            kern = ObjectCode.from_cubin(tf.compile_cuda(SRC, arch="sm_90").image).get_kernel(
                "empty4")
            conf = LaunchConfig(grid=1, block=32)
            kargs = (np.intp(a.ptr), np.intp(b.ptr), np.uint32(7), np.float32(1.0))

            def go():
                launch(cst, conf, kern, *kargs)
            return measure(go, sync)

        def cupy_raw():
            import cupy as cp

            kern = cp.RawKernel(SRC, "empty4")
            ca = cp.zeros(256, cp.float32)
            cb = cp.zeros(256, cp.float32)
            ext = cp.cuda.ExternalStream(stream)
            kargs = (ca, cb, np.uint32(7), np.float32(1.0))
            with ext:
                return measure(lambda: kern((1,), (32,), kargs), sync)

        def numba_own():
            from numba import cuda

            @cuda.jit("void(float32[::1], float32[::1], uint32, float32)")
            def empty4(a, b, n, x):
                pass

            na, nb = cuda.device_array(256, np.float32), cuda.device_array(256, np.float32)
            nst = cuda.external_stream(stream)
            k = empty4[1, 32, nst]
            return measure(lambda: k(na, nb, np.uint32(7), np.float32(1.0)), sync,
                           sustained=SUSTAINED // 4)

        def triton_jit():
            import torch
            import triton

            @triton.jit
            def empty4(a, b, n, x):
                pass

            ta = torch.zeros(256, device="cuda")
            tb = torch.zeros(256, device="cuda")
            with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
                return measure(lambda: empty4[(1,)](ta, tb, 7, 1.0), sync,
                               sustained=SUSTAINED // 4)

        def njit_bare():
            launch = _driver.launcher()
            argv = (fn.handle, 1, 1, 1, 32, 1, 1, 0, stream, fn.block.address)
            fn.block.pack(args, s, "bench")
            return measure(lambda: launch(*argv), sync)

        def tf_launch():
            return measure(lambda: s.launch(fn, cfg, args), sync)

        def tf_bound():
            bound = s.bind(fn, cfg, args)
            return measure(bound, sync)

        def tf_numba():
            from numba import cuda

            def empty4(a, b, n, x):
                pass

            nk = s.numba_kernel(cuda.jit(empty4), "void(float32[::1], float32[::1], uint32, "
                                "float32)")
            return measure(lambda: s.launch(nk, cfg, args), sync)

        def tf_graph():
            with s.capture() as cap:
                for _ in range(100):
                    s.launch(fn, cfg, args)
            g = cap.graph
            return measure(g.launch, sync, batch=20, sustained=SUSTAINED, per_call=100)

        record("cuda.bindings pre-packed", bindings_prepacked)
        record("cuda.core launch", cuda_core)
        record("CuPy RawKernel", cupy_raw)
        record("numba kernel[grid, block, stream]", numba_own)
        record("Triton", triton_jit)
        record("tenferro launcher alone (njit)", njit_bare)
        record("tenferro s.launch", tf_launch)
        record("tenferro BoundLaunch()", tf_bound)
        record("tenferro numba kernel s.launch", tf_numba)
        record("tenferro graph replay (per kernel)", tf_graph)

        print("\nstill refused on the fast paths:")
        bad = [s.tensor_mut(a), s.tensor(b), tf.u32(7), tf.f64(1.0)]
        for name, attempt in (("s.launch", lambda: s.launch(fn, cfg, bad)),
                              ("s.bind", lambda: s.bind(fn, cfg, bad)),
                              ("BoundLaunch.update", lambda: s.bind(fn, cfg, args).update(
                                  3, tf.f64(1.0))),
                              ("s.launch overlap", lambda: s.launch(
                                  fn, cfg, [args[0], s.tensor(a), tf.u32(7), tf.f32(1)]))):
            try:
                attempt()
            except tf.ValidationError as exc:
                print(f"  {name}: ValidationError: {exc}")
            else:
                print(f"  {name}: NOT REFUSED")
                return 1

        if ns.profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            for _ in range(20000):
                s.launch(fn, cfg, args)
            prof.disable()
            s.synchronize()
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)

    core = results.get("cuda.core launch", {}).get("median_us")
    floor = results.get("C++ <<<>>> (nvcc)", {}).get("median_us")
    print(f"\n{'method':<34} {'median us':>10} {'x cuda.core':>12} {'x C++':>8}")
    for name, r in results.items():
        rc = f"{r['median_us'] / core:.2f}" if core else "-"
        rf = f"{r['median_us'] / floor:.2f}" if floor else "-"
        r["x_cuda_core"] = r["median_us"] / core if core else None
        r["x_cpp"] = r["median_us"] / floor if floor else None
        print(f"{name:<34} {r['median_us']:10.2f} {rc:>12} {rf:>8}")
    if ns.json:
        import numba_cuda

        meta = {"date": time.strftime("%Y-%m-%d"), "batch": BATCH, "batches": BATCHES,
                "sustained": SUSTAINED, "numba_cuda": numba_cuda.__version__,
                "driver": _driver.driver_version(), "python": sys.version.split()[0]}
        with contextlib.suppress(Exception):
            meta["gpu"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True, text=True).stdout.strip()
        with open(ns.json, "w") as f:
            json.dump({"meta": meta, "results": results, "skipped": skipped}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
