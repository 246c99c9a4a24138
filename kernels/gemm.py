"""Tiled matrix multiply: f32 on the CUDA cores, bf16 on the tensor cores (mma.sync, wgmma)."""

from __future__ import annotations

from typing import Any

from tenferro import LaunchConfig, ValidationError, u32

from ._build import check_session, function
from .rows import transpose

__all__ = ["matmul"]

_FILE = "matmul.cu"
# bf16 tile shapes (BM, BN, warps along M, warps along N, pipeline stages, BK) that are
# compiled; BF16_TILE is the one used, chosen on the H200 by benchmarks/kernels.py
# --matmul-sweep.
BF16_TILES = (
    (128, 128, 2, 2, 3, 64),
    (128, 128, 2, 2, 4, 32),
    (256, 128, 4, 2, 3, 64),
    (128, 256, 2, 4, 3, 64),
    (128, 256, 2, 4, 4, 32),
)
BF16_TILE = BF16_TILES[0]
_PIPELINED = tuple("matmul_bf16_pipelined<{}, {}, {}, {}, {}, {}>".format(*t) for t in BF16_TILES)
_EXPRS = ("matmul_f32", "matmul_bf16", *_PIPELINED)
# Hopper (compute capability 9.0): the warpgroup kernel of matmul_sm90.cu, compiled for sm_90a,
# at (BN, stages); B is first transposed to K-major. WGMMA turns it off (the mma.sync kernel
# then serves, as on every other device). H200 sweep (2026-12-03, --matmul-sweep): (256, 4)
# 411.9 TFLOP/s at 4096 and 438.6 at 8192 (53% and 57% of cuBLAS), (256, 3) 358.0 / 394.8,
# (128, 6) 321.1 / 341.6; the best mma.sync tile 309.7 / 299.7.
WGMMA = True
WGMMA_TILES = ((128, 6), (256, 3), (256, 4))
WGMMA_TILE = WGMMA_TILES[2]
_WGMMA = tuple("matmul_bf16_wgmma<{}, {}>".format(*t) for t in WGMMA_TILES)
# Hopper through TMA (matmul_sm90_tma.cu): a persistent, warp-specialized kernel that reads B
# as it is (no transpose), at TMA_STAGE stages of 48 KiB. H100 (2026-12-07, --matmul-sweep):
# 3 stages 578.9 / 731.1 / 769.1 TFLOP/s at 2048 / 4096 / 8192 (85%, 92%, 99% of cuBLAS), 4
# stages 576.1 / 734.6 / 768.2: 3, the same speed in 48 KiB less shared memory. Opt-in
# (TMA = True): its GPU tests so far give each block one tile, and a block that takes several
# tiles in turn (more tiles than SMs) has been timed but not yet checked against numpy.
TMA = False
TMA_STAGES = (3, 4)
TMA_STAGE = 3
_TMA = tuple(f"matmul_bf16_tma<{n}>" for n in TMA_STAGES)


