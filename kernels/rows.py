"""Row softmax, tiled transpose and inclusive scan."""

from __future__ import annotations

from typing import Any

from tenferro import LaunchConfig, ValidationError, u32, u64
from tenferro.session import state_of

from ._build import C_TYPES, check_session, function, plan, session_table, workspace

__all__ = ["cumsum", "softmax", "transpose"]

_FILE = "rows.cu"
_MAX_GRID_X = (1 << 31) - 1
_T_TYPES = ("f32", "f64", "i32", "f16", "bf16")
# transpose is instantiated on each element type, so a launch's span dtypes match its C
# signature (the 2-byte types compile to the same PTX as unsigned short would).
_T_CTYPES = {t: C_TYPES[t] for t in _T_TYPES}
_S_TYPES = ("f32", "f64", "i32")
# Softmax: threads a row for rows of 4096 columns or more, and the kernel for rows that fit on
# chip: "cached" (the row in shared memory), "online" (one fold of running (max, sum) pairs) or
# "split" (SOFTMAX_REG float4 a thread in registers, the rest in shared memory; rows of a
# multiple of 4 floats, 16-byte aligned, else "online"). All are tested; split at 8 registers
# and 512 threads was fastest on the H200 sweep (benchmarks/RESULTS.md, "Ready kernels").
SOFTMAX_WIDE_BLOCK = 512
SOFTMAX_KERNEL = "split"
SOFTMAX_REGS = (4, 8, 16)  # the compiled register counts of "split"
SOFTMAX_REG = 8
_SOFTMAX = {
    k: (f"softmax_rows_{k}<float>", f"softmax_rows_{k}<float4>") for k in ("cached", "online")
}
_SPLIT = {r: f"softmax_rows_split<{r}>" for r in SOFTMAX_REGS}
# The transpose tile edge: 32 or 64 are compiled; 64 was faster on the H200 sweep.
TRANSPOSE_TILES = (32, 64)
TRANSPOSE_TILE = 64
# The scan's compiled configurations and the one used: (threads a block, elements a thread for
# 4-byte types (halved for 8-byte ones), words between tiles' status, ns between polls, blocks
# resident an SM, 1 to load the tile with cp.async). One tile a block, block t scans tile t;
# tile size x blocks an SM is the lever, since an SM's resident tiles keep its loads in flight
# while blocks look back. The sweeps behind the choice, and the variants tried and dropped, are
# in benchmarks/RESULTS.md and benchmarks/scan_study.py.
SCAN_CONFIGS = (
    (512, 32, 16, 20, 2, 0),
    (512, 32, 16, 20, 2, 1),
    (512, 32, 16, 20, 3, 1),
    (256, 16, 16, 20, 4, 0),
    (256, 32, 16, 20, 6, 1),
)
SCAN_CONFIG = (256, 32, 16, 20, 6, 1)
# On sm_90 and later a block first asks L2 for the tile this many bytes a multiprocessor ahead
# of its own (0: none; rows.cu's scan_single_pass): 48 KiB was the best of 32-96 on the H200.
SCAN_AHEAD = 48 << 10
# Where SCAN_CONFIG's shared memory exceeds the device's, this one (17 KiB) is taken instead.
SCAN_SMALL = (256, 16, 16, 20, 4, 0)


def _scan_name(t: str, config: tuple[int, ...]) -> str:
    threads, items, stride, sleep, blocks, cp_async = config
    items = items // 2 if t == "f64" else items
    return (
        f"scan_single_pass<{C_TYPES[t]}, {threads}, {items}, {stride}, {sleep}, {blocks}, "
        f"{'true' if cp_async else 'false'}>"
    )


_TRANSPOSE = {
    (c, e): f"transpose<{c}, {e}>"
    for c in dict.fromkeys(_T_CTYPES.values())
    for e in TRANSPOSE_TILES
}
_EXPRS = (
    *_SOFTMAX["cached"],
    *_SOFTMAX["online"],
    *_SPLIT.values(),
    *_TRANSPOSE.values(),
    *(_scan_name(t, c) for t in _S_TYPES for c in SCAN_CONFIGS),
)


def _two_d(span: Any, op: str, name: str) -> tuple[int, int]:
    if span.ndim != 2:
        raise ValidationError(f"{op}: {name} must be 2-D, got shape={span.shape}")
    rows, cols = span.shape
    if rows >= 1 << 32 or cols >= 1 << 32:
        raise ValidationError(f"{op}: {name} shape={span.shape} exceeds 2**32 a dimension")
    return rows, cols


