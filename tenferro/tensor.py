"""`Tensor`: an owned, typed device allocation, allocated and freed in its session's stream order.

A Tensor is made by a session (``s.alloc_output``, ``s.alloc_zeros``, ``s.upload``). It frees
its memory when the last reference goes: on the session's stream while the session is open (so
a kernel still queued before the free keeps working), and after a full synchronize once the
session has closed. That is what lets a Tensor exported through ``__cuda_array_interface__``
outlive its session: the memory lives as long as the consumer holds the Tensor.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from . import _driver
from .dtypes import ScalarType
from .spans import c_strides

__all__ = ["Tensor"]


class Tensor:
    """A C-contiguous device array owned by tenferro.

    ``strides`` are in bytes, as numpy gives them. Pass a Tensor to ``s.tensor`` /
    ``s.tensor_mut`` to launch on it, to ``s.download`` to read it back, or to any library that
    reads ``__cuda_array_interface__`` (version 3, with the session's stream).
    """

    __slots__ = (
        "__weakref__",
        "_context",
        "_session",
        "device",
        "nbytes",
        "ptr",
        "scalar_type",
        "shape",
        "strides",
    )

    def __init__(self) -> None:
        raise TypeError("Tensor: made by a session (s.alloc_output, s.alloc_zeros, s.upload)")

    @classmethod
    def _allocate(cls, session: Any, shape: tuple[int, ...], t: ScalarType, op: str) -> Tensor:
        self = object.__new__(cls)
        n = 1
        for d in shape:
            n *= d
        self.ptr = 0
        self._session = session
        self._context = session.context
        self.device = session.device
        self.shape = shape
        self.scalar_type = t
        self.strides = c_strides(shape, t.itemsize)
        self.nbytes = n * t.itemsize
        self.ptr = _driver.mem_alloc_async(self.nbytes, session._stream, session.context.pool,
                                           op)
        return self

    def __del__(self) -> None:
        ptr = getattr(self, "ptr", 0)
        if not ptr:
            return
        self.ptr = 0
        s = self._session
        try:
            if s._open and s._thread == threading.get_ident():
                if s.liveness.capturing:  # a free now would become a node of the graph
                    s.liveness.defer_free(ptr)
                else:
                    _driver.mem_free_async(ptr, s._stream)
                return
            # Another thread (a garbage collection there) or a closed session: make the context
            # current for this call; after the block the stream is gone, so free synchronously.
            self._context.push()
            try:
                if s._open:
                    _driver.mem_free_async(ptr, s._stream)
                else:
                    _driver.mem_free(ptr)
            finally:
                self._context.pop()
        except Exception:  # never raise from a finaliser; a lost free leaks, it does not corrupt
            pass

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

    @property
    def __cuda_array_interface__(self) -> dict:
        """CUDA Array Interface v3.

        ``stream`` is the session's stream while it is open (the consumer orders itself after
        it), and None after the block, when all work has been synchronized.
        """
        t = self.scalar_type
        typestr = t.numpy.str if t.numpy is not None else "<V2"
        s = self._session
        return {
            "shape": self.shape,
            "typestr": typestr,
            "data": (self.ptr if self.nbytes else 0, False),  # the interface: 0 when empty
            "strides": None,
            "version": 3,
            "stream": s._stream_for_export() if s._open else None,
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
        return self._session.download(self)

    def __repr__(self) -> str:
        return (f"Tensor(shape={self.shape}, dtype={self.scalar_type.name}, "
                f"device={self.device}, ptr=0x{self.ptr:x})")
