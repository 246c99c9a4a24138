"""`Tensor`: an owned, typed device allocation, allocated and freed in its session's stream order.

A Tensor is made by a session (``s.alloc_output``, ``s.alloc_zeros``, ``s.upload``). It frees
its memory when the last reference goes: on the session's stream while the session is open (so
a kernel still queued before the free keeps working), and after a full synchronize once the
session has closed. That is what lets a Tensor exported through ``__cuda_array_interface__``
outlive its session: the memory lives as long as the consumer holds the Tensor.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

from . import _driver, dtypes
from ._liveness import SPARE_BLOCK_BYTES
from .dtypes import ScalarType
from .dtypes import is_int as _is_int
from .errors import RuntimeStateError, ValidationError
from .spans import ADDRESS_END as _ADDRESS_END
from .spans import (
    DeviceBytes,
    Shaped,
    Span,
    TensorMut,
    TensorRef,
    compact_layout,
    layouts,
    overlaps,
)

__all__ = ["Tensor"]


class Tensor(Shaped):
    """A C-contiguous device array owned by tenferro.

    ``strides`` are in bytes, as numpy gives them. Pass a Tensor to ``s.tensor`` /
    ``s.tensor_mut`` to launch on it, to ``s.download`` to read it back, or to any library that
    reads ``__cuda_array_interface__`` (version 3, with the session's stream).
    """

    __slots__ = (
        "__weakref__",
        "_mut_span",
        "_ref_span",
        "context",
        "device",
        "nbytes",
        "ptr",
        "scalar_type",
        "session",
        "shape",
        "strides",
    )

    def __init__(self) -> None:
        raise TypeError("Tensor: made by a session (s.alloc_output, s.alloc_zeros, s.upload)")

    @classmethod
    def allocate(cls, session: Any, shape: tuple[int, ...], t: ScalarType, op: str) -> Tensor:
        """A new Tensor from the session's memory pool, on its stream (the session checks first)."""
        self = object.__new__(cls)
        self._ref_span = self._mut_span = None  # weak references to the spans last made
        self.ptr = 0
        self.session = session
        self.context = session.context
        self.device = session.device
        self.scalar_type = t
        self.shape, self.strides, nbytes = layouts.get((shape, t.itemsize)) or \
            compact_layout(shape, t.itemsize)
        self.nbytes = nbytes
        if nbytes > SPARE_BLOCK_BYTES:
            self.ptr = session.context.alloc_async(nbytes, session.stream, op)
        else:  # a block a small Tensor left, or a new one of that size: it may be kept too
            self.ptr = session.liveness.take_block() or session.context.alloc_async(
                SPARE_BLOCK_BYTES, session.stream, op)
        return self

    def span(self, cls: type) -> Span:
        """A `TensorRef` or `TensorMut` (``cls``) over the whole Tensor, for its session.

        The one made last while something still holds it: a Tensor's fields never change, so
        the span is the same, and a launch given the very objects of the previous one skips
        the checks it made then. The Tensor keeps only a weak reference (no cycle through the
        span's owner).
        """
        ref = self._mut_span if cls is TensorMut else self._ref_span
        if ref is not None:
            span = ref()
            if span is not None:
                return span
        span = cls.compact(self.ptr, self.shape, self.strides, self.scalar_type, self.nbytes,
                           self.device, self, self.session)
        if cls is TensorMut:
            self._mut_span = weakref.ref(span)
        else:
            self._ref_span = weakref.ref(span)
        return span

    def __del__(self) -> None:
        ptr = getattr(self, "ptr", 0)
        if not ptr:
            return
        self.ptr = 0
        s = self.session
        try:
            if s.is_open and s.thread == threading.get_ident():
                if s.liveness.capturing:  # a free now would become a node of the graph
                    s.liveness.defer_free(ptr)
                elif self.nbytes > SPARE_BLOCK_BYTES or not s.liveness.keep_block(ptr):
                    _driver.mem_free_async(ptr, s.stream)
                return
            # Another thread (a garbage collection there) or a closed session: make the context
            # current for this call; after the block the stream is gone, so free synchronously.
            self.context.push()
            try:
                if s.is_open:
                    _driver.mem_free_async(ptr, s.stream)
                else:
                    _driver.mem_free(ptr)
            finally:
                self.context.pop()
        except Exception:  # never raise from a finaliser; a lost free leaks, it does not corrupt
            pass

    @property
    def __cuda_array_interface__(self) -> dict:
        """CUDA Array Interface v3.

        ``stream`` is the session's stream while it is open (the consumer orders itself after
        it), and None after the block, when all work has been synchronized.
        """
        t = self.scalar_type
        typestr = t.numpy.str if t.numpy is not None else "<V2"
        s = self.session
        return {
            "shape": self.shape,
            "typestr": typestr,
            "data": (self.ptr if self.nbytes else 0, False),  # the interface: 0 when empty
            "strides": None,
            "version": 3,
            "stream": s.stream if s.is_open else None,
        }

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        """A DLPack capsule over this Tensor's memory, zero-copy (`tenferro.interop.dlpack_export`).

        Versioned when ``max_version >= (1, 0)``, legacy otherwise. ``stream`` follows the
        standard (None or 1: legacy default, 2: per-thread default, a handle, -1: no ordering;
        0 is refused); the consumer's stream is ordered after the session's with an event.
        ``dl_device`` other than this Tensor's device raises BufferError; ``copy=True`` hands
        out a copy made on the session's stream (flagged IS_COPIED). The memory stays valid
        while the consumer holds it, also after the session closed.
        """
        from .interop.dlpack_export import export

        return export(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(2, device)``: kDLCUDA and the device ordinal."""
        return (2, self.device)

    def to_host(self) -> np.ndarray:
        """Copy to a new numpy array (``s.download(self)``); waits for the session's stream."""
        return self.session.download(self)

    def preview(self, edgeitems: int = 3) -> str:
        """The values as numpy prints them, the first and last ``edgeitems`` of each dimension.

        Copies the Tensor back, so it waits for the session's stream: a repr never does.
        """
        if not isinstance(edgeitems, int) or isinstance(edgeitems, bool) or edgeitems < 1:
            raise ValidationError(f"tensor.preview: {edgeitems=} must be an int >= 1")
        values = self.session.download(self)
        return np.array2string(values, threshold=2 * edgeitems, edgeitems=edgeitems)

    def __repr__(self) -> str:
        return (f"Tensor(shape={self.shape}, dtype={self.scalar_type.name}, "
                f"device={self.device}, ptr=0x{self.ptr:x})")

    def _repr_html_(self) -> str:
        return (f"<b>tenferro Tensor</b> shape {self.shape}, {self.scalar_type.name}, device "
                f"{self.device}, {self.nbytes} bytes <small>(values: <code>t.preview()</code>, "
                f"which waits for the stream)</small>")


# --- memory operations, which the session delegates to ---------------------------------


def _import_span(s: Any, x: Any, cls: type, dtype: Any, allow_strided: bool, op: str) -> Any:
    from .interop.imports import import_span  # interop sits below tensor; imported on use

    return import_span(s, x, cls, dtype, allow_strided, op)



def _shape_arg(shape: Any, op: str) -> tuple[int, ...]:
    if shape.__class__ is tuple:  # the usual argument: a tuple of ints, taken as it is
        for d in shape:
            if d.__class__ is not int or d < 0:
                break
        else:
            return shape
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    try:
        shape = tuple(shape)
    except TypeError:
        raise ValidationError(f"{op}: {shape=} must be an int or a tuple of ints") from None
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0
               for d in shape):
        raise ValidationError(f"{op}: {shape=} must be a tuple of ints >= 0")
    return tuple(int(d) for d in shape)


def new_tensor(s: Any, shape: Any, dtype: Any, op: str) -> Tensor:
    """A new Tensor of session ``s``, checked and counted for the byte fences."""
    s.check_use(op)
    s.refuse_in_capture(op, "the memory would belong to the graph; allocate before the "
                         "capture")
    t = Tensor.allocate(s, _shape_arg(shape, op), dtypes.from_numpy(dtype, op), op)
    s.liveness.allocated_bytes(t.nbytes)  # past FENCE_BYTES, passed owners go
    return t


def memory_stats(s: Any) -> dict[str, int]:
    """Bytes of tenferro's memory pool on this device: reserved from the device and used.

    ``reserved_bytes`` / ``used_bytes`` now, ``*_high`` their peaks. Freed Tensors stay
    reserved for reuse until `trim_memory` or the end of the session; the blocks of freed
    small Tensors (at most 512 of 256 bytes) count as used until then.
    """
    s.check_use("session.memory_stats")
    return s.context.pool_stats()


def trim_memory(s: Any, keep_bytes: int = 0) -> None:
    """Give the device back what the pool holds unused, keeping at least ``keep_bytes``."""
    op = "session.trim_memory"
    s.check_use(op)
    if not _is_int(keep_bytes) or not 0 <= keep_bytes < _ADDRESS_END:
        raise ValidationError(f"{op}: {keep_bytes=} must be an int >= 0")
    s.liveness.free_spare_blocks()
    s.context.trim_pool(int(keep_bytes), op)


def alloc_output(s: Any, shape: Any, dtype: Any) -> Tensor:
    """An uninitialised Tensor, for a kernel to write every element of."""
    return new_tensor(s, shape, dtype, "session.alloc_output")


def alloc_zeros(s: Any, shape: Any, dtype: Any) -> Tensor:
    """A zero-filled Tensor."""
    op = "session.alloc_zeros"
    t = new_tensor(s, shape, dtype, op)
    _driver.memset_d8_async(t.ptr, 0, t.nbytes, s.stream, op)
    return t


def alloc_bytes(s: Any, nbytes: int) -> DeviceBytes:
    """An untyped, exclusive device workspace of ``nbytes`` bytes."""
    op = "session.alloc_bytes"
    if not isinstance(nbytes, (int, np.integer)) or isinstance(nbytes, bool) or nbytes < 0:
        raise ValidationError(f"{op}: {nbytes=} must be an int >= 0")
    t = new_tensor(s, (int(nbytes),), np.uint8, op)
    return DeviceBytes(t.ptr, t.shape, t.strides, t.scalar_type, s.device, t, s)


def upload(s: Any, array: np.ndarray) -> Tensor:
    """Copy a host array into a new Tensor of the same dtype and shape (stream-ordered)."""
    op = "session.upload"
    if not isinstance(array, np.ndarray):
        raise ValidationError(f"{op}: array must be a numpy.ndarray, got "
                              f"{type(array).__name__}")
    host = np.ascontiguousarray(array).reshape(array.shape)  # 0-d stays 0-d
    s.refuse_in_capture(op, "host copies cannot be captured; upload before the capture")
    t = new_tensor(s, host.shape, host.dtype, op)
    if t.nbytes:
        _driver.memcpy_htod_async(t.ptr, host.ctypes.data, t.nbytes, s.stream, op)
    s.liveness.hold(host)  # the host source stays alive until the stream passes the copy
    return t


def download(s: Any, x: Any) -> np.ndarray:
    """Copy a Tensor, span or foreign device array to a new numpy array; waits for the stream.

    Strided spans come back with their logical shape, C-contiguous. bf16 comes back as
    ``ml_dtypes.bfloat16`` when that is installed, else as its uint16 bits.
    """
    op = "session.download"
    s.check_use(op)
    s.refuse_in_capture(op, "it waits for the stream")
    span = _import_span(s, x, TensorRef, None, True, op)
    t = span.scalar_type
    np_dtype = t.numpy if t.numpy is not None else np.dtype(np.uint16)
    if span.nbytes == 0:
        return np.empty(span.shape, dtype=np_dtype)
    raw = np.empty(span.hi - span.lo, dtype=np.uint8)
    _driver.memcpy_dtoh_async(raw.ctypes.data, span.lo, raw.nbytes, s.stream, op)
    s.liveness.hold(span)
    s.synchronize()
    if span.is_c_contiguous:
        return raw.view(np_dtype).reshape(span.shape)
    view = np.ndarray(span.shape, dtype=np_dtype, buffer=raw, offset=span.ptr - span.lo,
                      strides=span.strides)
    return np.ascontiguousarray(view)


def copy(s: Any, dst: Any, src: Any) -> None:
    """Copy ``src`` into ``dst`` on the stream (device to device).

    Refused: different byte sizes, different dtypes (unless one side is `DeviceBytes`),
    non-contiguous sides, overlapping memory, a read-only destination.
    """
    op = "session.copy"
    d = _import_span(s, dst, TensorMut, None, False, f"{op}: dst")
    r = _import_span(s, src, TensorRef, None, False, f"{op}: src")
    if d.nbytes != r.nbytes:
        raise ValidationError(f"{op}: dst has {d.nbytes} bytes, src has {r.nbytes}")
    untyped = isinstance(dst, DeviceBytes) or isinstance(src, DeviceBytes)
    if not untyped and d.scalar_type is not r.scalar_type:
        raise ValidationError(f"{op}: dst is {d.scalar_type.name}, src is "
                              f"{r.scalar_type.name}")
    if overlaps(d, r):
        raise ValidationError(f"{op}: dst and src overlap in memory")
    if d.nbytes:
        _driver.memcpy_dtod_async(d.ptr, r.ptr, d.nbytes, s.stream, op)
    s.liveness.hold((d, r))


def memset(s: Any, dst: Any, value: int = 0) -> None:
    """Set every byte of ``dst`` to ``value`` (0 to 255) on the stream.

    ``dst`` is writable, compact memory of this session (a Tensor, a writable span, a
    foreign array). The same byte goes to every element: ``value=0`` zeroes any type,
    ``value=0xFF`` sets every bit.
    """
    op = "session.memset"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            not 0 <= value <= 255:
        raise ValidationError(f"{op}: {value=} must be a byte value, an int from 0 to 255")
    d = _import_span(s, dst, TensorMut, None, False, f"{op}: dst")
    if d.nbytes:
        _driver.memset_d8_async(d.ptr, int(value), d.nbytes, s.stream, op)
    s.liveness.hold((d,))


def copy_peer(s: Any, dst: Any, src: Any) -> None:
    """Copy ``src``, memory of another session (any device), into ``dst`` of this one.

    ``src`` is a tf.Tensor or a span of another session, on this device or another one;
    ``dst`` is writable memory of this session. The copy runs on this session's stream,
    ordered after ``src``'s session stream with an event (no host sync); peer access is
    enabled where the hardware allows it, and the driver stages the copy where it does
    not. Sizes and dtypes must match, both sides compact. A later write to ``src`` from its
    own session must wait for this copy: ``other.wait(s.record_event())``.
    """
    op = "session.copy_peer"
    d = _import_span(s, dst, TensorMut, None, False, f"{op}: dst")
    if isinstance(src, Tensor):
        other, ptr, nbytes, t, owner = src.session, src.ptr, src.nbytes, \
            src.scalar_type, src
        ctx = src.context
    elif isinstance(src, Span) and src.session is not s:
        other, ptr, nbytes, t, owner = src.session, src.ptr, src.nbytes, src.scalar_type, \
            src.owner
        ctx = other.context
        if not src.is_c_contiguous:
            raise ValidationError(f"{op}: src has non-compact strides={src.strides}")
    else:
        raise ValidationError(f"{op}: src must be a tf.Tensor or a span of another session, "
                              f"got {type(src).__name__}; use s.copy within one session")
    if other is s:
        raise ValidationError(f"{op}: src belongs to this session; use s.copy")
    if d.nbytes != nbytes:
        raise ValidationError(f"{op}: dst has {d.nbytes} bytes, src has {nbytes}")
    if d.scalar_type is not t:
        raise ValidationError(f"{op}: dst is {d.scalar_type.name}, src is {t.name}")
    if other.is_open and other.thread is not None and other.faulted:
        raise RuntimeStateError(f"{op}: src's session (device {other.device}) faulted")
    s.refuse_in_capture(op, "ordering after another session's stream needs an event")
    if other.is_open:  # order after the source session's work, device to device
        # The event must belong to the source's context to be recorded on its stream; a
        # stream may wait on an event of another context.
        ctx.push()
        try:
            from .interop.streams import order_after  # interop sits below tensor

            ev = _driver.event_create()
            try:  # and after the producers the source's next kernel would have waited for
                for producer in (*other.ordering.pending, other.stream):
                    order_after(s.stream, producer, ev, op)
            finally:
                _driver.event_destroy(ev)  # released once the wait has been satisfied
        finally:
            ctx.pop()
    if ctx.ordinal != s.device:
        _driver.enable_peer_access(s.context, ctx, op)
    if nbytes:
        _driver.memcpy_peer_async(d.ptr, s.context.handle, ptr, ctx.handle, nbytes,
                                  s.stream, op)
    s.liveness.hold((d, owner))