def softmax(s: Any, out: Any, x: Any) -> None:
    """``out = exp(x - max) / sum(exp(x - max))`` along each row of a 2-D f32 ``x``.

    Only enqueues.

    Args:
        s: The open `tf.Session` to launch on.
        out: The result, of ``x``'s shape and dtype: a tf.Tensor or anything
            ``s.tensor_mut`` accepts.
        x: The (rows, cols) f32 input: a tf.Tensor or anything ``s.tensor`` accepts.

    Raises:
        ValidationError: ``s`` is not a Session, an array is refused as a span, ``x`` is
            not 2-D f32 (or a dimension is 2**32 or more), or ``out`` does not match it.
        RuntimeStateError: The session is closed or used from another thread, or NVRTC is
            missing (a session's first call compiles the kernels).
        BackendError: The driver refused the load or the launch.
        KernelFault: A kernel fault has stopped the session.
    """
    op = "kernels.softmax"
    check_session(s, op)
    om, xr = s.tensor_mut(out), s.tensor(x)
    rows, cols = _two_d(xr, op, "x")
    if om.shape != xr.shape or om.scalar_type is not xr.scalar_type:
        raise ValidationError(
            f"{op}: out is {om.scalar_type.name}{om.shape}, x is "
            f"{xr.scalar_type.name}{xr.shape}; they must match"
        )
    if xr.scalar_type.name != "f32":
        raise ValidationError(f"{op}: x is {xr.scalar_type.name}; softmax takes f32")
    if rows == 0 or cols == 0:
        return
    vec = cols % 4 == 0 and om.ptr % 16 == 0 and xr.ptr % 16 == 0
    fn, config, args = plan(
        s,
        ("softmax", rows, cols, vec, SOFTMAX_KERNEL, SOFTMAX_REG, SOFTMAX_WIDE_BLOCK),
        lambda: _softmax_plan(s, rows, cols, vec),
    )
    s.launch(fn, config, [om, xr, *args])


