"""Host cost of the launch users write: y = 2x + y on n = 4096 float32, arguments made each call.

    python3 benchmarks/user_path.py [--json user_path.json] [--profile]

Every method is given the tensors themselves on each call (fresh spans and scalars for
tenferro, as the README writes it), and all run interleaved in one process with the launch
benchmark's timer (median of batches; see benchmarks/launch.py). The anchors are cuda.core's
``launch`` with ``data_ptr()`` ints and torch's own ``add_``; the rows with spans made once are
the floor the fresh-argument rows are measured against, not a path users write. ``--profile``
adds rows for the parts of the torch-tensor row: torch's own field reads, each span, the two
scalars, the event record and wait that orders the session after torch's stream.

After the timing, the same process puts the fast paths (spans of torch tensors given again,
the launch's identity shortcut warm) to the cases they must still refuse or order: a torch
tensor of the wrong dtype, a producer stream still asleep before it writes the input (a torch
side stream; torch's default stream, and torch's read of the output after it), a read-only
producer given to ``tensor_mut``, a read-only span where the numba kernel writes,
and an overlap. Each refused launch must leave the output as it was; the run fails if one does not.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from _axpy import AXPY_SRC  # noqa: E402
from launch import Method, run_interleaved  # noqa: E402

import tenferro as tf  # noqa: E402

N = 4096


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", action="store_true")
    ns = ap.parse_args()
    import torch

    torch_stream = torch.cuda.current_stream().cuda_stream
    y, x = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    methods: list[Method] = []
    from tenferro import _driver

    tf.build_fast_launcher()  # the steady state: a hot process launches through the @njit path
    with tf.Session(0) as s, tf.Session(0, stream=torch_stream) as st:
        cfg = tf.LaunchConfig.flat(N, 256)
        fn, fn_t = s.compile(AXPY_SRC).function("axpy"), st.compile(AXPY_SRC).function("axpy")
        ty, tx = (
            s.upload(np.random.rand(N).astype(np.float32)),
            s.upload(np.random.rand(N).astype(np.float32)),
        )

        def readme(sess: tf.Session, f: tf.Function, yy: object, xx: object):
            return lambda: sess.launch(
                f, cfg, [sess.tensor_mut(yy), sess.tensor(xx), tf.f32(2.0), tf.u32(N)]
            )

        try:
            from cuda.core import Device, LaunchConfig, ObjectCode, launch
        except ImportError:
            from cuda.core.experimental import Device, LaunchConfig, ObjectCode, launch
        dev = Device(0)
        dev.set_current()

        class _Torch:
            def __cuda_stream__(self):
                return (0, torch_stream)

        cst = dev.create_stream(_Torch())
        cubin = tf.compile_cuda(AXPY_SRC, arch="sm_90").image
        kern = ObjectCode.from_cubin(cubin).get_kernel("axpy")
        conf = LaunchConfig(grid=(N + 255) // 256, block=256)
        methods.append(
            Method(
                "cuda.core launch, data_ptr() ints",
                lambda: launch(
                    cst, conf, kern, y.data_ptr(), x.data_ptr(), np.float32(2.0), np.uint32(N)
                ),
            )
        )
        methods.append(Method("torch y.add_(x, alpha=2)", lambda: y.add_(x, alpha=2)))
        methods.append(Method("tenferro, torch tensors, own stream", readme(s, fn, y, x)))
        methods.append(Method("tenferro, torch tensors, torch's stream", readme(st, fn_t, y, x)))
        methods.append(Method("tenferro, tf.Tensors, fresh spans", readme(s, fn, ty, tx)))
        methods.append(
            Method(  # a model's activations: another tensor object every call
                "tenferro, new torch views each call, torch's stream",
                lambda: st.launch(
                    fn_t,
                    cfg,
                    [st.tensor_mut(y.view(N)), st.tensor(x.view(N)), tf.f32(2.0), tf.u32(N)],
                ),
            )
        )
        from numba import cuda

        @cuda.jit
        def axpy_numba(yy, xx, a, n):
            i = cuda.grid(1)
            if i < n:
                yy[i] = a * xx[i] + yy[i]

        nk = s.numba_kernel(axpy_numba)  # specialised on the arguments, as launch sees them
        nb_stream = cuda.external_stream(torch_stream or 1)
        grid = (N + 255) // 256
        methods.append(
            Method(
                "numba kernel[grid, block](as_cuda_array), torch tensors",
                lambda: axpy_numba[grid, 256, nb_stream](
                    cuda.as_cuda_array(y), cuda.as_cuda_array(x), np.float32(2.0), np.int64(N)
                ),
            )
        )
        methods.append(
            Method(
                "tenferro s.launch of that numba kernel, torch tensors",
                lambda: s.launch(
                    nk, cfg, [s.tensor_mut(y), s.tensor(x), np.float32(2.0), np.int64(N)]
                ),
            )
        )
        nk_t = st.numba_kernel(axpy_numba)  # on torch's stream, as numba's launch above is
        methods.append(
            Method(
                "the same, session on torch's stream",
                lambda: st.launch(
                    nk_t, cfg, [st.tensor_mut(y), st.tensor(x), np.float32(2.0), np.int64(N)]
                ),
            )
        )
        from tenferro import kernels

        methods.append(
            Method(
                "tenferro.kernels.axpy(s, y, x, 2.0), torch tensors",
                lambda: kernels.axpy(s, y, x, 2.0),
            )
        )
        reused = [s.tensor_mut(ty), s.tensor(tx), tf.f32(2.0), tf.u32(N)]
        methods.append(
            Method("tenferro, spans made once (floor)", lambda: s.launch(fn, cfg, reused))
        )

        if ns.profile:
            from tenferro.interop.streams import order_after

            ev = _driver.event_create()
            held = [None]
            methods += [
                Method(
                    "part: torch fields (data_ptr dtype shape stride device grad)",
                    lambda: (
                        y.data_ptr(),
                        y.dtype,
                        y.shape,
                        y.stride(),
                        y.get_device(),
                        y.requires_grad,
                    ),
                ),
                # the README loop's case: the span of the last call is held, and given again
                Method(
                    "part: s.tensor(x), torch tensor, the kept span",
                    lambda: held.__setitem__(0, s.tensor(x)),
                ),
                # nothing holds the span these rows make, so each call makes a new one
                Method("part: s.tensor(x), torch tensor, a new span", lambda: s.tensor(x)),
                Method("part: s.tensor_mut(y), torch tensor, a new span", lambda: s.tensor_mut(y)),
                Method(
                    "part: two torch views y.view(n), x.view(n)", lambda: (y.view(N), x.view(N))
                ),
                Method("part: tf.f32(2.0) and tf.u32(n)", lambda: (tf.f32(2.0), tf.u32(N))),
                Method(
                    "part: event record on torch's stream, wait on ours",
                    lambda: order_after(s.stream, torch_stream or 1, ev, "bench"),
                ),
            ]

        def sync() -> None:
            s.synchronize()
            st.synchronize()
            torch.cuda.synchronize()

        out = run_interleaved(methods, sync, rounds=40)
        checks = fast_path_checks(torch, s, fn, nk, cfg, y, x)
    base = out["cuda.core launch, data_ptr() ints"][0]
    print(f"{'method':<56} {'median us':>10} {'x cuda.core':>12}")
    for name, (med, _) in out.items():
        print(f"{name:<56} {med:>10.2f} {med / base:>12.2f}")
    print("\nOn the same fast paths, in the same process:")
    for case, outcome, ok in checks:
        print(f"  {'ok ' if ok else 'BAD'} {case}: {outcome}")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(
                {
                    "us": {k: v[0] for k, v in out.items()},
                    "checks": [[c, o, ok] for c, o, ok in checks],
                },
                f,
                indent=1,
            )
    return 0 if all(ok for _, _, ok in checks) else 1


def fast_path_checks(torch, s, fn, nk, cfg, y, x) -> list[tuple[str, str, bool]]:
    """(case, what happened, as it must) for the refusals and orderings the fast paths keep.

    ``y`` and ``x`` are the torch tensors the timed rows used: their spans are kept and the
    launch remembers them, so each case runs where the shortcuts would skip a check.
    """
    rows = []

    def refused(case: str, make_args, kernel=fn) -> None:
        warm = [s.tensor_mut(y), s.tensor(x), tf.f32(2.0), tf.u32(N)]
        if kernel is nk:
            warm[2:] = [np.float32(2.0), np.int64(N)]
        s.launch(kernel, cfg, warm)  # the fast paths remember these
        s.synchronize()
        before = y.clone()
        torch.cuda.synchronize()
        try:
            s.launch(kernel, cfg, make_args())
        except tf.ValidationError as exc:
            s.synchronize()
            kept = bool(torch.equal(y, before))
            rows.append((case, f"refused: {exc}" + ("" if kept else "; y CHANGED"), kept))
        else:
            s.synchronize()
            rows.append((case, "launched", False))

    x64 = x.double()
    refused(
        "a float64 torch tensor where the kernel reads float",
        lambda: [s.tensor_mut(y), s.tensor(x64), tf.f32(2.0), tf.u32(N)],
    )
    refused(
        "y given twice, once written (an overlap)",
        lambda: [s.tensor_mut(y), s.tensor(y), tf.f32(2.0), tf.u32(N)],
    )
    refused(
        "a read-only span where the numba kernel writes",  # C's float* may only read
        lambda: [s.tensor(y), s.tensor(x), np.float32(2.0), np.int64(N)],
        nk,
    )

    class ReadOnly:  # a producer that says its memory must not be written
        def __init__(self, t):
            self.__cuda_array_interface__ = dict(
                t.__cuda_array_interface__, data=(t.data_ptr(), True)
            )

    try:
        s.tensor_mut(ReadOnly(y))
    except tf.ValidationError as exc:
        rows.append(("a read-only producer given to tensor_mut", f"refused: {exc}", True))
    else:
        rows.append(("a read-only producer given to tensor_mut", "accepted", False))

    # Another stream: torch's current stream sleeps, then writes x; the launch on the
    # session's own stream must wait for it (an event, no host synchronize).
    side = torch.cuda.Stream()
    s.synchronize()
    torch.cuda.synchronize()
    want = y + 3.0  # y + 2 * 1.5 in float32, rounded as the kernel's fma rounds it
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # about 0.1 s of the device's clock
        x.fill_(1.5)
        s.launch(fn, cfg, [s.tensor_mut(y), s.tensor(x), tf.f32(2.0), tf.u32(N)])
    s.synchronize()
    err = float((y.double() - want.double()).abs().max())
    rows.append(
        (
            "x written on another torch stream after a spin, read by our launch",
            f"ordered: max |y - (y0 + 2 * 1.5)| = {err:.1e} (float32)",
            err == 0,
        )
    )

    # torch's default stream, both ways, no event: torch writes x late and our launch reads
    # it; the session's stream is held back before that launch, and torch reads y at once.
    want = y + 3.0
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    x.fill_(0.5)
    x.add_(1.0)
    with torch.cuda.stream(torch.cuda.ExternalStream(s.stream)):
        torch.cuda._sleep(200_000_000)  # on the session's own stream
    s.launch(fn, cfg, [s.tensor_mut(y), s.tensor(x), tf.f32(2.0), tf.u32(N)])
    got = y.double()  # torch's op on its default stream, right after the launch
    err = float((got - want.double()).abs().max())
    rows.append(
        (
            "x written late on torch's default stream, read by our launch on a held-back "
            "own stream, y read by torch at once",
            f"ordered: max |y - (y0 + 2 * 1.5)| = {err:.1e} (float32)",
            err == 0,
        )
    )
    return rows


if __name__ == "__main__":
    sys.exit(main())
