"""Tiled matrix multiply: f32 on the CUDA cores, bf16 on the tensor cores (mma.sync, wgmma)."""

from __future__ import annotations

from typing import Any

from tenferro import LaunchConfig, ValidationError, tensor_map, u32

from ._build import check_session, function, plan
from .rows import transpose

__all__ = ["matmul"]

_FILE = "matmul.cu"
# The C type a kernel stores for each output type (kernels/epilogue.cuh); f32 inputs give f32.
_OUT_C = {"f32": "float", "bf16": "__nv_bfloat16"}
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
# Per output type, the instantiations of matmul.cu compiled together (one module each).
_PIPELINED = {
    out: tuple(
        "matmul_bf16_pipelined<{}, {}, {}, {}, {}, {}, {}>".format(c, *tile) for tile in BF16_TILES
    )
    for out, c in _OUT_C.items()
}
_EXPRS = {
    "f32": ("matmul_f32", "matmul_bf16<float>", *_PIPELINED["f32"]),
    "bf16": ("matmul_bf16<__nv_bfloat16>", *_PIPELINED["bf16"]),
}
# Hopper (compute capability 9.0): the warpgroup kernel of matmul_sm90.cu, compiled for sm_90a,
# at (BN, stages); B is first transposed to K-major. WGMMA turns it off (the mma.sync kernel
# then serves, as on every other device). H200 sweep (2026-12-03, --matmul-sweep): (256, 4)
# 411.9 TFLOP/s at 4096 and 438.6 at 8192 (53% and 57% of cuBLAS), (256, 3) 358.0 / 394.8,
# (128, 6) 321.1 / 341.6; the best mma.sync tile 309.7 / 299.7.
WGMMA = True
WGMMA_TILES = ((128, 6), (256, 3), (256, 4))
WGMMA_TILE = WGMMA_TILES[2]
_WGMMA = {
    out: tuple("matmul_bf16_wgmma<{}, {}, {}>".format(c, *tile) for tile in WGMMA_TILES)
    for out, c in _OUT_C.items()
}
# Hopper through TMA (matmul_sm90_tma.cu), where TMA is on (the default): a persistent,
# warp-specialized kernel that reads A and B as they are and stores C through TMA, at (stages
# of 48 KiB, blocks a cluster along M sharing B's loads). H100 (2026-12-07, --matmul-sweep),
# TFLOP/s at 2048 / 4096 / 8192 into bf16, then into f32 (cuBLAS writes bf16): (3, 1) 679.8 /
# 781.6 / 783.7 (98%, 99%, 100% of cuBLAS), 616.3 / 749.3 / 767.0 (89%, 95%, 98%); (4, 1)
# within 1% of it; (3, 2) 637.6 / 753.7 / 774.8 and 571.3 / 724.2 / 766.4; (4, 2) 642.1 /
# 769.1 / 786.1 and 578.5 / 745.8 / 777.4. Clusters lose up to 7.3% at 2048 and gain at most 1.4%
# at 8192; (3, 1) and (4, 1) are within 0.3% of each other below that: (3, 1), the least
# shared memory.
TMA = True
TMA_CONFIGS = ((3, 1), (4, 1), (3, 2), (4, 2))
TMA_CONFIG = TMA_CONFIGS[0]
_TMA = {
    out: tuple("matmul_bf16_tma<{}, {}, {}>".format(c, *config) for config in TMA_CONFIGS)
    for out, c in _OUT_C.items()
}


