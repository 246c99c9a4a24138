"""tenferro.kernels against torch and CuPy for the same operation, on the GPU machine.

    python3 benchmarks/kernels.py --json kernels.json

Memory-bound kernels run on 256 MiB of float32 input; each figure is the median of REPS timed
batches of BATCH back-to-back calls, each batch enqueued behind a ~5 ms spin kernel on the
library's own stream, with CUDA events around the batch: the device's time is measured, not the
host's gaps between launches (the host's enqueue time a call is printed beside it, and that of
the same call given torch tensors over the same memory; each batch follows a synchronize, so
its first call is one after the host waited, which costs several times a back-to-back call
for every library: `kernels_host.py` times the host alone); reported as
bandwidth (bytes read + written by the operation, counted once) and as a fraction of the
device-to-device copy bandwidth measured first in the same run (`s.copy` of 256 MiB, timed
the same way). The matrix multiply is reported in TFLOP/s and as a
fraction of torch's (cuBLAS, which writes bf16 for bf16 inputs) for the same shapes, given
tf.Tensors and given torch tensors (the call users write), with the host's time a call.
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

import tenferro as tf
from tenferro import kernels as k

REPS = 20
BATCH = 10
N = (256 << 20) // 4  # float32 elements in 256 MiB


SPIN_SRC = r"""
extern "C" __global__ void spin(unsigned long long cycles) {
    unsigned long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}"""
SPIN_CYCLES = 10_000_000  # about 5 ms at the H200's clock: longer than any batch's enqueue
HOST = {}  # op label -> host microseconds a call, filled by the timers


# How a scan configuration loads its tile (the last field of rows.SCAN_CONFIGS).
_LOADS = ("registers", "cp.async")


def _timed(label, fn, spin, record, elapsed_ms):
    """Median device ms a call over REPS batches, each queued behind a spin kernel.

    The batch is enqueued while the spin runs, so the events around it time the device's
    work alone, not the host's gaps between launches; the enqueue time is kept in HOST.
    """
    for _ in range(3):
        fn()
    dev, host = [], []
    for _ in range(REPS):
        spin()
        a = record()
        t0 = time.perf_counter()
        for _ in range(BATCH):
            fn()
        host.append((time.perf_counter() - t0) / BATCH * 1e6)
        b = record()
        dev.append(elapsed_ms(a, b) / BATCH)
    HOST[label] = statistics.median(host)
    return statistics.median(dev)


# The module-level choices of kernels/gemm.py a matmul sweep changes (and puts back).
_GEMM_CHOICES = ("WGMMA", "TMA", "BF16_TILE", "WGMMA_TILE", "TMA_CONFIG")


def time_tf(s, fn, label="tenferro"):
    spin_fn = s.resource(("bench.spin",), lambda ss: ss.compile(SPIN_SRC)).function("spin")

    def elapsed(a, b):
        b.synchronize()
        return a.elapsed_ms(b)

    return _timed(
        label,
        fn,
        lambda: s.launch(spin_fn, tf.LaunchConfig(1, 1), [tf.u64(SPIN_CYCLES)]),
        s.record_event,
        elapsed,
    )


def time_torch(torch, fn, label="torch"):
    def record():
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def elapsed(a, b):
        b.synchronize()
        return a.elapsed_time(b)

    return _timed(label, fn, lambda: torch.cuda._sleep(SPIN_CYCLES), record, elapsed)


def time_cupy(cp, fn, label="cupy"):
    kern = cp.RawKernel(SPIN_SRC, "spin")

    def record():
        e = cp.cuda.Event()
        e.record()
        return e

    def elapsed(a, b):
        b.synchronize()
        return cp.cuda.get_elapsed_time(a, b)

    return _timed(label, fn, lambda: kern((1,), (1,), (np.uint64(SPIN_CYCLES),)), record, elapsed)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--sweep",
        nargs="?",
        const="all",
        choices=("all", "cumsum"),
        help="time sum at several blocks an SM (the capped grid-stride loop), "
        "softmax, transpose and cumsum at each compiled variant, then stop; "
        "'--sweep cumsum': the cumsum variants alone",
    )
    ap.add_argument("--no-matmul", action="store_true")
    ap.add_argument("--matmul-only", action="store_true", help="the matrix multiply rows alone")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the host side of fill, axpy and sum on small arrays, then stop",
    )
    ap.add_argument(
        "--matmul-sweep",
        action="store_true",
        help="time every compiled bf16 kernel and tile shape at 2048, 4096 and 8192 (the TMA "
        "kernel into f32 and into bf16), then stop",
    )
    ns = ap.parse_args()
    import cupy as cp
    import ml_dtypes
    import torch

    rows: list[dict] = []
    copy_tbs = None  # measured before the rows
    rng = np.random.default_rng(1)
    with tf.Session(device=0) as s:
        x = s.upload(rng.standard_normal(N, dtype=np.float32))
        y = s.upload(rng.standard_normal(N, dtype=np.float32))
        out = s.alloc_output((N,), np.float32)
        h = s.alloc_output((N,), np.float16)
        r, c = 4096, N // 4096
        x2 = s.upload(rng.standard_normal((r, c), dtype=np.float32))
        o2 = s.alloc_output((r, c), np.float32)
        ot = s.alloc_output((c, r), np.float32)
        tx, ty = torch.from_dlpack(x), torch.from_dlpack(y)
        tx2 = torch.from_dlpack(x2)
        cx, cy = cp.from_dlpack(x), cp.from_dlpack(y)
        cx2 = cp.from_dlpack(x2)
        s.synchronize()
        b4 = 4 * N
        cases = [
            (
                "fill",
                b4,
                lambda: k.fill(s, out, 1.5),
                lambda: tx.new_empty(N).fill_(1.5),
                lambda: cp.full(N, 1.5, cp.float32),
            ),
            (
                "cast f32->f16",
                b4 + 2 * N,
                lambda: k.cast(s, h, x),
                lambda: tx.half(),
                lambda: cx.astype(cp.float16),
            ),
            (
                "axpy",
                3 * b4,
                lambda: k.axpy(s, y, x, 0.5),
                lambda: ty.add_(tx, alpha=0.5),
                lambda: cp.add(cy, 0.5 * cx, out=cy),
            ),
            (
                "elementwise a*x+y*y",
                3 * b4,
                lambda: k.elementwise(s, "a * x + y * y", out, x=x, y=y, a=0.5),
                lambda: 0.5 * tx + ty * ty,
                lambda: 0.5 * cx + cy * cy,
            ),
            ("sum", b4, lambda: k.sum(s, x), lambda: tx.sum(), lambda: cx.sum()),
            ("max", b4, lambda: k.max(s, x), lambda: tx.max(), lambda: cx.max()),
            (
                f"softmax rows {r}x{c}",
                2 * b4,
                lambda: k.softmax(s, o2, x2),
                lambda: torch.softmax(tx2, dim=1),
                None,
            ),
            (
                f"transpose {r}x{c}",
                2 * b4,
                lambda: k.transpose(s, ot, x2),
                lambda: tx2.t().contiguous(),
                lambda: cp.ascontiguousarray(cx2.T),
            ),
            (
                "cumsum",
                2 * b4,
                lambda: k.cumsum(s, out, x),
                lambda: torch.cumsum(tx, 0),
                lambda: cp.cumsum(cx),
            ),
        ]
        tout, th = torch.from_dlpack(out), torch.from_dlpack(h)
        to2, tot = torch.from_dlpack(o2), torch.from_dlpack(ot)
        on_torch = [  # the same calls given torch tensors over the same memory (host time)
            lambda: k.fill(s, tout, 1.5),
            lambda: k.cast(s, th, tx),
            lambda: k.axpy(s, ty, tx, 0.5),
            lambda: k.elementwise(s, "a * x + y * y", tout, x=tx, y=ty, a=0.5),
            lambda: k.sum(s, tx),
            lambda: k.max(s, tx),
            lambda: k.softmax(s, to2, tx2),
            lambda: k.transpose(s, tot, tx2),
            lambda: k.cumsum(s, tout, tx),
        ]
        if ns.profile:
            import cProfile
            import pstats

            xs, ys = s.upload(np.ones(1024, np.float32)), s.upload(np.ones(1024, np.float32))
            ab = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
            ob = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
            for label, f in (
                ("fill", lambda: k.fill(s, ys, 1.5)),
                ("axpy", lambda: k.axpy(s, ys, xs, 0.5)),
                ("sum", lambda: k.sum(s, xs)),
                ("matmul bf16 64^3, torch tensors", lambda: k.matmul(s, ob, ab, ab)),
            ):
                for _ in range(100):
                    f()
                s.synchronize()
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(3000):
                    f()
                prof.disable()
                s.synchronize()
                print(f"--- {label}: 3000 calls")
                pstats.Stats(prof).sort_stats("tottime").print_stats(14)
            return 0
        if ns.matmul_sweep:
            from tenferro.kernels import gemm

            defaults = {name: getattr(gemm, name) for name in _GEMM_CHOICES}

            names = {"mma.sync": "BF16_TILE", "wgmma": "WGMMA_TILE", "tma": "TMA_CONFIG"}
            for size in (2048, 4096, 8192):
                a = s.upload(
                    rng.standard_normal((size, size), dtype=np.float32).astype(ml_dtypes.bfloat16)
                )
                b = s.upload(
                    rng.standard_normal((size, size), dtype=np.float32).astype(ml_dtypes.bfloat16)
                )
                ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
                t_to = time_torch(torch, lambda ta=ta, tb=tb: torch.matmul(ta, tb))
                for out_type in (np.float32, ml_dtypes.bfloat16):
                    cm = s.alloc_output((size, size), out_type)
                    for kernel, tile in (
                        [("mma.sync", t) for t in gemm.BF16_TILES]
                        + [("wgmma", t) for t in gemm.WGMMA_TILES]
                        + [("tma", t) for t in gemm.TMA_CONFIGS]
                    ):
                        if kernel != "tma" and out_type != np.float32:
                            continue  # the other kernels' epilogues are not what is chosen here
                        gemm.WGMMA, gemm.TMA = kernel != "mma.sync", kernel == "tma"
                        setattr(gemm, names[kernel], tile)
                        t = time_tf(s, lambda a=a, b=b, cm=cm: k.matmul(s, cm, a, b))
                        print(
                            f"matmul sweep {size} -> {np.dtype(out_type).name} {kernel} tile "
                            f"{tile}: {2 * size**3 / t / 1e9:6.1f} TFLOP/s, "
                            f"{t_to / t:4.0%} of cuBLAS",
                            flush=True,
                        )
            for name, value in defaults.items():  # the module's choices as they were
                setattr(gemm, name, value)
            return 0
        if ns.sweep:
            from tenferro.kernels import _build, rows

            def bw(case):
                _, nbytes, f_tf, _, _ = case
                return nbytes / time_tf(s, f_tf) / 1e9

            if ns.sweep == "all":
                per_sm_default = _build.BLOCKS_PER_SM
                for per_sm in (4, 8, 32, 1 << 20):  # the last: no cap, one step a thread
                    _build.BLOCKS_PER_SM = per_sm
                    print(
                        f"sweep {per_sm:3d} blocks/SM  {cases[4][0]:<8} {bw(cases[4]):5.2f} TB/s",
                        flush=True,
                    )
                _build.BLOCKS_PER_SM = per_sm_default
                defaults = rows.SOFTMAX_KERNEL, rows.SOFTMAX_REG, rows.SOFTMAX_WIDE_BLOCK
                for kernel, reg, block in (
                    ("online", 0, 512),
                    ("cached", 0, 512),
                    *(
                        ("split", r, b)
                        for r in rows.SOFTMAX_REGS
                        for b in (256, 512, 1024)
                        if r * b <= 8192
                    ),
                ):
                    rows.SOFTMAX_KERNEL, rows.SOFTMAX_REG = kernel, reg or 8
                    rows.SOFTMAX_WIDE_BLOCK = block
                    print(
                        f"sweep softmax {kernel} regs {reg:2d} {block:4d} threads a row  "
                        f"{bw(cases[6]):5.2f} TB/s",
                        flush=True,
                    )
                rows.SOFTMAX_KERNEL, rows.SOFTMAX_REG, rows.SOFTMAX_WIDE_BLOCK = defaults
                for tile in rows.TRANSPOSE_TILES:
                    rows.TRANSPOSE_TILE = tile
                    print(f"sweep transpose tile {tile}  {bw(cases[7]):5.2f} TB/s", flush=True)
            scan_default, ahead_default = rows.SCAN_CONFIG, rows.SCAN_AHEAD
            for config in rows.SCAN_CONFIGS:
                rows.SCAN_CONFIG = config
                print(
                    f"sweep cumsum {config[0]} threads x {config[1]} items a tile, status "
                    f"{config[2]} words apart, {config[3]} ns between polls, "
                    f"{config[4]} blocks an SM, load {_LOADS[config[5]]}  "
                    f"{bw(cases[8]):5.2f} TB/s",
                    flush=True,
                )
            rows.SCAN_CONFIG = scan_default
            for ahead in (0, 32 << 10, 48 << 10, 64 << 10):
                rows.SCAN_AHEAD = ahead
                print(
                    f"sweep cumsum default tile, prefetch {ahead >> 10} KiB an SM ahead  "
                    f"{bw(cases[8]):5.2f} TB/s",
                    flush=True,
                )
            rows.SCAN_AHEAD = ahead_default
            t_to = time_torch(torch, cases[8][3])
            print(f"sweep cumsum torch {cases[8][1] / t_to / 1e9:5.2f} TB/s", flush=True)
            if ns.sweep == "all":
                print(f"sweep cast f32->f16 {bw(cases[1]):5.2f} TB/s", flush=True)
            return 0
        copy_tbs = 2 * b4 / time_tf(s, lambda: s.copy(out, x), label="copy") / 1e9
        print(
            f"device copy (s.copy, 256 MiB)  {copy_tbs:5.2f} TB/s: each row's fraction is of this",
            flush=True,
        )
        memory_bound = [] if ns.matmul_only else list(zip(cases, on_torch, strict=True))
        for (name, nbytes, f_tf, f_torch, f_cp), f_tf_torch in memory_bound:
            ms = {"tenferro": time_tf(s, f_tf), "torch": time_torch(torch, f_torch)}
            time_tf(s, f_tf_torch, label="tenferro on torch tensors")
            if f_cp is not None:
                ms["cupy"] = time_cupy(cp, f_cp)
            row = {"op": name, "bytes": nbytes}
            for lib, m in ms.items():
                row[f"{lib}_ms"] = m
                row[f"{lib}_TBs"] = nbytes / m / 1e9
                row[f"{lib}_host_us"] = HOST[lib]
            row["tenferro_torch_tensors_host_us"] = HOST["tenferro on torch tensors"]
            row["fraction_of_copy"] = row["tenferro_TBs"] / copy_tbs
            row["x_torch_time"] = ms["tenferro"] / ms["torch"]
            rows.append(row)
            cp_s = f"{row['cupy_TBs']:7.2f}" if "cupy_TBs" in row else "      -"
            print(
                f"{name:<26} tenferro {row['tenferro_TBs']:5.2f} TB/s "
                f"({row['fraction_of_copy']:4.0%} of copy)  torch {row['torch_TBs']:5.2f}  "
                f"cupy {cp_s}  time vs torch {row['x_torch_time']:.2f}x  host us/call "
                f"tenferro {row['tenferro_host_us']:.1f} (on torch tensors "
                f"{row['tenferro_torch_tensors_host_us']:.1f}) torch "
                f"{row['torch_host_us']:.1f}",
                flush=True,
            )
        s.synchronize()
        mm = []
        # (inputs, output): bf16 into f32 or into bf16 (what torch's bf16 matmul writes), f32.
        kinds = () if ns.no_matmul else (("bf16", "f32"), ("bf16", "bf16"), ("f32", "f32"))
        np_types = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}
        for dtype, out_type in kinds:
            sizes = (2048, 4096, 8192) if dtype == "bf16" else (4096, 8192)
            for size in sizes:
                m_ = n_ = k_ = size
                a_np = rng.standard_normal((m_, k_), dtype=np.float32).astype(np_types[dtype])
                b_np = rng.standard_normal((k_, n_), dtype=np.float32).astype(np_types[dtype])
                a, b = s.upload(a_np), s.upload(b_np)
                cm = s.alloc_output((m_, n_), np_types[out_type])
                ta, tb, tc = torch.from_dlpack(a), torch.from_dlpack(b), torch.from_dlpack(cm)
                s.synchronize()
                t_tf = time_tf(s, lambda a=a, b=b, cm=cm: k.matmul(s, cm, a, b))
                # The call users write: torch tensors, fresh spans each call.
                t_tt = time_tf(
                    s, lambda ta=ta, tb=tb, tc=tc: k.matmul(s, tc, ta, tb), label="on torch"
                )
                t_to = time_torch(torch, lambda ta=ta, tb=tb: torch.matmul(ta, tb))
                flop = 2 * m_ * n_ * k_
                row = {
                    "op": f"matmul {dtype}->{out_type} {m_}x{n_}x{k_}",
                    "tenferro_TFLOPs": flop / t_tf / 1e9,
                    "tenferro_torch_tensors_TFLOPs": flop / t_tt / 1e9,
                    "torch_TFLOPs": flop / t_to / 1e9,
                    "fraction_of_cublas": t_to / t_tf,
                    "tenferro_torch_tensors_host_us": HOST["on torch"],
                    "torch_host_us": HOST["torch"],
                }
                mm.append(row)
                print(
                    f"{row['op']:<32} tenferro {row['tenferro_TFLOPs']:6.1f} TFLOP/s "
                    f"(on torch tensors {row['tenferro_torch_tensors_TFLOPs']:6.1f}, host "
                    f"{HOST['on torch']:.1f} us)  torch (cuBLAS) {row['torch_TFLOPs']:6.1f} "
                    f"(host {HOST['torch']:.1f} us)  {row['fraction_of_cublas']:4.0%} of cuBLAS",
                    flush=True,
                )
                s.synchronize()
    if ns.json:
        meta = {
            "date": time.strftime("%Y-%m-%d"),
            "reps": REPS,
            "batch": BATCH,
            "copy_TBs": copy_tbs,
            "torch": torch.__version__,
            "cupy": cp.__version__,
            "tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        }
        with open(ns.json, "w") as f:
            json.dump({"meta": meta, "memory_bound": rows, "matmul": mm}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
