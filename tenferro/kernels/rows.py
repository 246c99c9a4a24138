"""Row softmax, tiled transpose and inclusive scan."""

from __future__ import annotations

from typing import Any

import numpy as np

from tenferro import LaunchConfig, ValidationError, u32, u64

from ._build import C_TYPES, check_session, function

__all__ = ["cumsum", "softmax", "transpose"]

_FILE = "rows.cu"
_MAX_GRID_X = (1 << 31) - 1
_T_TYPES = ("f32", "f64", "i32", "f16", "bf16")
# transpose moves bits: 2-byte types share one instantiation.
_T_CTYPES = {"f32": "float", "f64": "double", "i32": "int", "f16": "unsigned short",
             "bf16": "unsigned short"}
_S_TYPES = ("f32", "f64", "i32")
# Threads a row for rows of 4096 columns or more, and the kernel for rows that fit on chip:
# "cached" (the row in shared memory; a max fold, then an exp and sum fold), "online" (the same
# cache, one fold of running (max, sum) pairs) or "split" (SOFTMAX_REG float4 a thread in
# registers, the rest in shared memory; rows of a multiple of 4 floats, 16-byte aligned; other
# rows take "online"). All are tested. On the H200 (benchmarks/kernels.py --sweep, 4096 x
# 16384 f32, 2026-12-03) split at 8 registers and 512 threads gave 4.04-4.07 TB/s (16 at 256:
# 4.04; 4 at 512: 3.66) against 3.39 online and 3.32 cached: the register file and shared
# memory together hold more rows an SM than shared memory alone.
SOFTMAX_WIDE_BLOCK = 512
SOFTMAX_KERNEL = "split"
SOFTMAX_REGS = (4, 8, 16)  # the compiled register counts of "split"
SOFTMAX_REG = 8
_SOFTMAX = {k: (f"softmax_rows_{k}<float>", f"softmax_rows_{k}<float4>")
            for k in ("cached", "online")}
_SPLIT = {r: f"softmax_rows_split<{r}>" for r in SOFTMAX_REGS}
# The transpose tile edge (32 or 64, both compiled; 64 moved 3.69 TB/s on the H200 sweep
# against 3.51 at 32).
TRANSPOSE_TILES = (32, 64)
TRANSPOSE_TILE = 64
# The scan's configurations that are compiled, and the one used: (threads a block, elements a
# thread for 4-byte types (halved for 8-byte ones), words between tiles' status, ns between
# polls, blocks resident an SM, 1 to load the tile with cp.async). One tile a block; an SM's
# resident tiles are what keeps its loads in flight while blocks look back, so tile size x
# blocks an SM is the lever (shared memory holds them: 512 x 32 floats take 66 KiB).
# H200 sweeps (2026-12-03, 256 MiB f32; torch 2.48-2.56 TB/s in the same runs), tiles taken by
# an atomic ticket: 512 x 32 at 2 an SM moved 2.83-2.85 TB/s, 3.14-3.17 with cp.async, and
# 3.35-3.38 at 3 an SM with cp.async (2.42-2.44 without: 40 registers and the loads spill); at
# about the same shared memory an SM, 512 x 24 at 4 an SM 3.31-3.34, 256 x 28 at 7 3.36, 512 x
# 35 at 3 3.34, so the rate levels off there; 256 x 32 at 3 gave 3.19-3.23, 1024 x 16 at 2
# 2.94-2.97. Status words a cache line apart (16) beat packed ones (2.85 against 2.57); 32
# apart, or 200 ns between polls instead of 20, changed nothing. Tile t by block t instead of
# the ticket (fourth session): 512 x 32 at 3 an SM 3.47, at 2 an SM 3.31, 256 x 16 at 4 2.80;
# 512 x 24 at 4 an SM fell to 2.22 and 256 x 28 at 7 to 1.54 (both at 32 registers), so they
# are no longer compiled. Slower each time, and not kept: reading 2, 4 or 8 tiles a lane a
# look-back step; persistent blocks taking a ticket a tile (1.48-2.19 TB/s); persistent blocks
# loading their next tiles while looking back (0.03-0.10 TB/s: a tile taken early is published
# late, and the tiles after it wait in a convoy). Timed on the kernel alone (state zeroed
# beforehand), where this kernel moved 3.51-3.52 TB/s and the same tiles only copied through
# shared memory 3.79-3.96: persistent blocks taking tiles b, b + grid, ... with the next one
# loading (256 x 32 at 3, 512 x 16 at 3: 3.00-3.05); a dedicated look-back warp that looks
# back while the tile loads (3.36-3.50, no gain); 16-byte cp.async into a swizzled tile
# (3.27-3.39, slower than 4-byte copies into the padded one); a self-clearing state in place
# of the memset (the last block clears it: 3.27-3.37; the atomic at each tile's end costs
# more than the memset's 2 us). Fifth session, with the L2 prefetch (SCAN_AHEAD): 256 x 32 at
# 6 an SM 3.73 TB/s, 512 x 32 at 3 3.63 (benchmarks/RESULTS.md); bulk (TMA) copies of the tile
# were slower (benchmarks/scan_study.py) and are not kept.
SCAN_CONFIGS = ((512, 32, 16, 20, 2, 0), (512, 32, 16, 20, 2, 1), (512, 32, 16, 20, 3, 1),
                (256, 16, 16, 20, 4, 0), (256, 32, 16, 20, 6, 1))
