"""Producing DLPack capsules from a `tf.Tensor`: ``Tensor.__dlpack__`` and ``__dlpack_device__``.

A consumer that passes ``max_version=(1, x)`` gets a versioned capsule (``dltensor_versioned``),
any other consumer a legacy one (``dltensor``). The stream conventions of the standard hold:
``stream=None`` or ``1`` is the legacy default stream, ``2`` the per-thread default stream, any
other int a stream handle of the consumer, ``-1`` "do not synchronize"; ``0`` is refused. The
consumer's stream is ordered after the session's with an event, never a host synchronize.

Lifetime: the managed tensor holds a reference to the Tensor, so the memory lives as long as
the consumer holds the capsule's tensor, also after the session closed. When the consumer calls
the deleter (or an unconsumed capsule is collected), the reference goes; if the session is still
open, its stream first waits for the consumer's stream (the one it named at export), so work
the consumer queued on it before letting go finishes before the memory is freed in the
session's stream order. After the session closed the free is synchronous (``cuMemFree``).
The deleter is a ctypes callback: it takes the GIL itself and may be called from any thread.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any

from .. import _driver
from ..errors import RuntimeStateError, ValidationError
from .dlpack import DL_CUDA, DLTENSOR, LEGACY_TAIL, MAX_VERSION, VERSIONED_HEAD
from .streams import LEGACY, order_after, stream_value

__all__ = ["FLAG_IS_COPIED", "export", "live_exports"]

FLAG_IS_COPIED = 2  # DLPACK_FLAG_BITMASK_IS_COPIED

# The names must outlive every capsule: PyCapsule_New keeps the pointer, not a copy.
_NAME_LEGACY = ctypes.c_char_p(b"dltensor")
_NAME_VERSIONED = ctypes.c_char_p(b"dltensor_versioned")

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
# The destructor gets a capsule whose reference count is already zero: these prototypes take it
# as a plain address so that ctypes never makes a new reference to it.
_is_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
_get_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


class _Export:
    """What one exported managed tensor keeps alive until its deleter runs."""

    __slots__ = ("consumer_stream", "managed", "tensor")
    consumer_stream: int | None
    managed: Any
    tensor: Any

    def release(self) -> None:
        t, self.tensor = self.tensor, None
        if t is None:
            return
        st = t.state
        stream = self.consumer_stream
        if stream is not None and st.is_open and t.ptr and stream not in st.ordering.in_order_with:
            # The consumer may have queued work on its stream that still reads this memory.
            t.context.push()
            try:
                with _lock:
                    order_after(st.stream, stream, st.export_event, "tensor.__dlpack__ deleter")
            except Exception:  # the consumer's stream is gone: it cannot be waited for; be safe
                _driver.context_synchronize()
            finally:
                t.context.pop()
        del t  # the Tensor frees in the session's stream order (or synchronously after close)


_live: dict[int, _Export] = {}
_lock = threading.Lock()


def _release(managed: int) -> None:
    with _lock:
        ex = _live.pop(managed, None)
    if ex is not None:
        try:
            ex.release()
        except Exception:  # a deleter must not raise into the consumer's C code
            pass


def _destroy_capsule(capsule: int) -> None:
    # A consumer renames the capsule when it takes it; only an unconsumed one is released here.
    for name in (_NAME_VERSIONED, _NAME_LEGACY):
        if _is_valid_raw(capsule, name):
            _release(_get_pointer_raw(capsule, name))
            return


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_release)
_DELETER_ADDR = ctypes.cast(_DELETER, ctypes.c_void_p).value
_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_destroy_capsule)
_DESTRUCTOR_ADDR = ctypes.cast(_DESTRUCTOR, ctypes.c_void_p).value


def live_exports() -> int:
    """How many exported managed tensors have not been released yet (for tests)."""
    return len(_live)


def _consumer_stream(stream: Any, op: str) -> int | None:
    """The consumer's stream as a driver handle, or None for ``-1`` (no synchronization)."""
    if stream is None:
        return LEGACY  # the standard: None means the legacy default stream for CUDA
    return stream_value(stream, "stream", op, no_sync=True)


def _version(max_version: Any, op: str) -> tuple[int, int] | None:
    if max_version is None:
        return None
    if not (
        isinstance(max_version, tuple)
        and len(max_version) == 2
        and all(isinstance(v, int) and v >= 0 for v in max_version)
    ):
        raise ValidationError(f"{op}: {max_version=} must be None or a (major, minor) tuple")
    major, minor = max_version
    if major < 1:
        return None  # the consumer only knows the legacy structure
    if major == 1:
        return (1, min(minor, MAX_VERSION[1]))
    return MAX_VERSION


