"""Host cost of a tenferro kernel as a torch operator, beside the same math as a Triton op.

    python3 benchmarks/torch_op.py [--json torch_op.json]

y = a * x + sin(y) in place on n = 4096 float32 torch tensors, one call each time, every method
interleaved in one process with the launch benchmark's timer (median of batches). The anchor is
a Triton kernel registered with ``torch.library.triton_op`` (the way torch documents custom
Triton operators); beside it the same tenferro launch called directly in a session on torch's
stream (no operator dispatch), and torch's eager ``y.copy_(a * x + y.sin())``.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from launch import Method, run_interleaved  # noqa: E402

import tenferro as tf  # noqa: E402

N = 4096
SRC = r"""
extern "C" __global__ void axpy_sin(float* y, const float* x, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + sinf(y[i]);
}"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    import torch
    import triton
    import triton.language as tl
    from torch.library import triton_op, wrap_triton

    import tenferro.torch as tft

    tf.build_fast_launcher()

    @triton.jit
    def axpy_sin_kernel(y_ptr, x_ptr, a, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        y = tl.load(y_ptr + i, mask=m)
        tl.store(y_ptr + i, a * tl.load(x_ptr + i, mask=m) + tl.sin(y), mask=m)

    @triton_op("bench::axpy_sin_triton", mutates_args={"y"})
    def axpy_sin_triton(y: torch.Tensor, x: torch.Tensor, a: float) -> None:
        n = y.numel()
        wrap_triton(axpy_sin_kernel)[(triton.cdiv(n, 256),)](y, x, a, n, BLOCK=256)

    @tft.op("bench::axpy_sin_tenferro", mutates_args=("y",))
    def axpy_sin_tf(s: tf.Session, y: torch.Tensor, x: torch.Tensor, a: float) -> None:
        n = y.numel()
        fn = s.resource("bench.axpy_sin", lambda s: s.compile(SRC).function("axpy_sin"))
        s.launch(
            fn, tf.LaunchConfig.flat(n, 256), [s.tensor_mut(y), s.tensor(x), tf.f32(a), tf.u32(n)]
        )

    y, x = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    s = tft.session_for()
    fn = s.compile(SRC).function("axpy_sin")
    cfg = tf.LaunchConfig.flat(N, 256)
    methods = [
        Method("Triton op (torch.library.triton_op)", lambda: axpy_sin_triton(y, x, 0.5)),
        Method("tenferro op (tenferro.torch.op)", lambda: axpy_sin_tf(y, x, 0.5)),
        Method(
            "tenferro launch, no operator",
            lambda: s.launch(fn, cfg, [s.tensor_mut(y), s.tensor(x), tf.f32(0.5), tf.u32(N)]),
        ),
        Method("torch eager y.copy_(a * x + y.sin())", lambda: y.copy_(0.5 * x + y.sin())),
    ]
    res = run_interleaved(methods, torch.cuda.synchronize)
    base = res[methods[0].name][0]
    print(f"{'method':<42} {'us':>8} {'x Triton op':>12}")
    for m in methods:
        us = res[m.name][0]
        print(f"{m.name:<42} {us:8.2f} {us / base:12.2f}")
    torch.cuda.synchronize()
    tft.close_sessions()
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({m.name: res[m.name][0] for m in methods}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
