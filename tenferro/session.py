"""`Session`: one device's primary context and one stream, in a ``with`` block, on one thread.

Session is the user's surface and nothing else: each method is a short delegate to the part
that owns the work (`tenferro.memory`, `tenferro.span_import`, `tenferro.module`,
`tenferro.launch`, `tenferro.graph`, ...), handed the session's `SessionState`, which holds
what those parts share.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Hashable
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np

from . import (
    events,
    graph,
    info,
    launch,
    memory,
    module,
    numba_kernels,
    profiling,
    resources,
    scope,
    span_import,
    timeline,
)
from ._state import FENCE_BYTES, FENCE_EVERY, SessionState
from .errors import KernelFault, RuntimeStateError, ValidationError
from .events import Event
from .graph import Capture, Graph
from .interop import stream_value
from .launch import BoundLaunch
from .launch_config import LaunchConfig
from .module import Function, Module
from .numba_kernels import NumbaKernel
from .profiling import Range
from .spans import DeviceBytes, TensorMut, TensorRef
from .tensor import Tensor
from .timeline import MAX_LAUNCHES, Timeline

__all__ = ["FENCE_BYTES", "FENCE_EVERY", "Session", "from_dlpack", "state_of"]

P = ParamSpec("P")
R = TypeVar("R")
# What the methods on the path of every launch delegate to, bound once: they run per argument.
_read_span, _write_span, _launch = span_import.tensor, span_import.tensor_mut, launch.launch


def _reports_faults(
    method: Callable[Concatenate[Session, P], R],
) -> Callable[Concatenate[Session, P], R]:
    """A method whose driver calls may report a kernel fault, which then stops the session."""

    @functools.wraps(method)
    def reporting(self: Session, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        except KernelFault as exc:
            raise self._state.record_fault(exc) from None

    return reporting


class Session:
    """A scoped device session: ``with tf.Session(device=0) as s: ...``.

    Opening binds the device's primary context and a stream to this thread; every method
    refuses use from another thread and after the block, and everything the session hands out
    (spans, modules, functions, bound launches, graphs) dies with it. Leaving the block
    synchronizes the stream, even when the block raised.

    Args:
        device: The CUDA device ordinal.
        stream: None for a new blocking stream the session owns (ordered with the legacy
            default stream, torch's), or a stream handle or an object with
            ``__cuda_stream__`` to work on (not destroyed at the end).

    Attributes:
        device: The device ordinal.
        context: The device's primary context while open (``compute_capability``,
            ``attribute(name)``); None before the block.

    Raises:
        ValidationError: ``device`` or ``stream`` is not a valid value.
        RuntimeStateError: On entering, with no driver or GPU.
    """

    def __init__(self, device: int = 0, stream: Any = None) -> None:
        if not isinstance(device, int) or isinstance(device, bool) or device < 0:
            raise ValidationError(f"Session: {device=} must be an int >= 0")
        handle = stream_value(stream, "stream", "Session", objects=True, handle=True)
        self.device = device
        self.context: Any = None
        self._state = SessionState(self, device, handle, stream)

    def __enter__(self) -> Session:
        self._state.open()
        self.context = self._state.context
        scope.entered(self)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        st = self._state
        try:
            if not st.faulted:  # a faulted stream reports the same fault again; once is enough
                self.synchronize()
        except Exception as sync_exc:
            if exc is None:
                raise
            exc.add_note(
                f"tenferro: synchronizing at the end of the session also failed: {sync_exc}"
            )
        finally:
            scope.left(self)
            st.close()

    @classmethod
    def open(cls, device: int = 0, stream: Any = None) -> Session:
        """Open a session now, kept open until `close` or the interpreter's exit (notebooks).

        The session is the one a ``with`` block opens. Opening again on the same device from
        the same thread first closes the earlier one, whose handles then refuse use.
        """
        key: Hashable = (threading.get_ident(), device)
        earlier = scope.kept(key)
        if earlier is not None:
            earlier.close()
        s = cls(device, stream)
        s.__enter__()
        scope.keep_open(s, key)
        return s

    def close(self) -> None:
        """Synchronize and close, as leaving the ``with`` block does; a closed one stays so.

        Raises:
            RuntimeStateError: From another thread than the one that opened it.
        """
        st = self._state
        if not st.is_open:
            return
        if threading.get_ident() != st.thread:
            raise RuntimeStateError(
                "session.close: the session belongs to the thread that opened it; close it there"
            )
        self.__exit__(None, None, None)

    @property
    def is_open(self) -> bool:
        """True inside the ``with`` block (or between `open` and `close`)."""
        return self._state.is_open

    @property
    def stream(self) -> int:
        """The session's stream as an int handle, to give another library."""
        self._state.check_use("session.stream")
        return self._state.stream

    # --- spans and memory ---------------------------------------------------------------

    def tensor(self, x: Any, dtype: Any = None, *, allow_strided: bool = False) -> TensorRef:
        """A read-only span over a Tensor, a span, or a CAI / DLPack device array.

        ``dtype`` is the dtype ``x`` must have; ``allow_strided`` admits non-compact strides.
        """
        return _read_span(self._state, x, dtype, allow_strided)

    def tensor_mut(self, x: Any, dtype: Any = None, *, allow_strided: bool = False) -> TensorMut:
        """An exclusive, writable span; refuses producers that marked their array read-only."""
        return _write_span(self._state, x, dtype, allow_strided)

    @_reports_faults
    def alloc_output(self, shape: int | tuple[int, ...], dtype: Any) -> Tensor:
        """An uninitialised Tensor, for a kernel to write every element of."""
        return memory.alloc_output(self._state, shape, dtype)

    @_reports_faults
    def alloc_zeros(self, shape: int | tuple[int, ...], dtype: Any) -> Tensor:
        """A zero-filled Tensor."""
        return memory.alloc_zeros(self._state, shape, dtype)

    @_reports_faults
    def alloc_bytes(self, nbytes: int) -> DeviceBytes:
        """An untyped, exclusive device workspace of ``nbytes`` bytes."""
        return memory.alloc_bytes(self._state, nbytes)

    @_reports_faults
    def upload(self, array: np.ndarray) -> Tensor:
        """Copy a host array into a new Tensor of the same dtype and shape (stream-ordered)."""
        return memory.upload(self._state, array)

    @_reports_faults
    def download(self, x: Any) -> np.ndarray:
        """Copy a Tensor, span or device array to a new numpy array; waits for the stream."""
        return memory.download(self._state, x)

    @_reports_faults
    def copy(self, dst: Any, src: Any) -> None:
        """Copy ``src`` into ``dst`` on the stream (device to device, same sizes and dtypes)."""
        memory.copy(self._state, dst, src)

    @_reports_faults
    def memset(self, dst: Any, value: int = 0) -> None:
        """Set every byte of ``dst`` to ``value`` (0 to 255) on the stream."""
        memory.memset(self._state, dst, value)

    @_reports_faults
    def copy_peer(self, dst: Any, src: Any) -> None:
        """Copy ``src``, memory of another session (any device), into ``dst`` of this one."""
        memory.copy_peer(self._state, dst, src)

    @_reports_faults
    def memory_stats(self) -> dict[str, int]:
        """Bytes of tenferro's memory pool on this device, reserved and used, and their peaks."""
        return memory.memory_stats(self._state)

    @_reports_faults
    def trim_memory(self, keep_bytes: int = 0) -> None:
        """Give the device back what the pool holds unused, keeping at least ``keep_bytes``."""
        memory.trim_memory(self._state, keep_bytes)

    def retain(self, obj: Any) -> Any:
        """Keep ``obj`` alive until the session closes; returns it."""
        self._state.check_use("session.retain")
        self._state.liveness.retain(obj)
        return obj

    # --- kernels and launches -----------------------------------------------------------

    @_reports_faults
    def compile(
        self,
        source: str | os.PathLike[str],
        options: Any = None,
        name_expressions: Any = None,
        arch: str | None = None,
    ) -> Module:
        """Compile CUDA C (a string or a file's path) with NVRTC and load it (disk-cached)."""
        return module.compile_module(self._state, source, options, name_expressions, arch)

    @_reports_faults
    def load_ptx(self, text: str | bytes) -> Module:
        """Load a PTX module; its kernels' parameters come from their ``.entry`` lines."""
        return module.load_ptx_module(self._state, text)

    @_reports_faults
    def load_cubin(self, image: bytes) -> Module:
        """Load a CUBIN image; its kernels' parameters come from the driver (sizes only)."""
        return module.load_cubin_module(self._state, image)

    @_reports_faults
    def numba_kernel(self, kernel: Any, signature: Any = None) -> NumbaKernel | Function:
        """A ``@cuda.jit`` kernel (or a plain function) for this session's device.

        A Function when ``signature`` is given (compiled now), else a kernel specialized to
        the arguments of each launch.
        """
        return numba_kernels.numba_kernel(self._state, kernel, signature)

    def launch(
        self, fn: Function | NumbaKernel, config: LaunchConfig, args: list[Any] | tuple[Any, ...]
    ) -> None:
        """Check every argument against the kernel's parameters and enqueue; only enqueues.

        Raises:
            ValidationError: An argument, the config or the function is refused (named).
            KernelFault: An earlier kernel's fault, which stops the session.
        """
        _launch(self._state, fn, config, args)

    @_reports_faults
    def bind(
        self, fn: Function | NumbaKernel, config: LaunchConfig, args: list[Any] | tuple[Any, ...]
    ) -> BoundLaunch:
        """Check and pack a launch once; calling the result enqueues it with no further work."""
        return launch.bind(self._state, fn, config, args)

    def synchronize(self) -> None:
        """Wait for the stream; a kernel fault raises `KernelFault` and ends the session's use."""
        self._state.synchronize("session.synchronize")

    def capture(self, update: Graph | None = None) -> Capture:
        """``with s.capture() as cap:``: capture the block's work into ``cap.graph``.

        With ``update=graph``, the same work with other arguments updates that graph in place.
        """
        return graph.capture(self._state, update)

    # --- events, timing, caches -----------------------------------------------------------

    @_reports_faults
    def record_event(self, timing: bool = True) -> Event:
        """Record an event at the current tail of the session's stream."""
        return events.record_event(self._state, timing)

    @_reports_faults
    def wait(self, event: Event) -> None:
        """Order later work on this session's stream after ``event`` (no host block)."""
        events.wait_event(self._state, event)

    def timeline(self, max_launches: int = MAX_LAUNCHES) -> Timeline:
        """``with s.timeline() as t:``: time each launch of the block on the GPU."""
        return timeline.timeline(self._state, max_launches)

    def range(self, name: str, color: Any = None) -> Range:
        """``with s.range("step 3"):``: a range named ``name`` in the profiler (NVTX)."""
        return profiling.named_range(self._state, name, color)

    @_reports_faults
    def resource(
        self, key: Hashable, init: Callable[[Session], Any], kind: type | None = None
    ) -> Any:
        """The value cached under ``key`` for this session, made by ``init(session)`` once."""
        return resources.resource(self._state, key, init, kind)

    def __repr__(self) -> str:
        return info.session_repr(getattr(self, "_state", None))  # None: __init__ refused

    def _repr_html_(self) -> str:
        return info.session_html(getattr(self, "_state", None))


