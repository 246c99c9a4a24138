"""Host cost of one launch of the same empty 4-argument kernel, side by side, in one process.

    python3 benchmarks/launch.py --json launch.json

The kernel takes (float* a, const float* b, unsigned n, float x) and does nothing, launched with
1 block of 32 threads on a non-default stream. Each method's figure is the median over batches
of BATCH launches (a batch is timed from the first enqueue to the last, the queue is drained
between batches, so it never fills), and the sustained rate over SUSTAINED back-to-back
launches including the final synchronize. Every ratio is given against cuda.core ``launch`` and
against the C++ ``<<<>>>`` floor: an nvcc-built shared library called through ctypes, timed in
C++ on the same stream. The methods are interleaved: each round times one batch of every
method, in a shuffled order, so all of them see the same machine conditions.
The tenferro fast paths are then shown still refusing a wrong argument.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import random
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
from tenferro.session import state_of

SRC = r"""
extern "C" __global__ void empty4(float* a, const float* b, unsigned n, float x) {}
"""
BATCH, BATCHES, SUSTAINED = 200, 60, 20000

CPP = r"""
#include <chrono>
#include <cuda_runtime.h>
__global__ void empty4(float* a, const float* b, unsigned n, float x) {}
// Microseconds per launch of n <<<>>> launches on `stream`, timed in C++ (enqueue only).
extern "C" double floor_batch(void* stream, int n, float* a, const float* b) {
    cudaStream_t s = (cudaStream_t)stream;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) empty4<<<1, 32, 0, s>>>(a, b, 7u, 1.f);
    auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
}
// The same, back to back, including the final synchronize.
extern "C" double floor_sustained(void* stream, int n, float* a, const float* b) {
    cudaStream_t s = (cudaStream_t)stream;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) empty4<<<1, 32, 0, s>>>(a, b, 7u, 1.f);
    cudaStreamSynchronize(s);
    auto t1 = std::chrono::steady_clock::now();
    return cudaGetLastError() == cudaSuccess
        ? std::chrono::duration<double, std::micro>(t1 - t0).count() / n : -1.0;
}
"""


class Method:
    """One way to launch: ``go()`` enqueues ``per_call`` launches."""

    def __init__(
        self,
        name,
        go,
        per_call=1,
        batch=BATCH,
        sustained=SUSTAINED,
        timed=None,
        timed_sustained=None,
    ):
        self.name, self.go, self.per_call, self.batch = name, go, per_call, batch
        self.sustained = sustained
        self.timed, self.timed_sustained = timed, timed_sustained  # C-timed methods
        self.per = []


def run_interleaved(methods, sync, rounds=BATCHES, seed=0):
    """Time one batch of every method per round, in a shuffled order each round.

    Interleaving puts every method under the same machine conditions (clocks, other load), so
    the ratios of one run compare like with like. Returns {name: (median us, sustained us)}.
    """
    rng = random.Random(seed)
    for m in methods:
        for _ in range(3):
            if m.timed is not None:
                m.timed(m.batch)
            else:
                for _ in range(m.batch):
                    m.go()
            sync()
    order = list(methods)
    for _ in range(rounds):
        rng.shuffle(order)
        for m in order:
            sync()
            if m.timed is not None:
                m.per.append(m.timed(m.batch))
                continue
            go = m.go
            t0 = time.perf_counter()
            for _ in range(m.batch):
                go()
            t1 = time.perf_counter()
            m.per.append((t1 - t0) / (m.batch * m.per_call) * 1e6)
    out = {}
    for m in methods:
        sync()
        n = m.sustained // m.per_call
        if m.timed_sustained is not None:
            out[m.name] = (statistics.median(m.per), m.timed_sustained(n))
            continue
        go = m.go
        t0 = time.perf_counter()
        for _ in range(n):
            go()
        sync()
        t1 = time.perf_counter()
        out[m.name] = (statistics.median(m.per), (t1 - t0) / (n * m.per_call) * 1e6)
    return out


def build_floor_library(directory):
    """Build the C++ floor as a shared library with nvcc; its launches go on our stream."""
    nvcc = shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None
    )
    if nvcc is None:
        raise RuntimeError("nvcc not found")
    src = os.path.join(directory, "floor.cu")
    with open(src, "w") as f:
        f.write(CPP)
    so = os.path.join(directory, "libfloor.so")
    subprocess.run(
        [nvcc, "-O2", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", src, "-o", so],
        check=True,
        capture_output=True,
    )
    lib = ctypes.CDLL(so)
    for name in ("floor_batch", "floor_sustained"):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_double
        fn.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    return lib


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", action="store_true", help="cProfile the s.launch hot path")
    ns = ap.parse_args()
    results: dict[str, dict] = {}
    skipped: dict[str, str] = {}

    methods: list[Method] = []

    def setup(name, fn):
        try:
            go, kw = fn()
        except Exception as exc:  # an anchor missing on this machine is reported, not fatal
            skipped[name] = f"{type(exc).__name__}: {exc}"
            print(f"{name:<36} skipped: {skipped[name]}")
            return
        methods.append(Method(name, go, **kw))

    tf.build_fast_launcher()  # the steady state: a hot process launches through the @njit path
    with tf.Session(device=0) as s, tempfile.TemporaryDirectory() as tmpdir:
        stream = s.stream
        sync = s.synchronize
        mod = s.compile(SRC)
        fn = mod.function("empty4")
        a, b = s.alloc_zeros(256, np.float32), s.alloc_zeros(256, np.float32)
        cfg = tf.LaunchConfig(1, 32)
        args = [s.tensor_mut(a), s.tensor(b), tf.u32(7), tf.f32(1.0)]

        def cpp_floor():
            lib = build_floor_library(tmpdir)
            batch = lambda n: lib.floor_batch(stream, n, a.ptr, b.ptr)  # noqa: E731
            sustained = lambda n: lib.floor_sustained(stream, n, a.ptr, b.ptr)  # noqa: E731
            return None, {"timed": batch, "timed_sustained": sustained}

        def bindings_prepacked():
            from cuda.bindings import driver as cu

            vals = (
                ctypes.c_uint64(a.ptr),
                ctypes.c_uint64(b.ptr),
                ctypes.c_uint32(7),
                ctypes.c_float(1.0),
            )
            ptrs = (ctypes.c_void_p * 4)(*(ctypes.addressof(v) for v in vals))
            addr = ctypes.addressof(ptrs)
            f, st = cu.CUfunction(fn.handle), cu.CUstream(stream)
            launch_kernel = cu.cuLaunchKernel

            def go(_keep=(vals, ptrs)):  # the block must outlive setup: go owns it
                launch_kernel(f, 1, 1, 1, 32, 1, 1, 0, st, addr, 0)

            return go, {}

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
                "empty4"
            )
            conf = LaunchConfig(grid=1, block=32)
            kargs = (np.intp(a.ptr), np.intp(b.ptr), np.uint32(7), np.float32(1.0))

            def go():
                launch(cst, conf, kern, *kargs)

            return go, {}

        def cupy_raw():
            import cupy as cp

            kern = cp.RawKernel(SRC, "empty4")
            ca = cp.zeros(256, cp.float32)
            cb = cp.zeros(256, cp.float32)
            cp.cuda.ExternalStream(stream).use()  # cupy's current stream from here on
            kargs = (ca, cb, np.uint32(7), np.float32(1.0))
            return (lambda: kern((1,), (32,), kargs)), {}

        def numba_own():
            from numba import cuda

            @cuda.jit("void(float32[::1], float32[::1], uint32, float32)")
            def empty4(a, b, n, x):
                pass

            na, nb = cuda.device_array(256, np.float32), cuda.device_array(256, np.float32)
            nst = cuda.external_stream(stream)
            k = empty4[1, 32, nst]
            return (lambda: k(na, nb, np.uint32(7), np.float32(1.0))), {"sustained": SUSTAINED // 4}

        def triton_jit():
            import torch
            import triton

            @triton.jit
            def empty4(a, b, n, x):
                pass

            ta = torch.zeros(256, device="cuda")
            tb = torch.zeros(256, device="cuda")
            torch.cuda.set_stream(torch.cuda.ExternalStream(stream))
            return (lambda: empty4[(1,)](ta, tb, 7, 1.0)), {"sustained": SUSTAINED // 4}

        def njit_bare():
            launch = _driver.launcher()
            fn.param_block.pack(args, state_of(s), "bench")
            rec = _driver.LaunchRecord(fn.handle, cfg.dims, stream, fn.param_block.address)
            addr = rec.address

            def go(_keep=rec):  # the launcher reads the record's words: go owns it
                launch(addr)

            return go, {}

        def tf_launch():
            return (lambda: s.launch(fn, cfg, args)), {}

        def tf_bound():
            bound = s.bind(fn, cfg, args)
            return bound, {}

        def tf_numba():
            from numba import cuda

            def empty4(a, b, n, x):
                pass

            nk = s.numba_kernel(
                cuda.jit(empty4), "void(float32[::1], float32[::1], uint32, float32)"
            )
            return (lambda: s.launch(nk, cfg, args)), {}

        def tf_graph():
            with s.capture() as cap:
                for _ in range(100):
                    s.launch(fn, cfg, args)
            g = cap.graph
            return g.launch, {"batch": 20, "per_call": 100}

        setup("C++ <<<>>> (nvcc)", cpp_floor)
        setup("cuda.bindings pre-packed", bindings_prepacked)
        setup("cuda.core launch", cuda_core)
        setup("CuPy RawKernel", cupy_raw)
        setup("numba kernel[grid, block, stream]", numba_own)
        setup("Triton", triton_jit)
        setup("tenferro launcher alone (njit)", njit_bare)
        setup("tenferro s.launch", tf_launch)
        setup("tenferro BoundLaunch()", tf_bound)
        setup("tenferro numba kernel s.launch", tf_numba)
        setup("tenferro graph replay (per kernel)", tf_graph)
        for name, (med, sus) in run_interleaved(methods, sync).items():
            results[name] = {"median_us": med, "sustained_us": sus}

        print("\nstill refused on the fast paths:")
        bad = [s.tensor_mut(a), s.tensor(b), tf.u32(7), tf.f64(1.0)]
        for name, attempt in (
            ("s.launch", lambda: s.launch(fn, cfg, bad)),
            ("s.bind", lambda: s.bind(fn, cfg, bad)),
            ("BoundLaunch.update", lambda: s.bind(fn, cfg, args).update(3, tf.f64(1.0))),
            (
                "s.launch overlap",
                lambda: s.launch(fn, cfg, [args[0], s.tensor(a), tf.u32(7), tf.f32(1)]),
            ),
        ):
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
    print(f"\n{'method':<36} {'median us':>10} {'sustained':>10} {'x cuda.core':>12} {'x C++':>8}")
    for name, r in results.items():
        rc = f"{r['median_us'] / core:.2f}" if core else "-"
        rf = f"{r['median_us'] / floor:.2f}" if floor else "-"
        r["x_cuda_core"] = r["median_us"] / core if core else None
        r["x_cpp"] = r["median_us"] / floor if floor else None
        print(f"{name:<36} {r['median_us']:10.2f} {r['sustained_us']:10.2f} {rc:>12} {rf:>8}")
    if ns.json:
        import numba_cuda

        meta = {
            "date": time.strftime("%Y-%m-%d"),
            "batch": BATCH,
            "batches": BATCHES,
            "sustained": SUSTAINED,
            "numba_cuda": numba_cuda.__version__,
            "driver": _driver.driver_version(),
            "python": sys.version.split()[0],
        }
        with contextlib.suppress(Exception):
            meta["gpu"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
            ).stdout.strip()
        with open(ns.json, "w") as f:
            json.dump({"meta": meta, "results": results, "skipped": skipped}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
