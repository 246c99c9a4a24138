"""sum and max of a whole array in one launch (the last block to finish folds the blocks').

No memset before it: the blocks' partials and their counter live in the session's workspace,
which the kernel leaves as it found it.
"""

from __future__ import annotations

from typing import Any

from tenferro import ValidationError, u64

from ._build import C_TYPES, check_session, function, grid_stride, plan, workspace

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
    out = s.alloc_output((), t.numpy)
    fn, config, n, words = plan(s, (kind, xr.size, t), lambda: _plan(s, kind, t, xr.size))
    s.launch(fn, config, [s.tensor_mut(out), xr, n, s.tensor_mut(workspace(s, words))])
    return out


def _plan(s: Any, kind: str, t: Any, size: int) -> tuple:
    """(Function, config, u64 size, workspace words) of a reduction of ``size`` elements."""
    config = grid_stride(s, size, per_thread=4)  # one block at least: it writes out
    fn = function(s, _FILE, _NAMES[kind, t.name], _EXPRS)
    return fn, config, u64(size), 1 + config.grid[0]  # the counter, then a partial a block


def sum(s: Any, x: Any) -> Any:
    """The sum of every element of ``x`` (f32 or f64) as a new 0-d Tensor; 0 for empty x.

    The blocks' sums are added in block order, so a sum of the same x on the same device is
    the same to the last bit every run; it can differ from numpy's in the last bits.
    Only enqueues: read the result with ``s.download`` or ``.to_host()``.

    Args:
        s: The open `tf.Session` to launch on.
        x: The f32 or f64 array, any shape: a tf.Tensor or anything ``s.tensor`` accepts.

    Returns:
        A new 0-d `Tensor` of ``x``'s dtype.

    Raises:
        ValidationError: ``s`` is not a Session, ``x`` is refused as a span, or its dtype
            is not f32 or f64.
        RuntimeStateError: The session is closed, used from another thread, or capturing
            (the result is a new allocation); or NVRTC is missing (a session's first call
            compiles the kernels).
        BackendError: The driver refused an allocation, the load or the launch.
        KernelFault: A kernel fault has stopped the session.
    """
    return _reduce(s, "sum", x, "kernels.sum")


def max(s: Any, x: Any) -> Any:
    """The largest element of ``x`` (f32 or f64) as a new 0-d Tensor; empty x is refused.

    NaN elements are skipped (``fmax``), unlike numpy's ``max``. Only enqueues: read the
    result with ``s.download`` or ``.to_host()``.

    Args:
        s: The open `tf.Session` to launch on.
        x: The f32 or f64 array, any shape, not empty: a tf.Tensor or anything ``s.tensor``
            accepts.

    Returns:
        A new 0-d `Tensor` of ``x``'s dtype.

    Raises:
        ValidationError: ``s`` is not a Session, ``x`` is refused as a span, its dtype is
            not f32 or f64, or it is empty.
        RuntimeStateError: The session is closed, used from another thread, or capturing
            (the result is a new allocation); or NVRTC is missing (a session's first call
            compiles the kernels).
        BackendError: The driver refused an allocation, the load or the launch.
        KernelFault: A kernel fault has stopped the session.
    """
    return _reduce(s, "max", x, "kernels.max")