def state_of(session: Session) -> SessionState:
    """The state behind ``session``, for tenferro's own layers above it (ready kernels, torch).

    Users never need it: everything a user calls is a method of the Session.
    """
    return session._state


def from_dlpack(
    x: Any,
    *,
    session: Session | None = None,
    writable: bool = False,
    dtype: Any = None,
    allow_strided: bool = False,
) -> TensorRef | TensorMut:
    """A span over ``x`` taken through DLPack, even where ``x`` also has a CAI.

    Args:
        x: An object with ``__dlpack__`` (asked with the session's stream) or an unused DLPack
            capsule (consumed as it is: its producer must have finished writing it).
        session: The session to import into; by default this thread's innermost open one.
        writable: True for a `TensorMut` (a capsule flagged READ_ONLY is refused).
        dtype: The dtype ``x`` must have, or None.
        allow_strided: Admit non-compact strides.

    Returns:
        A `TensorRef`, or a `TensorMut` with ``writable``.

    Raises:
        RuntimeStateError: No session is given and none is open on this thread.
        ValidationError: ``x`` is refused as a span (named), or ``session`` is no Session.
    """
    op = "tenferro.from_dlpack"
    if session is None:
        session = scope.innermost()
        if session is None:
            raise RuntimeStateError(
                f"{op}: no tf.Session is open on this thread; call it inside "
                "`with tf.Session(...)` or pass session="
            )
    elif not isinstance(session, Session):
        raise ValidationError(f"{op}: session must be a tf.Session, got {type(session).__name__}")
    return span_import.from_dlpack(
        state_of(session), x, writable=writable, dtype=dtype, allow_strided=allow_strided
    )
