"""Checked spans over device memory: `TensorRef`, `TensorMut` (exclusive), `DeviceBytes`.

A span is made by its session (``s.tensor``, ``s.tensor_mut``, ``s.alloc_bytes``) after every
check of the design; it records the pointer, size, dtype, shape, strides (in bytes, as numpy and
the CUDA Array Interface give them), device, the owner that keeps the memory alive, and whether
the producer marked the memory read-only (a launch then refuses it for a non-const pointer). It is
usable only in the session that made it, and only while that session is open.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .dtypes import ScalarType

__all__ = [
    "ADDRESS_END",
    "DeviceBytes",
    "Layout",
    "Shaped",
    "Span",
    "TensorMut",
    "TensorRef",
    "compact_layout",
    "layouts",
]

ADDRESS_END = 1 << 64  # one past the last byte a 64-bit pointer can name


class Shaped:
    """dtype, ndim and size, from ``scalar_type``, ``shape`` and ``nbytes`` (spans, Tensors)."""

    __slots__ = ()
    scalar_type: ScalarType
    shape: tuple[int, ...]
    nbytes: int

    @property
    def dtype(self) -> np.dtype | str:
        """The numpy dtype (or the type's name where numpy has none, such as ``"bf16"``)."""
        t = self.scalar_type
        return t.numpy if t.numpy is not None else t.name

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return self.nbytes // self.scalar_type.itemsize


class Span(Shaped):
    """Common part of every span; not made directly."""

    __slots__ = (
        "__weakref__",
        "_contiguous",
        "device",
        "hi",
        "lo",
        "nbytes",
        "owner",
        "producer_readonly",
        "ptr",
        "scalar_type",
        "shape",
        "state",
        "strides",
    )
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    scalar_type: ScalarType
    nbytes: int
    device: int
    owner: Any
    state: Any
    producer_readonly: bool
    lo: int
    hi: int
    _contiguous: bool

    @property
    def session(self) -> Any:
        """The `tenferro.Session` this span belongs to."""
        return self.state.session

    writable = False

    def __init__(
        self,
        ptr: int,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        scalar_type: ScalarType,
        device: int,
        owner: Any,
        state: Any,
        producer_readonly: bool = False,
    ) -> None:
        self.ptr = ptr
        self.producer_readonly = producer_readonly
        self.shape = shape
        self.strides = strides
        self.scalar_type = scalar_type
        self.device = device
        self.owner = owner
        self.state = state
        n = 1
        for d in shape:
            n *= d
        self.nbytes = n * scalar_type.itemsize
        self._contiguous = _c_contiguous(shape, strides, scalar_type.itemsize)
        # The byte extent [lo, hi) the span can touch, for the overlap checks of a launch.
        if n == 0:
            self.lo = self.hi = ptr
        else:
            lo = hi = ptr
            for d, st in zip(shape, strides, strict=True):
                if st < 0:
                    lo += (d - 1) * st
                else:
                    hi += (d - 1) * st
            self.lo, self.hi = lo, hi + scalar_type.itemsize

    @classmethod
    def compact(
        cls,
        ptr: int,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        scalar_type: ScalarType,
        nbytes: int,
        device: int,
        owner: Any,
        state: Any,
    ) -> Span:
        """A span over ``nbytes`` of C-contiguous memory (a Tensor's): no extent to compute."""
        self = object.__new__(cls)  # made here: its own state
        self.ptr = ptr
        self.producer_readonly = False
        self.shape = shape
        self.strides = strides
        self.scalar_type = scalar_type
        self.device = device
        self.owner = owner
        self.state = state
        self.nbytes = nbytes
        self._contiguous = True
        self.lo = ptr
        self.hi = ptr + nbytes
        return self

    @property
    def is_c_contiguous(self) -> bool:
        """True when the elements are packed in row-major order with no gaps."""
        return self._contiguous

    @property
    def is_f_contiguous(self) -> bool:
        """True when the elements are packed in column-major order with no gaps."""
        return _compact(zip(self.shape, self.strides, strict=True), self.scalar_type.itemsize)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(ptr=0x{self.ptr:x}, shape={self.shape}, "
            f"dtype={self.scalar_type.name}, device={self.device})"
        )


class TensorRef(Span):
    """A read-only view: a kernel may read it; it may overlap other `TensorRef`s in a launch."""

    __slots__ = ()


class TensorMut(Span):
    """An exclusive view: no other span of the same launch may overlap it."""

    __slots__ = ()
    writable = True


class DeviceBytes(Span):
    """An untyped, exclusive workspace of ``nbytes`` bytes (``s.alloc_bytes``)."""

    __slots__ = ()
    writable = True


def _c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    return _compact(zip(reversed(shape), reversed(strides), strict=True), itemsize)


def _compact(dims: Iterable[tuple[int, int]], itemsize: int) -> bool:
    """True when (extent, byte stride) pairs, the fastest-varying first, leave no gaps."""
    expected = itemsize
    for d, st in dims:
        if d == 0:
            return True
        if d != 1 and st != expected:
            return False
        expected *= d
    return True


def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """Row-major strides in bytes for ``shape``."""
    out = []
    acc = itemsize
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


Layout = tuple[tuple[int, ...], tuple[int, ...], int]
# The compact layouts made so far, per (shape, itemsize): shapes repeat call to call. Read it
# inline (``layouts.get(key) or compact_layout(...)``) where a call costs too much.
layouts: dict[tuple[tuple[int, ...], int], Layout] = {}
LAYOUTS_MAX = 4096  # past it the table starts again


def compact_layout(shape: tuple[int, ...], itemsize: int) -> Layout:
    """(shape as a plain tuple, row-major byte strides, nbytes) of a compact array, kept."""
    key = (shape, itemsize)
    layout = layouts.get(key)
    if layout is None:
        if len(layouts) > LAYOUTS_MAX:
            layouts.clear()
        shape = tuple(shape)
        n = 1
        for d in shape:
            n *= d
        layout = layouts[key] = (shape, c_strides(shape, itemsize), n * itemsize)
    return layout


def overlaps(a: Span, b: Span) -> bool:
    """True when the byte extents of two spans intersect."""
    return a.lo < b.hi and b.lo < a.hi and a.hi > a.lo and b.hi > b.lo