SCAN_CONFIG = (256, 32, 16, 20, 6, 1)
# On sm_90 and later a block first asks L2 for the tile this many bytes a multiprocessor ahead
# of its own (0: none; rows.cu's scan_single_pass). Fifth session, kernel alone on the H200
# (benchmarks/scan_study.py, 256 MiB f32): 512 x 32 at 3 an SM went from 154 to 146-147 us
# with 48 KiB an SM ahead (99 tiles), 148 us at 32 or 64 KiB, 153 at 96 KiB; 256 x 32 at 6
# an SM to 142.8 us at 48 KiB (198 tiles), 143 at 64, 145.5 at 80.
SCAN_AHEAD = 48 << 10
# Where SCAN_CONFIG's shared memory exceeds the device's, this one (17 KiB) is taken instead.
SCAN_SMALL = (256, 16, 16, 20, 4, 0)


def _scan_name(t: str, config: tuple[int, ...]) -> str:
    threads, items, stride, sleep, blocks, cp_async = config
    items = items // 2 if t == "f64" else items
    return (f"scan_single_pass<{C_TYPES[t]}, {threads}, {items}, {stride}, {sleep}, {blocks}, "
            f"{'true' if cp_async else 'false'}>")


_EXPRS = (*_SOFTMAX["cached"], *_SOFTMAX["online"], *_SPLIT.values(),
          *(f"transpose<{c}, {e}>" for c in dict.fromkeys(_T_CTYPES.values())
            for e in TRANSPOSE_TILES),
          *(_scan_name(t, c) for t in _S_TYPES for c in SCAN_CONFIGS))


def _two_d(span: Any, op: str, name: str) -> tuple[int, int]:
    if span.ndim != 2:
        raise ValidationError(f"{op}: {name} must be 2-D, got shape={span.shape}")
    rows, cols = span.shape
    if rows >= 1 << 32 or cols >= 1 << 32:
        raise ValidationError(f"{op}: {name} shape={span.shape} exceeds 2**32 a dimension")
    return rows, cols


