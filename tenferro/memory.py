"""The memory operations a session delegates to: allocate, upload, download, copy, memset.

Each checks its arguments and the session's state, enqueues the driver's copy or fill on the
session's stream and hands what the work reads or writes to the session's liveness, so that it
stays alive until the stream has passed it. Sources and destinations other than the session's
own Tensors are imported as spans first (`tenferro.span_import`), with every check a span
makes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _driver, dtypes
from .dtypes import is_int as _is_int
from .errors import RuntimeStateError, ValidationError
from .interop.streams import order_after
from .span_import import import_span
from .spans import ADDRESS_END as _ADDRESS_END
from .spans import DeviceBytes, Span, TensorMut, TensorRef, overlaps
from .tensor import Tensor

__all__ = [
    "alloc_bytes",
    "alloc_output",
    "alloc_zeros",
    "copy",
    "copy_peer",
    "download",
    "memory_stats",
    "memset",
    "new_tensor",
    "trim_memory",
    "upload",
]


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
    if not all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ValidationError(f"{op}: {shape=} must be a tuple of ints >= 0")
    return tuple(int(d) for d in shape)


def new_tensor(st: Any, shape: Any, dtype: Any, op: str) -> Tensor:
    """A new Tensor of the session of ``st``, checked and counted for the byte fences."""
    st.check_use(op)
    st.refuse_in_capture(op, "the memory would belong to the graph; allocate before the capture")
    if dtype is None:  # numpy would read None as float64
        raise ValidationError(f"{op}: dtype=None; give the element type (np.float32, 'float32')")
    t = Tensor.allocate(st, _shape_arg(shape, op), dtypes.as_scalar_type(dtype, op), op)
    st.liveness.allocated_bytes(t.nbytes)  # past FENCE_BYTES, passed owners go
    return t


def memory_stats(st: Any) -> dict[str, int]:
    """Bytes of tenferro's memory pool on this device: reserved from the device and used.

    ``reserved_bytes`` / ``used_bytes`` now, ``*_high`` their peaks. Freed Tensors stay
    reserved for reuse until `trim_memory` or the end of the session; the blocks of freed
    small Tensors (at most 512 of 256 bytes) count as used until then.
    """
    st.check_use("session.memory_stats")
    return st.context.pool_stats()


def trim_memory(st: Any, keep_bytes: int = 0) -> None:
    """Give the device back what the pool holds unused, keeping at least ``keep_bytes``."""
    op = "session.trim_memory"
    st.check_use(op)
    if not _is_int(keep_bytes) or not 0 <= keep_bytes < _ADDRESS_END:
        raise ValidationError(f"{op}: {keep_bytes=} must be an int >= 0")
    st.liveness.free_spare_blocks()
    st.context.trim_pool(int(keep_bytes), op)


def alloc_output(st: Any, shape: Any, dtype: Any) -> Tensor:
    """An uninitialised Tensor, for a kernel to write every element of."""
    return new_tensor(st, shape, dtype, "session.alloc_output")


def alloc_zeros(st: Any, shape: Any, dtype: Any) -> Tensor:
    """A zero-filled Tensor."""
    op = "session.alloc_zeros"
    t = new_tensor(st, shape, dtype, op)
    _driver.memset_d8_async(t.ptr, 0, t.nbytes, st.stream, op)
    return t


def alloc_bytes(st: Any, nbytes: int) -> DeviceBytes:
    """An untyped, exclusive device workspace of ``nbytes`` bytes."""
    op = "session.alloc_bytes"
    if not isinstance(nbytes, (int, np.integer)) or isinstance(nbytes, bool) or nbytes < 0:
        raise ValidationError(f"{op}: {nbytes=} must be an int >= 0")
    t = new_tensor(st, (int(nbytes),), np.uint8, op)
    return DeviceBytes(t.ptr, t.shape, t.strides, t.scalar_type, st.device, t, st)


def upload(st: Any, array: np.ndarray) -> Tensor:
    """Copy a host array into a new Tensor of the same dtype and shape (stream-ordered)."""
    op = "session.upload"
    if not isinstance(array, np.ndarray):
        raise ValidationError(f"{op}: array must be a numpy.ndarray, got {type(array).__name__}")
    host = np.ascontiguousarray(array).reshape(array.shape)  # 0-d stays 0-d
    st.refuse_in_capture(op, "host copies cannot be captured; upload before the capture")
    t = new_tensor(st, host.shape, host.dtype, op)
    if t.nbytes:
        _driver.memcpy_htod_async(t.ptr, host.ctypes.data, t.nbytes, st.stream, op)
    st.liveness.hold(host)  # the host source stays alive until the stream passes the copy
    return t


def download(st: Any, x: Any) -> np.ndarray:
    """Copy a Tensor, span or foreign device array to a new numpy array; waits for the stream.

    Strided spans come back with their logical shape, C-contiguous. bf16 comes back as
    ``ml_dtypes.bfloat16`` when that is installed, else as its uint16 bits.
    """
    op = "session.download"
    st.check_use(op)
    st.refuse_in_capture(op, "it waits for the stream")
    span = import_span(st, x, TensorRef, None, True, op)
    t = span.scalar_type
    np_dtype = t.numpy if t.numpy is not None else np.dtype(np.uint16)
    if span.nbytes == 0:
        return np.empty(span.shape, dtype=np_dtype)
    raw = np.empty(span.hi - span.lo, dtype=np.uint8)
    _driver.memcpy_dtoh_async(raw.ctypes.data, span.lo, raw.nbytes, st.stream, op)
    st.liveness.hold(span)
    st.synchronize(op)
    if span.is_c_contiguous:
        return raw.view(np_dtype).reshape(span.shape)
    view = np.ndarray(
        span.shape, dtype=np_dtype, buffer=raw, offset=span.ptr - span.lo, strides=span.strides
    )
    return np.ascontiguousarray(view)


def copy(st: Any, dst: Any, src: Any) -> None:
    """Copy ``src`` into ``dst`` on the stream (device to device).

    Refused: different byte sizes, different dtypes (unless one side is `DeviceBytes`),
    non-contiguous sides, overlapping memory, a read-only destination.
    """
    op = "session.copy"
    d = import_span(st, dst, TensorMut, None, False, f"{op}: dst")
    r = import_span(st, src, TensorRef, None, False, f"{op}: src")
    if d.nbytes != r.nbytes:
        raise ValidationError(f"{op}: dst has {d.nbytes} bytes, src has {r.nbytes}")
    untyped = isinstance(dst, DeviceBytes) or isinstance(src, DeviceBytes)
    if not untyped and d.scalar_type is not r.scalar_type:
        raise ValidationError(f"{op}: dst is {d.scalar_type.name}, src is {r.scalar_type.name}")
    if overlaps(d, r):
        raise ValidationError(f"{op}: dst and src overlap in memory")
    if d.nbytes:
        _driver.memcpy_dtod_async(d.ptr, r.ptr, d.nbytes, st.stream, op)
    st.liveness.hold((d, r))


def memset(st: Any, dst: Any, value: int = 0) -> None:
    """Set every byte of ``dst`` to ``value`` (0 to 255) on the stream.

    ``dst`` is writable, compact memory of this session (a Tensor, a writable span, a
    foreign array). The same byte goes to every element: ``value=0`` zeroes any type,
    ``value=0xFF`` sets every bit.
    """
    op = "session.memset"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= 255:
        raise ValidationError(f"{op}: {value=} must be a byte value, an int from 0 to 255")
    d = import_span(st, dst, TensorMut, None, False, f"{op}: dst")
    if d.nbytes:
        _driver.memset_d8_async(d.ptr, int(value), d.nbytes, st.stream, op)
    st.liveness.hold((d,))


def copy_peer(st: Any, dst: Any, src: Any) -> None:
    """Copy ``src``, memory of another session (any device), into ``dst`` of this one.

    ``src`` is a tf.Tensor or a span of another session, on this device or another one;
    ``dst`` is writable memory of this session. The copy runs on this session's stream,
    ordered after ``src``'s session stream with an event (no host sync); peer access is
    enabled where the hardware allows it, and the driver stages the copy where it does
    not. Sizes and dtypes must match, both sides compact. A later write to ``src`` from its
    own session must wait for this copy: ``other.wait(s.record_event())``.
    """
    op = "session.copy_peer"
    d = import_span(st, dst, TensorMut, None, False, f"{op}: dst")
    if isinstance(src, Tensor):
        other, ptr, nbytes, t, owner = src.state, src.ptr, src.nbytes, src.scalar_type, src
        ctx = src.context
    elif isinstance(src, Span) and src.state is not st:
        other, ptr, nbytes, t, owner = src.state, src.ptr, src.nbytes, src.scalar_type, src.owner
        ctx = other.context
        if not src.is_c_contiguous:
            raise ValidationError(f"{op}: src has non-compact strides={src.strides}")
    else:
        raise ValidationError(
            f"{op}: src must be a tf.Tensor or a span of another session, "
            f"got {type(src).__name__}; use s.copy within one session"
        )
    if other is st:
        raise ValidationError(f"{op}: src belongs to this session; use s.copy")
    if d.nbytes != nbytes:
        raise ValidationError(f"{op}: dst has {d.nbytes} bytes, src has {nbytes}")
    if d.scalar_type is not t:
        raise ValidationError(f"{op}: dst is {d.scalar_type.name}, src is {t.name}")
    if other.is_open and other.thread is not None and other.faulted:
        raise RuntimeStateError(f"{op}: src's session (device {other.device}) faulted")
    st.refuse_in_capture(op, "ordering after another session's stream needs an event")
    if other.is_open:  # order after the source session's work, device to device
        # The event must belong to the source's context to be recorded on its stream; a
        # stream may wait on an event of another context.
        ctx.push()
        try:
            ev = _driver.event_create()
            try:  # and after the producers the source's next kernel would have waited for
                for producer in (*other.ordering.pending, other.stream):
                    order_after(st.stream, producer, ev, op)
            finally:
                _driver.event_destroy(ev)  # released once the wait has been satisfied
        finally:
            ctx.pop()
    if ctx.ordinal != st.device:
        _driver.enable_peer_access(st.context, ctx, op)
    if nbytes:
        _driver.memcpy_peer_async(d.ptr, st.context.handle, ptr, ctx.handle, nbytes, st.stream, op)
    st.liveness.hold((d, owner))