def matmul(s: Any, out: Any, a: Any, b: Any) -> None:
    """``out = a @ b``: a (M, K), b (K, N), row-major, both f32 or both bf16; out f32 (M, N).

    bf16 inputs multiply on the tensor cores with float32 accumulation; where K and N are
    multiples of 8 and a and b are 16-byte aligned, on Hopper through wgmma (b transposed
    first into a temporary (N, K) copy; with ``gemm.TMA = True``, through a persistent kernel
    that loads a and b as they are with TMA instead), and elsewhere through the pipelined
    mma.sync kernel (cp.async, ldmatrix), else through a simpler one that takes any shape.
    Only enqueues.

    Args:
        s: The open `tf.Session` to launch on.
        out: The f32 (M, N) result: a tf.Tensor or anything ``s.tensor_mut`` accepts.
        a: The (M, K) left factor, f32 or bf16: a tf.Tensor or anything ``s.tensor`` accepts.
        b: The (K, N) right factor, of ``a``'s dtype.

    Raises:
        ValidationError: ``s`` is not a Session, an array is refused as a span, the shapes
            or dtypes do not match, a dimension is 2**31 or more, or (but for the TMA kernel)
            M is past the grid's reach.
        RuntimeStateError: The session is closed or used from another thread, NVRTC is
            missing (a session's first call compiles the kernels), or the transposing wgmma
            path would allocate its copy of ``b`` during a capture.
        BackendError: The driver refused the load or the launch.
        KernelFault: A kernel fault has stopped the session.
    """
    op = "kernels.matmul"
    check_session(s, op)
    om, ar, br = s.tensor_mut(out), s.tensor(a), s.tensor(b)
    if ar.ndim != 2 or br.ndim != 2 or ar.shape[1] != br.shape[0]:
        raise ValidationError(f"{op}: a{ar.shape} @ b{br.shape} needs a (M, K) and b (K, N)")
    m, k = ar.shape
    n = br.shape[1]
    if om.shape != (m, n) or om.scalar_type.name != "f32":
        raise ValidationError(f"{op}: out must be f32{(m, n)}, got {om.scalar_type.name}{om.shape}")
    ta, tb = ar.scalar_type.name, br.scalar_type.name
    if ta != tb or ta not in ("f32", "bf16"):
        raise ValidationError(f"{op}: a is {ta}, b is {tb}; both must be f32 or both bf16")
    if max(m, n, k) >= 1 << 31:
        raise ValidationError(f"{op}: dimensions {(m, n, k)} must be below 2**31")
    if m == 0 or n == 0:
        return
    if k == 0:
        from .maps import fill

        fill(s, om, 0.0)
        return
    aligned = (
        k % 8 == 0 and n % 8 == 0 and ar.ptr % 16 == 0 and br.ptr % 16 == 0 and om.ptr % 8 == 0
    )
    wgmma = ta == "bf16" and aligned and WGMMA and s.context.compute_capability == (9, 0)
    if wgmma and TMA:  # a persistent grid, one block an SM at most; B read in place
        from tenferro import tensor_map

        tiles = -(-m // 128) * -(-n // 256)
        sms = s.context.attribute("MULTIPROCESSOR_COUNT")
        s.launch(
            function(s, "matmul_sm90_tma.cu", f"matmul_bf16_tma<{TMA_STAGE}>", _TMA, "a"),
            LaunchConfig(min(tiles, sms), 384, shared_mem_bytes=TMA_STAGE * 48 * 1024 + 1024),
            [
                om,
                tensor_map(ar, box=(128, 64), swizzle=128),
                tensor_map(br, box=(64, 64), swizzle=128),
                u32(m),
                u32(n),
                u32(k),
            ],
        )
        return
    # Pick the kernel and its geometry, then check and launch once.
    if wgmma:
        bn, stages = WGMMA_TILE
        bm, threads, file, exprs = 128, 256, "matmul_sm90.cu", _WGMMA
        name = _WGMMA[WGMMA_TILES.index(WGMMA_TILE)]
        smem = stages * (bm + bn) * 64 * 2 + 1024  # + the 1024-byte alignment of the swizzle
    elif ta == "bf16" and aligned:
        bm, bn, wm, wn, stages, bk = BF16_TILE
        name, threads, file, exprs = (
            _PIPELINED[BF16_TILES.index(BF16_TILE)],
            32 * wm * wn,
            _FILE,
            _EXPRS,
        )
        smem = stages * (bm * (bk + 8) + bk * (bn + 8)) * 2
    else:
        bm = bn = 64 if ta == "f32" else 128
        name, threads, smem, file, exprs = f"matmul_{ta}", 256, 0, _FILE, _EXPRS
    if (m + bm - 1) // bm > 65535:  # the grid's y extent
        raise ValidationError(f"{op}: M={m} is above {65535 * bm}")
    if wgmma:  # the kernel takes B K-major: a temporary (N, K) copy, freed in stream order
        bt = s.alloc_output((n, k), br.scalar_type)  # bf16 has no numpy dtype without ml_dtypes
        transpose(s, bt, br)
        br = s.tensor(bt)
    s.launch(
        function(s, file, name, exprs, arch_suffix="a" if wgmma else ""),
        LaunchConfig(((n + bn - 1) // bn, (m + bm - 1) // bm), threads, shared_mem_bytes=smem),
        [om, ar, br, u32(m), u32(n), u32(k)],
    )