def matmul(s: Any, out: Any, a: Any, b: Any) -> None:
    """``out = a @ b``: a (M, K), b (K, N), row-major, both f32 or both bf16; out (M, N).

    ``out`` is f32, or for bf16 ``a`` and ``b`` f32 or bf16 (the f32 sums rounded to nearest).
    bf16 inputs multiply on the tensor cores with float32 accumulation. Where K and N are
    multiples of 8 and a, b and out are 16-byte aligned, on Hopper through a persistent kernel
    that loads a and b as they are with TMA and stores out with it; with ``gemm.TMA = False``,
    or out aligned to two of its elements only, through wgmma after a transposed copy of b.
    Other devices, and Hopper with ``gemm.WGMMA = False``, take the pipelined mma.sync kernel
    (cp.async, ldmatrix) where K and N are multiples of 8, a and b are 16-byte aligned and out
    is aligned to two of its elements; other shapes and addresses a simpler one that takes
    any. Only enqueues.

    Args:
        s: The open `tf.Session` to launch on.
        out: The (M, N) result: a tf.Tensor or anything ``s.tensor_mut`` accepts.
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
    # The kernel a call takes depends on the shapes, the types, the module's switches and two
    # facts of the addresses alone: worked out once a session (checks included), a call then
    # makes its spans and maps. TMA reads and writes all three on 16 bytes; the wgmma and
    # mma.sync kernels read a and b on 16 bytes and write out in pairs of elements.
    factors16 = not (ar.ptr | br.ptr) & 15
    tma_aligned = factors16 and not om.ptr & 15
    aligned = factors16 and not om.ptr % (2 * om.scalar_type.itemsize or 1)  # 0: a record of none
    key = (
        op,
        om.shape,
        ar.shape,
        br.shape,
        om.scalar_type,
        ar.scalar_type,
        br.scalar_type,
        tma_aligned,
        aligned,
        TMA,
        TMA_CONFIG,
        WGMMA,
        WGMMA_TILE,
        BF16_TILE,
    )
    kind, fn, config, tail = plan(s, key, lambda: _plan(s, op, om, ar, br, tma_aligned, aligned))
    if kind is _MAPS:  # B read in place: it can be captured
        out_box, scalars = tail
        s.launch(
            fn,
            config,
            [
                tensor_map(om, box=out_box, swizzle=128),
                tensor_map(ar, box=(128, 64), swizzle=128),
                tensor_map(br, box=(64, 64), swizzle=128),
                *scalars,
            ],
        )
    elif kind is _POINTERS:
        s.launch(fn, config, [om, ar, br, *tail])
    elif kind is _B_COPIED:  # the kernel takes B K-major: an (N, K) copy, freed in stream order
        bt = s.alloc_output(br.shape[::-1], br.scalar_type)  # bf16 has no numpy dtype here
        transpose(s, bt, br)
        s.launch(fn, config, [om, ar, s.tensor(bt), *tail])
    elif kind is _ZEROS:  # an empty sum: zero bytes are 0.0 in f32 and in bf16
        s.memset(om, 0)


# What a plan launches: the TMA kernel with three maps, a kernel with the three spans, the
# wgmma kernel after a transposed copy of B, a memset (K = 0), or nothing (M or N = 0).
_MAPS, _POINTERS, _B_COPIED, _ZEROS, _NOTHING = "maps", "pointers", "b copied", "zeros", "nothing"


def _plan(
    s: Any, op: str, om: Any, ar: Any, br: Any, tma_aligned: bool, aligned: bool
) -> tuple[str, Any, LaunchConfig | None, tuple]:
    """(what to launch, its Function, its config, the arguments after the arrays or maps).

    Refuses wrong shapes and types, and (but for the TMA kernel) M past the grid's reach.
    """
    m, n, k, ta, to = _checked(op, om, ar, br)
    if m == 0 or n == 0:
        return _NOTHING, None, None, ()
    if k == 0:
        return _ZEROS, None, None, ()
    scalars = (u32(m), u32(n), u32(k))
    tiled = ta == "bf16" and k % 8 == 0 and n % 8 == 0  # K and N the tiled kernels take
    hopper = tiled and WGMMA and s.context.compute_capability == (9, 0)
    if hopper and TMA and tma_aligned:
        fn, config = _tma_plan(s, m, n, to)
        return _MAPS, fn, config, ((64, 128 // om.scalar_type.itemsize), scalars)
    wgmma = hopper and aligned
    if wgmma:
        bn, stages = WGMMA_TILE
        bm, threads, file, exprs = 128, 256, "matmul_sm90.cu", _WGMMA[to]
        name = exprs[WGMMA_TILES.index(WGMMA_TILE)]
        smem = stages * (bm + bn) * 64 * 2 + 1024  # + the 1024-byte alignment of the swizzle
    elif tiled and aligned:
        bm, bn, wm, wn, stages, bk = BF16_TILE
        name, threads, file, exprs = (
            _PIPELINED[to][BF16_TILES.index(BF16_TILE)],
            32 * wm * wn,
            _FILE,
            _EXPRS[to],
        )
        smem = stages * (bm * (bk + 8) + bk * (bn + 8)) * 2
    else:
        bm = bn = 64 if ta == "f32" else 128
        name = "matmul_f32" if ta == "f32" else f"matmul_bf16<{_OUT_C[to]}>"
        threads, smem, file, exprs = 256, 0, _FILE, _EXPRS[to]
    if (m + bm - 1) // bm > 65535:  # the grid's y extent
        raise ValidationError(f"{op}: M={m} is above {65535 * bm}")
    fn = function(s, file, name, exprs, arch_suffix="a" if wgmma else "")
    config = LaunchConfig(((n + bn - 1) // bn, (m + bm - 1) // bm), threads, shared_mem_bytes=smem)
    return (_B_COPIED if wgmma else _POINTERS), fn, config, scalars


def _checked(op: str, om: Any, ar: Any, br: Any) -> tuple[int, int, int, str, str]:
    """(M, N, K, the factors' type, out's type), or the refusal of shapes and types."""
    if ar.ndim != 2 or br.ndim != 2 or ar.shape[1] != br.shape[0]:
        raise ValidationError(f"{op}: a{ar.shape} @ b{br.shape} needs a (M, K) and b (K, N)")
    m, k = ar.shape
    n = br.shape[1]
    ta, tb, to = ar.scalar_type.name, br.scalar_type.name, om.scalar_type.name
    if ta != tb or ta not in ("f32", "bf16"):
        raise ValidationError(f"{op}: a is {ta}, b is {tb}; both must be f32 or both bf16")
    outs = ("f32", "bf16") if ta == "bf16" else ("f32",)
    if om.shape != (m, n) or to not in outs:
        want = " or ".join(f"{t}{(m, n)}" for t in outs)
        raise ValidationError(f"{op}: out must be {want} for {ta} a and b, got {to}{om.shape}")
    if max(m, n, k) >= 1 << 31:
        raise ValidationError(f"{op}: dimensions {(m, n, k)} must be below 2**31")
    return m, n, k, ta, to


def _tma_plan(s: Any, m: int, n: int, to: str) -> tuple[Any, LaunchConfig]:
    """The TMA kernel at TMA_CONFIG and its persistent grid: as many clusters as run at once."""
    stages, cm = TMA_CONFIG
    name = _TMA[to][TMA_CONFIGS.index(TMA_CONFIG)]
    # Only the instantiation used is compiled (each takes seconds of NVRTC).
    fn = function(s, "matmul_sm90_tma.cu", name, (name,), "a")
    # The ring, the epilogue's two staging boxes a consumer, the 1024-byte alignment of the swizzle.
    smem = stages * 48 * 1024 + 2 * 16 * 1024 + 1024
    tiles = -(-m // (128 * cm)) * -(-n // 256)  # of cm x 128 rows by 256 columns
    if cm == 1:
        resident = s.context.attribute("MULTIPROCESSOR_COUNT")
    else:
        resident = fn.max_active_clusters(LaunchConfig(cm, 384, smem, cluster=cm))
    grid = cm * min(tiles, max(resident, 1))  # none resident: the launch says why
    return fn, LaunchConfig(grid, 384, shared_mem_bytes=smem, cluster=cm if cm > 1 else None)
