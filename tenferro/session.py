"""`Session`: one device's primary context and one stream, in a ``with`` block, on one thread.

This is the first slice of the session: scope, thread affinity, owned device buffers as
`TensorMut`/`TensorRef` spans, NVRTC modules and checked launches. Owners of the spans of every
launch stay referenced until the next `synchronize` (or the end of the block).
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import numpy as np

from . import _driver, dtypes
from .errors import KernelFault, RuntimeStateError, ValidationError
from .launch import LaunchConfig, check_against
from .module import Function, Module, compile_cuda
from .spans import Span, TensorMut, TensorRef, c_strides

__all__ = ["DeviceBuffer", "Session"]


class DeviceBuffer:
    """A stream-ordered device allocation owned by a session; freed on its stream when dropped."""

    __slots__ = ("__weakref__", "nbytes", "ptr", "scalar_type", "session", "shape")

    def __init__(self, session: Session, shape: tuple[int, ...], t: dtypes.ScalarType) -> None:
        n = 1
        for d in shape:
            n *= d
        self.session = session
        self.shape = shape
        self.scalar_type = t
        self.nbytes = n * t.itemsize
        self.ptr = _driver.mem_alloc_async(self.nbytes, session._stream, "session.alloc")

    def __del__(self) -> None:
        ptr, self.ptr = getattr(self, "ptr", 0), 0
        if not ptr:
            return
        try:
            if self.session._open:
                _driver.mem_free_async(ptr, self.session._stream)
            else:
                self.session.context.push()
                try:
                    _driver.mem_free(ptr)
                finally:
                    self.session.context.pop()
        except Exception:  # never raise from a finaliser; a lost free leaks, it does not corrupt
            pass


class Session:
    """A scoped device session: ``with tf.Session(device=0) as s: ...``.

    Opening raises `RuntimeStateError` with no driver or GPU. Every method refuses use from
    another thread and after the block; leaving the block synchronizes, even when it raised.
    """

    def __init__(self, device: int = 0) -> None:
        if not isinstance(device, int) or isinstance(device, bool) or device < 0:
            raise ValidationError(f"Session: {device=} must be an int >= 0")
        self.device = device
        self._open = False
        self._thread = None
        self._modules: list[Module] = []
        self._inflight: list = []
        self._last: collections.deque[str] = collections.deque(maxlen=8)
        self._faulted = False

    # --- scope ---------------------------------------------------------------------------

    def __enter__(self) -> Session:
        if self._open or self._thread is not None:
            raise RuntimeStateError("session.__enter__: a Session is entered once")
        self.context = _driver.PrimaryContext.get(self.device, "session")
        self._prev_ctx = self.context.make_current()
        self._stream = _driver.stream_create()
        self._sobj = _driver.stream_object(self._stream)
        self._thread = threading.get_ident()
        self._open = True
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            self.synchronize()
        except Exception as sync_exc:
            if exc is None:
                raise
            exc.add_note(f"tenferro: synchronizing at the end of the session also failed: "
                         f"{sync_exc}")
        finally:
            self._open = False
            self._inflight.clear()
            for m in self._modules:
                try:
                    m.unload()
                except Exception:
                    pass
            self._modules.clear()
            try:
                _driver.stream_destroy(self._stream)
            finally:
                _driver.set_current(self._prev_ctx)

    @property
    def is_open(self) -> bool:
        """True inside the ``with`` block."""
        return self._open

    def _check_use(self, op: str) -> None:
        if not self._open:
            raise RuntimeStateError(f"{op}: the session is closed (used outside its with block)")
        if threading.get_ident() != self._thread:
            raise RuntimeStateError(f"{op}: the session belongs to the thread that opened it; "
                                    "open a Session on this thread instead")
        if self._faulted:
            raise KernelFault(f"{op}: an earlier kernel fault made this session unusable",
                              launches=tuple(self._last))

    # --- memory --------------------------------------------------------------------------

    def _buffer(self, shape: Any, dtype: Any, op: str) -> DeviceBuffer:
        self._check_use(op)
        if isinstance(shape, int):
            shape = (shape,)
        shape = tuple(shape)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise ValidationError(f"{op}: {shape=} must be a tuple of ints >= 0")
        return DeviceBuffer(self, shape, dtypes.from_numpy(dtype, op))

    def alloc_zeros(self, shape: Any, dtype: Any) -> TensorMut:
        """A zero-filled device buffer, as a writable span."""
        buf = self._buffer(shape, dtype, "session.alloc_zeros")
        _driver.memset_d8_async(buf.ptr, 0, buf.nbytes, self._stream, "session.alloc_zeros")
        return self._span(TensorMut, buf)

    def upload(self, array: np.ndarray) -> TensorMut:
        """Copy a host array into a new device buffer (stream-ordered)."""
        op = "session.upload"
        if not isinstance(array, np.ndarray):
            raise ValidationError(f"{op}: array must be a numpy.ndarray, got "
                                  f"{type(array).__name__}")
        host = np.ascontiguousarray(array)
        buf = self._buffer(host.shape, host.dtype, op)
        _driver.memcpy_htod_async(buf.ptr, host.ctypes.data, buf.nbytes, self._stream, op)
        self._inflight.append(host)  # pageable source stays alive until the stream passes
        return self._span(TensorMut, buf)

    def download(self, span: Span) -> np.ndarray:
        """Copy a span to a new host array; waits for the stream."""
        op = "session.download"
        self._check_use(op)
        if not isinstance(span, Span) or span.session is not self:
            raise ValidationError(f"{op}: span must be a span of this session, got "
                                  f"{type(span).__name__}")
        out = np.empty(span.shape, dtype=span.scalar_type.numpy)
        _driver.memcpy_dtoh_async(out.ctypes.data, span.ptr, span.nbytes, self._stream, op)
        self.synchronize()
        return out

    def _span(self, cls: type, buf: DeviceBuffer) -> Span:
        t = buf.scalar_type
        return cls(buf.ptr, buf.shape, c_strides(buf.shape, t.itemsize), t, self.device, buf,
                   self)

    def readonly(self, span: Span) -> TensorRef:
        """A read-only view of a span of this session."""
        self._check_use("session.readonly")
        return TensorRef(span.ptr, span.shape, span.strides, span.scalar_type, span.device,
                         span.owner, self)

    # --- modules and launches ------------------------------------------------------------

    def compile(self, source: str, options: Any = None, name_expressions: Any = None) -> Module:
        """Compile CUDA C for this device's architecture (cached) and load it."""
        op = "session.compile"
        self._check_use(op)
        major, minor = self.context.compute_capability
        r = compile_cuda(source, arch=f"sm_{major}{minor}", options=options,
                         name_expressions=name_expressions,
                         _driver_version=_driver.driver_version())
        m = Module(self, r.image, "cubin", r.signatures, r.lowered_names, op)
        self._modules.append(m)
        return m

    def launch(self, fn: Function, config: LaunchConfig, args: list | tuple) -> None:
        """Check and enqueue one launch on the session's stream."""
        op = "session.launch"
        self._check_use(op)
        if type(fn) is not Function or fn.session is not self:
            raise ValidationError(f"{op}: fn must be a Function of this session, got "
                                  f"{type(fn).__name__}")
        if type(config) is not LaunchConfig:  # before the set lookup: a list would not hash
            raise ValidationError(f"{op}: config must be a LaunchConfig, got "
                                  f"{type(config).__name__}")
        if config not in fn.checked_configs:
            check_against(config, fn, op)
            fn.checked_configs.add(config)
        block = fn.block
        spans = block.pack(args, self, op)
        _driver.launch(fn.fobj, config.grid, config.block, config.shared_mem_bytes, self._sobj,
                       block.address, op)
        self._inflight.append(spans)
        self._last.append(fn.name)

    def synchronize(self) -> None:
        """Wait for the stream; a kernel fault raises `KernelFault` and ends the session's use."""
        op = "session.synchronize"
        if not self._open:  # the stream is destroyed at the end of the block
            raise RuntimeStateError(f"{op}: the session is closed (used outside its with block)")
        if threading.get_ident() != self._thread:
            raise RuntimeStateError(f"{op}: the session belongs to the thread that opened it")
        try:
            _driver.stream_synchronize(self._stream, op)
        except KernelFault as exc:
            self._faulted = True
            raise KernelFault(f"{exc}; last launches: {list(self._last)}", exc.result_name,
                              exc.result_code, tuple(self._last)) from None
        self._inflight.clear()
