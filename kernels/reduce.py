"""sum and max of a whole array in one pass (warp shuffles, one atomic a block)."""

from __future__ import annotations

from typing import Any

from tenferro import ValidationError, u64

from ._build import C_TYPES, check_session, function, grid_stride

__all__ = ["max", "sum"]

_FILE = "reduce.cu"
_TYPES = ("f32", "f64")
_NAMES = {(k, t): f"reduce_{k}<{C_TYPES[t]}>" for k in ("sum", "max") for t in _TYPES}
_EXPRS = tuple(_NAMES.values())


def _reduce(s: Any, kind: str, x: Any, op: str) -> Any:
    check_session(s, op)
    xr = s.tensor(x)
    t = xr.scalar_type
    if t.name not in _TYPES:
        raise ValidationError(f"{op}: x is {t.name}; {kind} takes {list(_TYPES)}")
    if kind == "max" and xr.size == 0:
        raise ValidationError(f"{op}: x is empty; max has no identity to return")
    # The blocks fold into out from its first value: 0 for sum; for max every bit set, a
    # NaN, which the kernel's max takes as below every value (its fmax and compare-and-swap).
    if kind == "sum":
        out = s.alloc_zeros((), t.numpy)
    else:
        out = s.alloc_output((), t.numpy)
        s.memset(out, 0xFF)
    if xr.size:
        fn = function(s, _FILE, _NAMES[kind, t.name], _EXPRS)
        s.launch(fn, grid_stride(s, xr.size, per_thread=4), [s.tensor_mut(out), xr, u64(xr.size)])
    return out


def sum(s: Any, x: Any) -> Any:
    """The sum of every element of ``x`` (f32 or f64) as a new 0-d Tensor; 0 for empty x.

    Blocks add into the result with atomics, so the rounding of f32 sums may differ in the
    last bits from run to run.
    """
    return _reduce(s, "sum", x, "kernels.sum")


def max(s: Any, x: Any) -> Any:
    """The largest element of ``x`` (f32 or f64) as a new 0-d Tensor; empty x is refused.

    NaN elements are skipped (``fmax``), unlike numpy's ``max``.
    """
    return _reduce(s, "max", x, "kernels.max")
