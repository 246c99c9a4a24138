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

from . import _driver
from ._liveness import SPARE_BLOCK_BYTES, capture_on_this_thread
from .dtypes import ScalarType
from .errors import ValidationError
from .spans import (
    Shaped,
    Span,
    TensorMut,
    compact_layout,
    layouts,
)

__all__ = ["Tensor"]


def _free_elsewhere(context: Any, st: Any, ptr: int) -> None:
    """Free a Tensor's memory from outside its session's thread or block."""
    context.push()
    try:
        if st.is_open:
            _driver.mem_free_async(ptr, st.stream)
        else:
            _driver.mem_free(ptr)
    finally:
        context.pop()


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
        "shape",
        "state",
        "strides",
    )
    ptr: int
    strides: tuple[int, ...]
    device: int
    context: Any
    state: Any
    _ref_span: weakref.ref[Span] | None
    _mut_span: weakref.ref[Span] | None

    @property
    def session(self) -> Any:
        """The `tenferro.Session` this Tensor belongs to."""
        return self.state.session

    def __init__(self) -> None:
        raise TypeError("Tensor: made by a session (s.alloc_output, s.alloc_zeros, s.upload)")

    @classmethod
    def allocate(cls, state: Any, shape: tuple[int, ...], t: ScalarType, op: str) -> Tensor:
        """A new Tensor from the session's memory pool, on its stream (the session checks first)."""
        self = object.__new__(cls)
        self._ref_span = self._mut_span = None  # weak references to the spans last made
        self.ptr = 0
        self.state = state
        self.context = state.context
        self.device = state.device
        self.scalar_type = t
        self.shape, self.strides, nbytes = layouts.get((shape, t.itemsize)) or compact_layout(
            shape, t.itemsize
        )
        self.nbytes = nbytes
        if nbytes > SPARE_BLOCK_BYTES:
            self.ptr = state.context.alloc_async(nbytes, state.stream, op)
        else:  # a block a small Tensor left, or a new one of that size: it may be kept too
            self.ptr = state.liveness.take_block() or state.context.alloc_async(
                SPARE_BLOCK_BYTES, state.stream, op
            )
        return self

    def span(self, cls: type[Span]) -> Span:
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
        span = cls.compact(
            self.ptr,
            self.shape,
            self.strides,
            self.scalar_type,
            self.nbytes,
            self.device,
            self,
            self.state,
        )
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
        st = self.state
        try:
            if _driver.forked_child():  # the parent's memory: not this process's to free
                return
            if st.is_open and st.thread == threading.get_ident():
                if st.liveness.capturing:  # a free now would become a node of the graph
                    st.liveness.defer_free(ptr)
                elif self.nbytes > SPARE_BLOCK_BYTES or not st.liveness.keep_block(ptr):
                    _driver.mem_free_async(ptr, st.stream)
                return
            # Another thread (a garbage collection there) or a closed session: make the context
            # current for this call; after the block the stream is gone, so free synchronously.
            # During a capture on this thread (another session's) the free waits for its end.
            context, running = self.context, capture_on_this_thread()
            if running is not None:
                running.defer_release(lambda: _free_elsewhere(context, st, ptr))
            else:
                _free_elsewhere(context, st, ptr)
        except Exception:  # never raise from a finaliser; a lost free leaks, it does not corrupt
            pass

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA Array Interface v3.

        ``stream`` is the session's stream while it is open (the consumer orders itself after
        it), and None after the block, when all work has been synchronized.
        """
        t = self.scalar_type
        typestr = t.numpy.str if t.numpy is not None else "<V2"
        st = self.state
        cai = {
            "shape": self.shape,
            "typestr": typestr,
            "data": (self.ptr if self.nbytes else 0, False),  # the interface: 0 when empty
            "strides": None,
            "version": 3,
            "stream": st.stream if st.is_open else None,
        }
        if t.numpy is not None and t.numpy.names:  # a record: its fields, as numpy lays them
            cai["descr"] = t.numpy.descr
        return cai

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Any = None,
        dl_device: Any = None,
        copy: Any = None,
    ) -> Any:
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
        """Copy to a new numpy array (``s.download(self)``); waits for the session's stream.

        Returns:
            A new numpy array of the Tensor's shape and dtype (bf16 as ``ml_dtypes.bfloat16``
                where that is installed, else its uint16 bits).

        Raises:
            RuntimeStateError: The session is closed, used from another thread, or
                capturing.
            BackendError: The driver refused the copy.
            KernelFault: A kernel faulted before the copy completed (or earlier); the
                session is stopped.
        """
        return self.session.download(self)

    def preview(self, edgeitems: int = 3) -> str:
        """The values as numpy prints them, the first and last ``edgeitems`` of each dimension.

        Copies the Tensor back, so it waits for the session's stream: a repr never does.

        Args:
            edgeitems: Values shown at each end of each dimension, an int >= 1; a Tensor of
                at most ``2 * edgeitems`` elements is shown whole.

        Returns:
            The text ``np.array2string`` makes of the values.

        Raises:
            ValidationError: ``edgeitems`` is not an int >= 1.
            RuntimeStateError: The session is closed, used from another thread, or
                capturing.
            BackendError: The driver refused the copy.
            KernelFault: A kernel faulted before the copy completed (or earlier); the
                session is stopped.
        """
        if not isinstance(edgeitems, int) or isinstance(edgeitems, bool) or edgeitems < 1:
            raise ValidationError(f"tensor.preview: {edgeitems=} must be an int >= 1")
        values = self.session.download(self)
        return np.array2string(values, threshold=2 * edgeitems, edgeitems=edgeitems)

    def __repr__(self) -> str:
        return (
            f"Tensor(shape={self.shape}, dtype={self.scalar_type.name}, "
            f"device={self.device}, ptr=0x{self.ptr:x})"
        )

    def _repr_html_(self) -> str:
        return (
            f"<b>tenferro Tensor</b> shape {self.shape}, {self.scalar_type.name}, device "
            f"{self.device}, {self.nbytes} bytes <small>(values: <code>t.preview()</code>, "
            f"which waits for the stream)</small>"
        )
