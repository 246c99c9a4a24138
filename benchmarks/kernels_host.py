"""Host cost of each ready kernel called as the README shows it, against torch's own op.

    python3 benchmarks/kernels_host.py [--json kernels_host.json] [--n 4096] [--matmul-parts]

n = 4096 float32 elements (64 x 64 for the row kernels; bf16 (64, 64) @ (64, 64) for the matrix
multiply), so the device keeps up with the host and the figure is the host's. Every call is
given the arrays themselves, as a user writes it: tf.Tensors of the session, torch tensors to a
session on its own stream (blocking: the driver orders it with torch's default stream, no
event), and torch tensors to a session opened on torch's current stream. torch's op is the one
that writes into an existing output where ours does (``fill_``, ``copy_``, ``add_``,
``out=``); ``sum`` and ``max`` make a new 0-d result in both libraries, and torch's softmax a
new output (it takes no ``out``).
All rows run interleaved in one process with the launch benchmark's timer (median of batches).
Before the timing every tenferro row's result is checked against torch's. ``--matmul-parts``
adds the pieces of a matmul call from torch tensors, each alone (sm_90 and later): one span, one
kept tensor map, and the launch of a kernel with the TMA kernel's parameters and config given
new maps each call.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from launch import Method, run_interleaved  # noqa: E402

import tenferro as tf  # noqa: E402
from tenferro import kernels as k  # noqa: E402


def cases(torch, n):
    """(name, tenferro call of (session, arrays), torch call of (arrays), inputs, output)."""
    rows = cols = round(n**0.5)
    dev = "cuda"
    x, y = torch.randn(n, device=dev), torch.randn(n, device=dev)
    x2 = torch.randn(rows, cols, device=dev)
    out, h = torch.empty(n, device=dev), torch.empty(n, device=dev, dtype=torch.float16)
    o2, ot = torch.empty(rows, cols, device=dev), torch.empty(cols, rows, device=dev)
    bf = {"dtype": torch.bfloat16, "device": dev}
    ma, mb, mc = (
        torch.randn(rows, 64, **bf),
        torch.randn(64, cols, **bf),
        (torch.empty(rows, cols, **bf)),
    )
    return [
        (
            "fill",
            lambda s, a: k.fill(s, a["out"], 1.5),
            lambda a: a["out"].fill_(1.5),
            {"out": out},
        ),
        (
            "cast f32->f16",
            lambda s, a: k.cast(s, a["h"], a["x"]),
            lambda a: a["h"].copy_(a["x"]),
            {"h": h, "x": x},
        ),
        (
            "axpy",
            lambda s, a: k.axpy(s, a["y"], a["x"], 0.5),
            lambda a: a["y"].add_(a["x"], alpha=0.5),
            {"y": y, "x": x},
        ),
        (
            "elementwise a*x+y*y",
            lambda s, a: k.elementwise(s, "a * x + y * y", a["out"], x=a["x"], y=a["y"], a=0.5),
            lambda a: torch.add(a["y"] * a["y"], a["x"], alpha=0.5, out=a["out"]),
            {"out": out, "x": x, "y": y},
        ),
        ("sum", lambda s, a: k.sum(s, a["x"]), lambda a: a["x"].sum(), {"x": x}),
        ("max", lambda s, a: k.max(s, a["x"]), lambda a: a["x"].max(), {"x": x}),
        (
            f"softmax rows {rows}x{cols}",
            lambda s, a: k.softmax(s, a["o2"], a["x2"]),
            lambda a: torch.softmax(a["x2"], 1),
            {"o2": o2, "x2": x2},
        ),
        (
            f"transpose {rows}x{cols}",
            lambda s, a: k.transpose(s, a["ot"], a["x2"]),
            lambda a: a["ot"].copy_(a["x2"].t()),
            {"ot": ot, "x2": x2},
        ),
        (
            "cumsum",
            lambda s, a: k.cumsum(s, a["out"], a["x"]),
            lambda a: torch.cumsum(a["x"], 0, out=a["out"]),
            {"out": out, "x": x},
        ),
        (
            "matmul bf16",
            lambda s, a: k.matmul(s, a["mc"], a["ma"], a["mb"]),
            lambda a: torch.matmul(a["ma"], a["mb"], out=a["mc"]),
            {"mc": mc, "ma": ma, "mb": mb},
        ),
    ]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--matmul-parts", action="store_true")
    ns = ap.parse_args()
    import torch

    tf.build_fast_launcher()  # the steady state: a hot process launches through the @njit path
    torch_stream = torch.cuda.current_stream().cuda_stream
    methods: list[Method] = []
    checked = []
    with tf.Session(0) as s, tf.Session(0, stream=torch_stream) as st:
        for name, ours, theirs, arrays in cases(torch, ns.n):
            own = {key: s.upload(_host_copy(v)) for key, v in arrays.items()}
            torch.cuda.synchronize()
            for label, sess, a in (
                ("tf.Tensors", s, own),
                ("torch, own stream", s, arrays),
                ("torch, torch's stream", st, arrays),
            ):
                checked.append((name, label, _agrees(torch, s, sess, ours, theirs, a, arrays)))
                methods.append(
                    Method(
                        f"{name}: tenferro, {label}",
                        lambda f=ours, sess=sess, a=a: f(sess, a),
                        batch=100,
                    )
                )
            methods.append(Method(f"{name}: torch", lambda f=theirs, a=arrays: f(a), batch=100))
            if ns.matmul_parts and name == "matmul bf16":
                methods += _matmul_parts(st, arrays)

        def sync() -> None:
            s.synchronize()
            st.synchronize()
            torch.cuda.synchronize()

        out = run_interleaved(methods, sync, rounds=30)
    print(f"{'n = ' + str(ns.n):<52} {'us/call':>8} {'x torch':>8}")
    table = {}
    for name, (med, _) in out.items():
        op = name.split(":")[0]
        base = out[f"{op}: torch"][0]
        table[name] = {"us": med, "x_torch": med / base}
        print(f"{name:<52} {med:>8.2f} {med / base:>8.2f}")
    print("\nResults against torch's, before the timing:")
    for name, label, err in checked:
        print(
            f"  {'ok ' if err is None else 'BAD'} {name}, {label}"
            + ("" if err is None else f": {err}")
        )
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"n": ns.n, "rows": table, "checked": checked}, f, indent=1)
    return 0 if all(err is None for *_, err in checked) else 1


# A kernel with the parameters of the TMA matmul's, which does nothing: its launch alone.
_THREE_MAPS = r"""
struct alignas(64) CUtensorMap_st { unsigned long long opaque[16]; };
typedef CUtensorMap_st CUtensorMap;
extern "C" __global__ void three_maps(const __grid_constant__ CUtensorMap c,
                                      const __grid_constant__ CUtensorMap a,
                                      const __grid_constant__ CUtensorMap b,
                                      unsigned m, unsigned n, unsigned k) {}