def _softmax_plan(s: Any, rows: int, cols: int, vec: bool) -> tuple:
    """(Function, config, (u32 rows, u32 cols)) of a softmax over rows x cols (vec: float4)."""
    block = SOFTMAX_WIDE_BLOCK if cols >= 4096 else 256 if cols >= 256 else 32 * ((cols + 31) // 32)
    grid = min(rows, 65535 * 32)
    room = s.context.attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN") - 1024
    args = (u32(rows), u32(cols))
    if vec and SOFTMAX_KERNEL == "split":
        cache = max(0, cols // 4 - SOFTMAX_REG * block) * 16
        if cache <= room:
            return (
                function(s, _FILE, _SPLIT[SOFTMAX_REG], _EXPRS),
                LaunchConfig(grid, block, shared_mem_bytes=cache),
                args,
            )
    if cols * 4 <= room:
        # The row fits in shared memory: one read of x, one write of y.
        kernel = "cached" if SOFTMAX_KERNEL == "cached" else "online"
        return (
            function(s, _FILE, _SOFTMAX[kernel][vec], _EXPRS),
            LaunchConfig(grid, block, shared_mem_bytes=cols * 4),
            args,
        )
    return function(s, _FILE, "softmax_rows_f32", _EXPRS), LaunchConfig(grid, block), args


def transpose(s: Any, out: Any, x: Any) -> None:
    """``out = x.T`` for a 2-D ``x`` (f32, f64, i32, f16 or bf16) through shared-memory tiles.

    Only enqueues.

    Args:
        s: The open `tf.Session` to launch on.
        out: The (cols, rows) result, of ``x``'s dtype: a tf.Tensor or anything
            ``s.tensor_mut`` accepts.
        x: The (rows, cols) input: a tf.Tensor or anything ``s.tensor`` accepts.

    Raises:
        ValidationError: ``s`` is not a Session, an array is refused as a span, ``x`` is
            not 2-D or of another dtype, ``out`` is not its transpose's shape and dtype, a
            dimension is 2**32 or more, or ``x`` has more than 65535 * 64 rows.
        RuntimeStateError: The session is closed or used from another thread, or NVRTC is
            missing (a session's first call compiles the kernels).
        BackendError: The driver refused the load or the launch.
        KernelFault: A kernel fault has stopped the session.
    """
    op = "kernels.transpose"
    check_session(s, op)
    om, xr = s.tensor_mut(out), s.tensor(x)
    rows, cols = _two_d(xr, op, "x")
    if om.shape != (cols, rows) or om.scalar_type is not xr.scalar_type:
        raise ValidationError(
            f"{op}: out must be {xr.scalar_type.name}{(cols, rows)}, got "
            f"{om.scalar_type.name}{om.shape}"
        )
    t = xr.scalar_type.name
    if t not in _T_TYPES:
        raise ValidationError(f"{op}: x is {t}; transpose takes {list(_T_TYPES)}")
    if rows == 0 or cols == 0:
        return
    e = TRANSPOSE_TILE
    if (rows + e - 1) // e > 65535:
        raise ValidationError(f"{op}: x has {rows} rows; at most {65535 * e}")
    fn = function(s, _FILE, _TRANSPOSE[_T_CTYPES[t], e], _EXPRS)
    s.launch(
        fn,
        LaunchConfig(((cols + e - 1) // e, (rows + e - 1) // e), (32, 8)),
        [om, xr, u32(rows), u32(cols)],
    )


def cumsum(s: Any, out: Any, x: Any) -> None:
    """Inclusive prefix sum of a 1-D ``x`` (f32, f64 or i32) into ``out``, any length.

    One pass over x and y (decoupled look-back over tiles of SCAN_CONFIG's threads x items
    elements: 8192, 4096 for f64);
    float sums are added in tile order but not left to right, so they can differ from
    numpy's in the last bits.
    i32 wraps on overflow, as in C. Only enqueues.

    Args:
        s: The open `tf.Session` to launch on.
        out: The result, of ``x``'s shape and dtype: a tf.Tensor or anything
            ``s.tensor_mut`` accepts.
        x: The 1-D input: a tf.Tensor or anything ``s.tensor`` accepts.

    Raises:
        ValidationError: ``s`` is not a Session, an array is refused as a span, ``x`` is
            not 1-D f32, f64 or i32, ``out`` does not match it, or ``x`` has more
            elements than the grid's tiles hold.
        RuntimeStateError: The session is closed or used from another thread, NVRTC is
            missing (a session's first call compiles the kernels), or the session's scan
            workspace must grow during a capture (make a call of that size before it).
        BackendError: The driver refused an allocation, the load or the launch.
        KernelFault: A kernel fault has stopped the session.
    """
    op = "kernels.cumsum"
    check_session(s, op)
    om, xr = s.tensor_mut(out), s.tensor(x)
    if xr.ndim != 1 or om.shape != xr.shape or om.scalar_type is not xr.scalar_type:
        raise ValidationError(
            f"{op}: x must be 1-D and out of its shape and dtype; got x "
            f"{xr.scalar_type.name}{xr.shape}, out "
            f"{om.scalar_type.name}{om.shape}"
        )
    t = xr.scalar_type
    if t.name not in _S_TYPES:
        raise ValidationError(f"{op}: x is {t.name}; cumsum takes {list(_S_TYPES)}")
    _scan(s, om, xr, t, xr.size)


def _scan(s: Any, om: Any, xr: Any, t: Any, n: int) -> None:
    if n == 0:
        return
    fn, config, words, args = plan(
        s, ("cumsum", n, t, SCAN_CONFIG, SCAN_AHEAD), lambda: _scan_plan(s, t, n)
    )
    # The tiles' status words (and, for 8-byte types, their sums after them) are the
    # session's, kept between calls: each launch takes a new epoch instead of clearing them
    # (rows.cu). A captured launch is replayed with the epoch it was captured with, so it
    # clears them first, in the graph, and takes epoch 0, which no other launch takes.
    state = workspace(s, words, "cumsum state")
    if state_of(s).liveness.capturing:
        epoch = 0
        s.memset(state, 0)
    else:
        table = session_table(s)
        epoch = table.get("cumsum epoch", 0) + 1
        if epoch > _MAX_EPOCH:  # flags have 30 bits for it: start again from a cleared state
            s.memset(state, 0)
            epoch = 1
        table["cumsum epoch"] = epoch
    s.launch(fn, config, [om, xr, s.tensor_mut(state), *args, u32(epoch)])


_MAX_EPOCH = (1 << 30) - 1


def _scan_plan(s: Any, t: Any, n: int) -> tuple:
    """(Function, config, state words, (u64 n, u32 tiles ahead)) of a scan of n elements."""
    for config in (SCAN_CONFIG, SCAN_SMALL):
        threads, items, stride = config[:3]
        tile = threads * (items // 2 if t.itemsize == 8 else items)
        smem = (tile + tile // 32) * t.itemsize  # the padded tile of rows.cu
        if smem <= s.context.attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"):
            break
    tiles = (n + tile - 1) // tile
    if tiles > _MAX_GRID_X:
        raise ValidationError(f"kernels.cumsum: x has {n} elements; at most {_MAX_GRID_X * tile}")
    # A status word every `stride` words; 8-byte types keep their values apart, after them.
    words = tiles * stride + (2 * tiles if t.itemsize == 8 else 0)
    fn = function(s, _FILE, _scan_name(t.name, config), _EXPRS)
    ahead = 0
    if s.context.compute_capability >= (9, 0):
        ahead = s.context.attribute("MULTIPROCESSOR_COUNT") * SCAN_AHEAD // (tile * t.itemsize)
    return (
        fn,
        LaunchConfig(tiles, threads, shared_mem_bytes=smem),
        words,
        (u64(n), u32(min(ahead, tiles))),
    )