def export(tensor: Any, stream: Any, max_version: Any, dl_device: Any, copy: Any) -> Any:
    """``Tensor.__dlpack__``: a capsule over the Tensor's memory (or over a copy if asked)."""
    op = "tensor.__dlpack__"
    if dl_device is not None:
        try:
            dev = (int(dl_device[0]), int(dl_device[1]))
        except (TypeError, ValueError, IndexError):
            raise BufferError(
                f"{op}: {dl_device=} must be a (device_type, device_id) tuple"
            ) from None
        if dev != (DL_CUDA, tensor.device):
            raise BufferError(
                f"{op}: {dl_device=} asks for another device; this Tensor is on "
                f"(kDLCUDA={DL_CUDA}, {tensor.device}) and tenferro does not "
                "copy across devices"
            )
    if copy not in (None, True, False):
        raise ValidationError(f"{op}: {copy=} must be None, True or False")
    if tensor.scalar_type.dl_code < 0:
        raise BufferError(
            f"{op}: the Tensor's dtype {tensor.scalar_type.numpy} is a record, which DLPack has "
            "no type for; consumers read it through __cuda_array_interface__ (which keeps its "
            "fields)"
        )
    consumer = _consumer_stream(stream, op)
    version = _version(max_version, op)
    if not tensor.ptr and tensor.nbytes:
        raise RuntimeStateError(f"{op}: the Tensor has been freed")
    st = tensor.state
    flags = 0
    if copy is True:
        if not st.is_open:
            raise BufferError(f"{op}: copy=True needs the Tensor's session to be open")
        st.check_use(op)
        st.refuse_in_capture(op, "a copy would allocate inside the graph")
        dup = type(tensor).allocate(st, tensor.shape, tensor.scalar_type, op)
        if tensor.nbytes:
            _driver.memcpy_dtod_async(dup.ptr, tensor.ptr, tensor.nbytes, st.stream, op)
        tensor, flags = dup, FLAG_IS_COPIED
    if st.is_open and consumer is not None and consumer not in st.ordering.in_order_with:
        if st.liveness.capturing:
            raise RuntimeStateError(
                f"{op}: not allowed during s.capture(): ordering the "
                "consumer's stream needs an event"
            )
        # The consumer's stream waits for everything enqueued so far on ours. The record and
        # the wait are one step under the lock: another thread exporting must not re-record
        # the session's event in between.
        same_thread = st.thread == threading.get_ident()
        if not same_thread:
            tensor.context.push()
        try:
            with _lock:
                order_after(consumer, st.stream, st.export_event, op)
        finally:
            if not same_thread:
                tensor.context.pop()
    return _make_capsule(tensor, version, flags, consumer)


def _make_capsule(
    tensor: Any, version: tuple[int, int] | None, flags: int, consumer: int | None
) -> Any:
    t = tensor.scalar_type
    ndim = len(tensor.shape)
    # One buffer: the managed tensor, then shape[ndim] and strides[ndim] (in elements).
    head = (
        DLTENSOR.size + LEGACY_TAIL.size if version is None else VERSIONED_HEAD.size + DLTENSOR.size
    )
    buf = ctypes.create_string_buffer(head + 16 * ndim)
    addr = ctypes.addressof(buf)
    shape_p, strides_p = addr + head, addr + head + 8 * ndim
    tensor_at = 0 if version is None else VERSIONED_HEAD.size
    DLTENSOR.pack_into(
        buf,
        tensor_at,
        tensor.ptr,
        DL_CUDA,
        tensor.device,
        ndim,
        t.dl_code,
        t.dl_bits,
        1,
        shape_p if ndim else 0,
        strides_p if ndim else 0,
        0,
    )
    if version is None:
        LEGACY_TAIL.pack_into(buf, DLTENSOR.size, 0, _DELETER_ADDR)
        name = _NAME_LEGACY
    else:
        VERSIONED_HEAD.pack_into(buf, 0, version[0], version[1], 0, _DELETER_ADDR, flags)
        name = _NAME_VERSIONED
    if ndim:
        item = t.itemsize
        struct.pack_into(
            f"<{2 * ndim}q", buf, head, *tensor.shape, *(st // item for st in tensor.strides)
        )
    ex = _Export()
    ex.tensor = tensor
    ex.consumer_stream = consumer
    ex.managed = buf
    with _lock:
        _live[addr] = ex
    try:
        return _capsule_new(addr, name, _DESTRUCTOR_ADDR)
    except BaseException:
        _release(addr)
        raise