def softmax(s: Any, out: Any, x: Any) -> None:
    """``out = exp(x - max) / sum(exp(x - max))`` along each row of a 2-D f32 ``x``."""
    op = "kernels.softmax"
    check_session(s, op)
    om, xr = s.tensor_mut(out), s.tensor(x)
    rows, cols = _two_d(xr, op, "x")
    if om.shape != xr.shape or om.scalar_type is not xr.scalar_type:
        raise ValidationError(f"{op}: out is {om.scalar_type.name}{om.shape}, x is "
                              f"{xr.scalar_type.name}{xr.shape}; they must match")
    if xr.scalar_type.name != "f32":
        raise ValidationError(f"{op}: x is {xr.scalar_type.name}; softmax takes f32")
    if rows == 0 or cols == 0:
        return
    block = SOFTMAX_WIDE_BLOCK if cols >= 4096 else 256 if cols >= 256 else \
        32 * ((cols + 31) // 32)
    grid = min(rows, 65535 * 32)
    room = s.context.attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN") - 1024
    vec = cols % 4 == 0 and om.ptr % 16 == 0 and xr.ptr % 16 == 0
    if vec and SOFTMAX_KERNEL == "split":
        cache = max(0, cols // 4 - SOFTMAX_REG * block) * 16
        if cache <= room:
            s.launch(function(s, _FILE, _SPLIT[SOFTMAX_REG], _EXPRS),
                     LaunchConfig(grid, block, shared_mem_bytes=cache),
                     [om, xr, u32(rows), u32(cols)])
            return
    if cols * 4 <= room:
        # The row fits in shared memory: one read of x, one write of y.
        kernel = "cached" if SOFTMAX_KERNEL == "cached" else "online"
        fn = function(s, _FILE, _SOFTMAX[kernel][vec], _EXPRS)
        config = LaunchConfig(grid, block, shared_mem_bytes=cols * 4)
    else:
        fn = function(s, _FILE, "softmax_rows_f32", _EXPRS)
        config = LaunchConfig(grid, block)
    s.launch(fn, config, [om, xr, u32(rows), u32(cols)])


def transpose(s: Any, out: Any, x: Any) -> None:
    """``out = x.T`` for a 2-D ``x`` (f32, f64, i32, f16 or bf16) through shared-memory tiles."""
    op = "kernels.transpose"
    check_session(s, op)
    om, xr = s.tensor_mut(out), s.tensor(x)
    rows, cols = _two_d(xr, op, "x")
    if om.shape != (cols, rows) or om.scalar_type is not xr.scalar_type:
        raise ValidationError(f"{op}: out must be {xr.scalar_type.name}{(cols, rows)}, got "
                              f"{om.scalar_type.name}{om.shape}")
    t = xr.scalar_type.name
    if t not in _T_TYPES:
        raise ValidationError(f"{op}: x is {t}; transpose takes {list(_T_TYPES)}")
    if rows == 0 or cols == 0:
        return
    e = TRANSPOSE_TILE
    if (rows + e - 1) // e > 65535:
        raise ValidationError(f"{op}: x has {rows} rows; at most {65535 * e}")
    fn = function(s, _FILE, f"transpose<{_T_CTYPES[t]}, {e}>", _EXPRS)
    s.launch(fn, LaunchConfig(((cols + e - 1) // e, (rows + e - 1) // e), (32, 8)),
             [om, xr, u32(rows), u32(cols)])


def cumsum(s: Any, out: Any, x: Any) -> None:
    """Inclusive prefix sum of a 1-D ``x`` (f32, f64 or i32) into ``out``, any length.

    One pass over x and y (decoupled look-back over tiles of SCAN_CONFIG's threads x items
    elements: 8192, 4096 for f64);
    float sums are added in tile order but not left to right, so they can differ from
    numpy's in the last bits.
    i32 wraps on overflow, as in C.
    """
    op = "kernels.cumsum"
    check_session(s, op)
    om, xr = s.tensor_mut(out), s.tensor(x)
    if xr.ndim != 1 or om.shape != xr.shape or om.scalar_type is not xr.scalar_type:
        raise ValidationError(f"{op}: x must be 1-D and out of its shape and dtype; got x "
                              f"{xr.scalar_type.name}{xr.shape}, out "
                              f"{om.scalar_type.name}{om.shape}")
    t = xr.scalar_type
    if t.name not in _S_TYPES:
        raise ValidationError(f"{op}: x is {t.name}; cumsum takes {list(_S_TYPES)}")
    _scan(s, om, xr, t, xr.size)


def _scan(s: Any, om: Any, xr: Any, t: Any, n: int) -> None:
    if n == 0:
        return
    for config in (SCAN_CONFIG, SCAN_SMALL):
        threads, items, stride = config[:3]
        tile = threads * (items // 2 if t.itemsize == 8 else items)
        smem = (tile + tile // 32) * t.itemsize  # the padded tile of rows.cu
        if smem <= s.context.attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"):
            break
    tiles = (n + tile - 1) // tile
    if tiles > _MAX_GRID_X:
        raise ValidationError(f"kernels.cumsum: x has {n} elements; at most "
                              f"{_MAX_GRID_X * tile}")
    # A status word every `stride` words; 8-byte types keep their values apart.
    state = s.alloc_zeros((tiles * stride,), np.uint64)
    sums = s.alloc_output((2 * tiles if t.itemsize == 8 else 1,), t.numpy)
    fn = function(s, _FILE, _scan_name(t.name, config), _EXPRS)
    ahead = 0
    if s.context.compute_capability >= (9, 0):
        ahead = s.context.attribute("MULTIPROCESSOR_COUNT") * SCAN_AHEAD // (tile * t.itemsize)
    s.launch(fn, LaunchConfig(tiles, threads, shared_mem_bytes=smem),
             [om, xr, s.tensor_mut(state), s.tensor_mut(sums), u64(n), u32(min(ahead, tiles))])
