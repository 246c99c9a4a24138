"""Row softmax, tiled transpose and inclusive scan."""

from __future__ import annotations

from typing import Any

from tenferro import LaunchConfig, ValidationError, u32, u64

from ._build import C_TYPES, function

__all__ = ["cumsum", "softmax", "transpose"]

_FILE = "rows.cu"
_T_TYPES = ("f32", "f64", "i32")
_S_TYPES = ("f32", "f64", "i32")
_EXPRS = tuple(f"transpose<{C_TYPES[t]}>" for t in _T_TYPES) + tuple(
    f"scan_{k}<{C_TYPES[t]}>" for k in ("chunks", "add") for t in _S_TYPES)
_CHUNK = 1024


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
    om, xr = s.tensor_mut(out), s.tensor(x)
    rows, cols = _two_d(xr, op, "x")
    if om.shape != xr.shape or om.scalar_type is not xr.scalar_type:
        raise ValidationError(f"{op}: out is {om.scalar_type.name}{om.shape}, x is "
                              f"{xr.scalar_type.name}{xr.shape}; they must match")
    if xr.scalar_type.name != "f32":
        raise ValidationError(f"{op}: x is {xr.scalar_type.name}; softmax takes f32")
    if rows == 0 or cols == 0:
        return
    fn = function(s, _FILE, "softmax_rows_f32", _EXPRS)
    block = 1024 if cols >= 4096 else 256 if cols >= 256 else 32 * ((cols + 31) // 32)
    s.launch(fn, LaunchConfig(min(rows, 65535 * 32), block), [om, xr, u32(rows), u32(cols)])


def transpose(s: Any, out: Any, x: Any) -> None:
    """``out = x.T`` for a 2-D ``x`` (f32, f64 or i32) through shared-memory tiles."""
    op = "kernels.transpose"
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
    if (rows + 31) // 32 > 65535:
        raise ValidationError(f"{op}: x has {rows} rows; at most {65535 * 32}")
    fn = function(s, _FILE, f"transpose<{C_TYPES[t]}>", _EXPRS)
    s.launch(fn, LaunchConfig(((cols + 31) // 32, (rows + 31) // 32), (32, 8)),
             [om, xr, u32(rows), u32(cols)])


def cumsum(s: Any, out: Any, x: Any) -> None:
    """Inclusive prefix sum of a 1-D ``x`` (f32, f64 or i32) into ``out``, any length.

    Chunks of 1024 are scanned in shared memory; their totals are scanned the same way (one
    level per factor of 1024) and added back. i32 wraps on overflow, as in C.
    """
    op = "kernels.cumsum"
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
    chunks = (n + _CHUNK - 1) // _CHUNK
    sums = s.alloc_output((chunks,), t.numpy)
    scan = function(s, _FILE, f"scan_chunks<{C_TYPES[t.name]}>", _EXPRS)
    s.launch(scan, LaunchConfig(chunks, _CHUNK), [om, xr, s.tensor_mut(sums), u64(n)])
    if chunks > 1:
        offsets = s.alloc_output((chunks,), t.numpy)
        _scan(s, s.tensor_mut(offsets), s.tensor(sums), t, chunks)
        add = function(s, _FILE, f"scan_add<{C_TYPES[t.name]}>", _EXPRS)
        s.launch(add, LaunchConfig(chunks - 1, _CHUNK), [om, s.tensor(offsets), u64(n)])