"""


def _matmul_parts(s, arrays):
    """The pieces of a matmul call from its torch tensors (64 x 64 bf16), each timed alone."""
    if s.context.compute_capability < (9, 0):
        return []  # tensor maps need sm_90
    out, a, b = s.tensor_mut(arrays["mc"]), s.tensor(arrays["ma"]), s.tensor(arrays["mb"])
    fn = s.compile(_THREE_MAPS).function("three_maps")
    # The TMA kernel's config at 64^3: one block, its ring and staging in shared memory.
    config = tf.LaunchConfig(1, 384, shared_mem_bytes=3 * 48 * 1024 + 2 * 16 * 1024 + 1024)

    def args():
        return [
            tf.tensor_map(out, box=(64, 64), swizzle=128),
            tf.tensor_map(a, box=(128, 64), swizzle=128),
            tf.tensor_map(b, box=(64, 64), swizzle=128),
            tf.u32(64),
            tf.u32(64),
            tf.u32(64),
        ]

    # Two lists of their own maps in turn: each launch packs new objects, as a matmul's does.
    turns = itertools.cycle([args(), args()])
    return [
        Method(
            "matmul bf16: part, s.tensor(torch tensor)", lambda: s.tensor(arrays["ma"]), batch=100
        ),
        Method(
            "matmul bf16: part, tf.tensor_map, kept",
            lambda: tf.tensor_map(a, box=(128, 64), swizzle=128),
            batch=100,
        ),
        Method(
            "matmul bf16: part, s.launch(3 new maps, 3 u32)",
            lambda: s.launch(fn, config, next(turns)),
            batch=100,
        ),
    ]


def _host_copy(v):
    """A numpy copy of torch tensor ``v``; bf16 (which torch cannot give numpy) as ml_dtypes'."""
    import ml_dtypes
    import torch

    if v.dtype == torch.bfloat16:
        return v.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
    return v.cpu().numpy()


def _agrees(torch, s, sess, ours, theirs, a, arrays):
    """None if ``ours`` on ``a`` gives torch's result (inputs refreshed first), else why not."""
    for v in arrays.values():  # fresh values everywhere: an unwritten output differs
        v.copy_(torch.randn_like(v, dtype=torch.float32).to(v.dtype))
    torch.cuda.synchronize()
    if a is not arrays:
        for key, v in arrays.items():
            s.copy(a[key], s.tensor(v))
    inputs = {key: v.clone() for key, v in arrays.items()}
    got = ours(sess, a)
    sess.synchronize()
    result = torch.from_dlpack(got) if got is not None else None
    mine = {
        key: torch.from_dlpack(v).clone() if a is not arrays else v.clone() for key, v in a.items()
    }
    for key, v in inputs.items():
        arrays[key].copy_(v)
    want = theirs(arrays)
    torch.cuda.synchronize()
    if result is not None or "o2" in mine:  # torch returns a new result: compare with it
        got = result if result is not None else mine["o2"]
        if not torch.allclose(got.double(), want.double(), rtol=1e-5, atol=1e-5):
            return f"result differs by {float((got.double() - want.double()).abs().max())}"
        return None
    for key, v in arrays.items():
        rtol = 2.0**-7 if v.dtype == torch.bfloat16 else 2e-3  # one bf16 rounding apart
        if not torch.allclose(mine[key].double(), v.double(), rtol=rtol, atol=1e-4):
            return f"{key} differs by {float((mine[key].double() - v.double()).abs().max())}"
    return None


if __name__ == "__main__":
    sys.exit(main())
