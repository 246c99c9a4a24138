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
import types
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
        # The calls of every launch go straight to their parts, one Python call less: methods
        # of the state (bound as a method is, which Python calls faster than a partial) shadow
        # the documented methods below, with their arguments, behaviour and docstrings.
        for name, part in _hot_parts().items():
            setattr(self, name, types.MethodType(part, self._state))

    def __enter__(self) -> Session:
        self._state.open()
        self.context = self._state.context
        scope.entered(self)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        st = self._state
        try:
            # A faulted stream reports the same fault again; a forked child's is the parent's.
            if not st.faulted and not st.forked:
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

        Args:
            device: The CUDA device ordinal.
            stream: None for a new blocking stream the session owns, or a stream handle or an
                object with ``__cuda_stream__`` to work on (not destroyed at the end).

        Returns:
            The open Session, used from this thread only.

        Raises:
            ValidationError: ``device`` or ``stream`` is not a valid value, or the stream
                belongs to another context than the device's primary context.
            RuntimeStateError: No CUDA driver or GPU, or no device ``device``.
            BackendError: The driver refused to set up the context or the stream.
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

        A foreign producer's stream is ordered before the session's next kernel with an
        event (none where the two streams are ordered already); the host never waits.

        Args:
            x: A tf.Tensor, a span of this session, or a device array of this session's
                device with ``__dlpack__`` or ``__cuda_array_interface__``.
            dtype: The dtype ``x`` must have (a numpy dtype), or None for any.
            allow_strided: Admit non-compact strides (whole elements, inside the address
                space), for kernels that take strides.

        Returns:
            A `TensorRef` over ``x``, which keeps ``x`` alive while it is held.

        Raises:
            ValidationError: ``x`` is refused: host memory, another device, a span of another
                session, not ``dtype``, non-compact strides without ``allow_strided``, a
                data pointer not aligned to its elements.
            RuntimeStateError: The session is closed or used from another thread; or, during
                a capture, ``x``'s producer would need an event or a DLPack export.
            KernelFault: A kernel fault has stopped the session.
        """
        return _read_span(self._state, x, dtype, allow_strided=allow_strided)

    def tensor_mut(self, x: Any, dtype: Any = None, *, allow_strided: bool = False) -> TensorMut:
        """An exclusive, writable span; refuses producers that marked their array read-only.

        Ordered after ``x``'s producer as `tensor` is. Within one launch a writable span may
        overlap no other span.

        Args:
            x: A tf.Tensor, a `TensorMut` or `DeviceBytes` of this session, or a device array
                of this session's device with ``__dlpack__`` or ``__cuda_array_interface__``.
            dtype: The dtype ``x`` must have (a numpy dtype), or None for any.
            allow_strided: Admit non-compact strides (whole elements, no zero stride).

        Returns:
            A `TensorMut` over ``x`` (a `DeviceBytes` stays `DeviceBytes`).

        Raises:
            ValidationError: ``x`` is refused as by `tensor`, or is read-only (a `TensorRef`,
                or an array its producer marked read-only), or is a broadcast view (a zero
                stride).
            RuntimeStateError: The session is closed or used from another thread; or, during
                a capture, ``x``'s producer would need an event or a DLPack export.
            KernelFault: A kernel fault has stopped the session.
        """
        return _write_span(self._state, x, dtype, allow_strided=allow_strided)

    @_reports_faults
    def alloc_output(self, shape: int | tuple[int, ...], dtype: Any) -> Tensor:
        """An uninitialised Tensor, for a kernel to write every element of.

        Allocated from tenferro's pool on the session's stream (stream-ordered, no sync).

        Args:
            shape: An int or a tuple of ints >= 0; the Tensor is C-contiguous.
            dtype: A numpy dtype, or what ``np.dtype`` accepts (``np.float32``), of a type
                the device supports.

        Returns:
            A new `Tensor` of this session, its contents undefined.

        Raises:
            ValidationError: ``shape`` is not an int or a tuple of ints >= 0, or ``dtype``
                is not a dtype the device supports.
            RuntimeStateError: The session is closed, used from another thread, or
                capturing (the memory would belong to the graph).
            BackendError: The driver refused the allocation (out of memory).
            KernelFault: A kernel fault has stopped the session.
        """
        return memory.alloc_output(self._state, shape, dtype)

    @_reports_faults
    def alloc_zeros(self, shape: int | tuple[int, ...], dtype: Any) -> Tensor:
        """A zero-filled Tensor.

        Allocated and zeroed on the session's stream (stream-ordered, no sync).

        Args:
            shape: An int or a tuple of ints >= 0; the Tensor is C-contiguous.
            dtype: A numpy dtype, or what ``np.dtype`` accepts (``np.float32``), of a type
                the device supports.

        Returns:
            A new `Tensor` of this session, every byte zero.

        Raises:
            ValidationError: ``shape`` is not an int or a tuple of ints >= 0, or ``dtype``
                is not a dtype the device supports.
            RuntimeStateError: The session is closed, used from another thread, or
                capturing (the memory would belong to the graph).
            BackendError: The driver refused the allocation (out of memory) or the memset.
            KernelFault: A kernel fault has stopped the session.
        """
        return memory.alloc_zeros(self._state, shape, dtype)

    @_reports_faults
    def alloc_bytes(self, nbytes: int) -> DeviceBytes:
        """An untyped, exclusive device workspace of ``nbytes`` bytes.

        Uninitialised, allocated on the session's stream; it passes where a kernel takes any
        pointer, and `copy` takes it on either side whatever the other's dtype.

        Args:
            nbytes: The size in bytes, an int >= 0.

        Returns:
            A new `DeviceBytes`, writable, owning its memory.

        Raises:
            ValidationError: ``nbytes`` is not an int >= 0.
            RuntimeStateError: The session is closed, used from another thread, or
                capturing (the memory would belong to the graph).
            BackendError: The driver refused the allocation (out of memory).
            KernelFault: A kernel fault has stopped the session.
        """
        return memory.alloc_bytes(self._state, nbytes)

    @_reports_faults
    def upload(self, array: np.ndarray) -> Tensor:
        """Copy a host array into a new Tensor of the same dtype and shape (stream-ordered).

        Returns without waiting for the copy; ``array`` is held until the stream has passed
        it, so it may be dropped at once (writing to it before then is a race).

        Args:
            array: A numpy array of a dtype the device supports; any strides (a
                non-contiguous one is made contiguous first).

        Returns:
            A new C-contiguous `Tensor` of this session.

        Raises:
            ValidationError: ``array`` is not a numpy array, or its dtype is not one the
                device supports.
            RuntimeStateError: The session is closed, used from another thread, or
                capturing (host copies cannot be captured).
            BackendError: The driver refused the allocation (out of memory) or the copy.
            KernelFault: A kernel fault has stopped the session.
        """
        return memory.upload(self._state, array)

    @_reports_faults
    def download(self, x: Any) -> np.ndarray:
        """Copy a Tensor, span or device array to a new numpy array; waits for the stream.

        Strided spans come back with their logical shape, C-contiguous. bf16 comes back as
        ``ml_dtypes.bfloat16`` where that is installed, else as its uint16 bits.

        Args:
            x: A tf.Tensor, a span of this session, or anything `tensor` accepts (strided
                views included).

        Returns:
            A new numpy array of ``x``'s shape and dtype.

        Raises:
            ValidationError: ``x`` is refused as a span (see `tensor`).
            RuntimeStateError: The session is closed, used from another thread, or
                capturing (a download waits for the stream).
            BackendError: The driver refused the copy.
            KernelFault: A kernel faulted before the copy completed (or earlier); the
                session is stopped.
        """
        return memory.download(self._state, x)

    @_reports_faults
    def copy(self, dst: Any, src: Any) -> None:
        """Copy ``src`` into ``dst`` on the stream (device to device, same sizes and dtypes).

        Only enqueues; both sides are held until the stream has passed the copy.

        Args:
            dst: A tf.Tensor or anything `tensor_mut` accepts, compact, of ``src``'s size.
            src: A tf.Tensor or anything `tensor` accepts, compact.

        Raises:
            ValidationError: The byte sizes differ, the dtypes differ (and neither side is
                `DeviceBytes`), either side is refused as a span (non-compact, another
                device, ``dst`` read-only), or the two overlap in memory.
            RuntimeStateError: The session is closed or used from another thread; or, during
                a capture, a foreign side's producer would need an event.
            BackendError: The driver refused the copy.
            KernelFault: A kernel fault has stopped the session.
        """
        memory.copy(self._state, dst, src)

    @_reports_faults
    def memset(self, dst: Any, value: int = 0) -> None:
        """Set every byte of ``dst`` to ``value`` (0 to 255) on the stream.

        Only enqueues. The same byte goes to every element: ``value=0`` zeroes any type,
        ``value=0xFF`` sets every bit.

        Args:
            dst: Writable, compact memory of this session: a tf.Tensor, or anything
                `tensor_mut` accepts.
            value: The byte, an int from 0 to 255.

        Raises:
            ValidationError: ``value`` is not an int from 0 to 255, or ``dst`` is refused as
                a writable span (read-only, non-compact, another device).
            RuntimeStateError: The session is closed or used from another thread; or, during
                a capture, ``dst``'s producer would need an event.
            BackendError: The driver refused the memset.
            KernelFault: A kernel fault has stopped the session.
        """
        memory.memset(self._state, dst, value)

    @_reports_faults
    def copy_peer(self, dst: Any, src: Any) -> None:
        """Copy ``src``, memory of another session (any device), into ``dst`` of this one.

        Runs on this session's stream, ordered after ``src``'s session stream with an event
        (no host sync); peer access is enabled where the hardware allows it, and the driver
        stages the copy where it does not. A later write to ``src`` from its own session must
        wait for this copy: ``other.wait(s.record_event())``.

        Args:
            dst: Writable, compact memory of this session (anything `tensor_mut` accepts), of
                ``src``'s size and dtype.
            src: A tf.Tensor or a compact span of another session, on this device or another.

        Raises:
            ValidationError: ``src`` is not a Tensor or span of another session, is
                non-compact, or differs from ``dst`` in size or dtype; or ``dst`` is refused
                as a writable span.
            RuntimeStateError: The session is closed, used from another thread, or
                capturing; or ``src``'s session was stopped by a kernel fault.
            BackendError: The driver refused the event, peer access or the copy.
            KernelFault: A kernel fault has stopped the session.
        """
        memory.copy_peer(self._state, dst, src)

    @_reports_faults
    def memory_stats(self) -> dict[str, int]:
        """Bytes of tenferro's memory pool on this device, reserved and used, and their peaks.

        Freed Tensors stay reserved for reuse until `trim_memory` or the end of the session;
        the blocks of freed small Tensors (at most 512 of 256 bytes) count as used until then.

        Returns:
            ``{"reserved_bytes", "used_bytes", "reserved_bytes_high", "used_bytes_high"}``:
                reserved from the device and handed out now, and their peaks.

        Raises:
            RuntimeStateError: The session is closed or used from another thread.
            BackendError: The driver refused the pool query.
            KernelFault: A kernel fault has stopped the session.
        """
        return memory.memory_stats(self._state)

    @_reports_faults
    def trim_memory(self, keep_bytes: int = 0) -> None:
        """Give the device back what the pool holds unused, keeping at least ``keep_bytes``.

        Args:
            keep_bytes: The bytes the pool may keep reserved, an int >= 0.

        Raises:
            ValidationError: ``keep_bytes`` is not an int >= 0.
            RuntimeStateError: The session is closed or used from another thread.
            BackendError: The driver refused the trim.
            KernelFault: A kernel fault has stopped the session.
        """
        memory.trim_memory(self._state, keep_bytes)

    def retain(self, obj: Any) -> Any:
        """Keep ``obj`` alive until the session closes; returns it.

        Args:
            obj: Any object, such as the owner of memory that work in flight reads.

        Returns:
            ``obj`` itself.

        Raises:
            RuntimeStateError: The session is closed or used from another thread.
            KernelFault: A kernel fault has stopped the session.
        """
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
        """Compile CUDA C (a string or a file's path) with NVRTC and load it (disk-cached).

        Compiled to CUBIN for this device's architecture (`compile_cuda`); the module stays
        loaded until the session closes.

        Args:
            source: CUDA C text, or a kernel file's path (`pathlib.Path`): compiled under the
                file's name, its folder searched for the headers it includes.
            options: NVRTC options (a str or a list of str), such as ``["-I/path"]``; not
                ``-arch``.
            name_expressions: C++ names to instantiate and look up (``"axpy<float>"``), a
                str or a list of str; `Module.function` then finds each by this name.
            arch: None for the device's own ``sm_NN``, or that architecture with its ``a``
                or ``f`` suffix (``"sm_90a"`` for wgmma).

        Returns:
            The loaded `Module`; ``compile_log`` holds NVRTC's warnings.

        Raises:
            ValidationError: ``source``, ``options`` or ``name_expressions`` are refused (see
                `compile_cuda`), or ``arch`` is not this device's architecture.
            CompileError: NVRTC refused the source; the exception carries its log.
            RuntimeStateError: The session is closed or used from another thread, or NVRTC
                is not installed.
            BackendError: The driver refused to load the image.
            KernelFault: A kernel fault has stopped the session.
        """
        return module.compile_module(self._state, source, options, name_expressions, arch)

    @_reports_faults
    def load_ptx(self, text: str | bytes) -> Module:
        """Load a PTX module; its kernels' parameters come from their ``.entry`` lines.

        The driver JIT-compiles the PTX for the device; the module stays loaded until the
        session closes.

        Args:
            text: The PTX text, as str or UTF-8 bytes (a trailing NUL is allowed).

        Returns:
            The loaded `Module`.

        Raises:
            ValidationError: ``text`` is not str or bytes, not UTF-8, has an inner NUL, has
                no ``.entry``, or declares a parameter type tenferro does not know.
            RuntimeStateError: The session is closed or used from another thread.
            BackendError: The driver refused the PTX (as ``CUDA_ERROR_UNSUPPORTED_PTX_VERSION``
                where its ISA version is newer than the driver).
            KernelFault: A kernel fault has stopped the session.
        """
        return module.load_ptx_module(self._state, text)

    @_reports_faults
    def load_cubin(self, image: bytes) -> Module:
        """Load a CUBIN image; its kernels' parameters come from the driver (sizes only).

        A CUBIN says only each parameter's size, so any 8-byte argument fits an 8-byte
        slot: prefer `compile` or `load_ptx` where the types should be checked.

        Args:
            image: The CUBIN, as bytes, bytearray or memoryview.

        Returns:
            The loaded `Module`.

        Raises:
            ValidationError: ``image`` is not bytes-like.
            RuntimeStateError: The session is closed or used from another thread.
            BackendError: The driver refused the image (another architecture, corrupt).
            KernelFault: A kernel fault has stopped the session.
        """
        return module.load_cubin_module(self._state, image)

    @_reports_faults
    def numba_kernel(self, kernel: Any, signature: Any = None) -> NumbaKernel | Function:
        """A ``@cuda.jit`` kernel (or a plain function) for this session's device.

        A Function when ``signature`` is given (compiled now), else a kernel specialized to
        the arguments of each launch. numba's own errors (a kernel it cannot type) propagate
        as numba raises them.

        Args:
            kernel: A ``@cuda.jit`` dispatcher (not ``device=True`` nor ``debug=True``), or a
                plain Python function to jit.
            signature: A numba signature (``"void(float32[::1], float32[:], float32)"``),
                or None to specialize on each launch's dtypes, ndim and layout (compiled
                once per combination).

        Returns:
            A `Function` with ``signature``, else a `NumbaKernel`; `launch` takes either.

        Raises:
            ValidationError: ``kernel`` is neither a kernel dispatcher nor a function,
                ``signature`` is not a numba signature, or the compiled kernel takes
                arguments tenferro does not pack or depends on its launch configuration.
            RuntimeStateError: The session is closed or used from another thread.
            KernelFault: A kernel fault has stopped the session.
        """
        return numba_kernels.numba_kernel(self._state, kernel, signature)

    def launch(
        self, fn: Function | NumbaKernel, config: LaunchConfig, args: list[Any] | tuple[Any, ...]
    ) -> None:
        """Check every argument against the kernel's parameters and enqueue; only enqueues.

        Nothing is checked twice: a Function remembers its last config, and arguments that
        are the very objects of its previous launch are already checked and packed. The
        spans are held until the stream has passed the launch.

        Args:
            fn: A `Function` of this session, or a `NumbaKernel` (specialized on ``args``).
            config: The `LaunchConfig`, checked against the kernel and the device.
            args: A list or tuple with one entry a kernel parameter: spans (`tensor`,
                `tensor_mut`), `KernelArg`s and typed scalars (``tf.u32(n)``), numpy
                scalars, or Python numbers where the parameter's type is known.

        Raises:
            ValidationError: An argument, the config or the function is refused (named): a
                wrong count or type, a span of another session, a `TensorRef` where the
                kernel writes, overlapping writable spans, a block or shared memory past the
                kernel's or device's limits.
            RuntimeStateError: The session is closed or used from another thread.
            BackendError: The driver refused the launch.
            KernelFault: An earlier kernel's fault, which stops the session.
        """
        _launch(self._state, fn, config, args)

    @_reports_faults
    def bind(
        self, fn: Function | NumbaKernel, config: LaunchConfig, args: list[Any] | tuple[Any, ...]
    ) -> BoundLaunch:
        """Check and pack a launch once; calling the result enqueues it with no further work.

        Args:
            fn: A `Function` of this session, or a `NumbaKernel` (specialized on ``args``).
            config: The `LaunchConfig`, checked against the kernel and the device.
            args: The kernel's arguments, as `launch` takes them.

        Returns:
            A `BoundLaunch`: ``bound()`` enqueues it, ``bound.update(i, arg)`` replaces one
                argument.

        Raises:
            ValidationError: An argument, the config or the function is refused, as by
                `launch`.
            RuntimeStateError: The session is closed or used from another thread.
            KernelFault: A kernel fault has stopped the session.
        """
        return launch.bind(self._state, fn, config, args)

    def synchronize(self) -> None:
        """Wait for the stream; a kernel fault raises `KernelFault` and ends the session's use.

        Raises:
            RuntimeStateError: The session is closed, used from another thread, or
                capturing (a capturing stream cannot be waited for).
            BackendError: The driver refused the synchronization.
            KernelFault: A kernel faulted; the session is stopped.
        """
        self._state.synchronize("session.synchronize")

    def capture(self, update: Graph | None = None) -> Capture:
        """``with s.capture() as cap:``: capture the block's work into ``cap.graph``.

        With ``update=graph``, the same work with other arguments updates that graph in place.
        During the block the session refuses allocations, host copies, synchronization,
        events and imports that need an event on another stream.

        Args:
            update: None for a new graph, or a `Graph` of this session to update in place
                with the block's work (the same kernels in the same order).

        Returns:
            A `Capture`; after the block ``cap.graph`` is the `Graph` (``update`` itself when
                given), or None when nothing was enqueued.

        Raises:
            ValidationError: ``update`` is not a Graph of this session; on leaving the block,
                the work is not the same as ``update``'s.
            RuntimeStateError: On entering: the session is closed or used from another
                thread, a capture is already running, or a timeline is open.
            BackendError: The driver refused to begin or end the capture (also when work on
                the legacy default stream invalidated it).
            KernelFault: A kernel fault has stopped the session.
        """
        return graph.capture(self._state, update)

    # --- events, timing, caches -----------------------------------------------------------

    @_reports_faults
    def record_event(self, timing: bool = True) -> Event:
        """Record an event at the current tail of the session's stream.

        Args:
            timing: True for an event `Event.elapsed_ms` can time; False for a lighter one
                that only orders (`wait`) or is queried.

        Returns:
            The recorded `Event`, usable while the session is open.

        Raises:
            RuntimeStateError: The session is closed, used from another thread, or
                capturing (events are not captured).
            BackendError: The driver refused to make or record the event.
            KernelFault: A kernel fault has stopped the session.
        """
        return events.record_event(self._state, timing)

    @_reports_faults
    def wait(self, event: Event) -> None:
        """Order later work on this session's stream after ``event`` (no host block).

        Args:
            event: An `Event` of any open session (on any device), such as another
                session's ``record_event()``.

        Raises:
            ValidationError: ``event`` is not an Event.
            RuntimeStateError: The session is closed, used from another thread, or
                capturing; or ``event``'s session is closed.
            BackendError: The driver refused the wait.
            KernelFault: A kernel fault has stopped the session.
        """
        events.wait_event(self._state, event)

    def timeline(self, max_launches: int = MAX_LAUNCHES) -> Timeline:
        """``with s.timeline() as t:``: time each launch of the block on the GPU.

        Leaving the block waits for the stream and reads the times: ``t.launches``,
        ``t.by_kernel()``, and a table with a bar plot in a notebook.

        Args:
            max_launches: The most launches timed (two events each); later ones run
                untimed and are counted in ``t.untimed``.

        Returns:
            A `Timeline` to enter once.

        Raises:
            ValidationError: ``max_launches`` is not an int >= 1.
            RuntimeStateError: On entering: the session is closed, used from another
                thread or capturing, a timeline is already open on it, or this one was
                entered before.
        """
        return timeline.timeline(self._state, max_launches)

    def range(self, name: str, color: Any = None) -> Range:
        """``with s.range("step 3"):``: a range named ``name`` in the profiler (NVTX).

        Recorded in the "tenferro" domain through the ``nvtx`` package (``pip install
        "tenferro[profile]"``); without it the range is checked the same and records nothing.

        Args:
            name: The range's name, a non-empty str.
            color: None (nvtx's default), 0xRRGGBB, or a color name nvtx knows.

        Returns:
            A `Range` to enter once.

        Raises:
            ValidationError: ``name`` is not a non-empty str, ``color`` is not a color; on
                entering, the range was entered before.
            RuntimeStateError: On entering: the session is closed or used from another
                thread.
        """
        return profiling.named_range(self._state, name, color)

    @_reports_faults
    def resource(
        self, key: Hashable, init: Callable[[Session], Any], kind: type | None = None
    ) -> Any:
        """The value cached under ``key`` for this session, made by ``init(session)`` once.

        The cache is bounded (least recently used entries go first) and dies with the
        session.

        Args:
            key: A hashable key; namespace it (``("mylib", ...)``) to keep clear of others'.
            init: Called with this session on the first request for ``key``; what it returns
                is cached.
            kind: The type the value must have, or None.

        Returns:
            The cached value.

        Raises:
            ValidationError: ``key`` is not hashable, ``kind`` is not a type, ``init``
                returned another type than ``kind``, or ``key`` was made with another kind.
            RuntimeStateError: The session is closed or used from another thread.
            KernelFault: A kernel fault has stopped the session.
        """
        return resources.resource(self._state, key, init, kind)

    def __repr__(self) -> str:
        return info.session_repr(getattr(self, "_state", None))  # None: __init__ refused

    def _repr_html_(self) -> str:
        return info.session_html(getattr(self, "_state", None))


@functools.cache
def _hot_parts() -> dict[str, types.FunctionType]:
    """The parts behind ``s.tensor``, ``s.tensor_mut`` and ``s.launch``.

    Copies of the parts' functions (the same code) that carry the documented methods'
    docstrings, for ``help(s.launch)``.
    """
    parts = {}
    for name, part in (("tensor", _read_span), ("tensor_mut", _write_span), ("launch", _launch)):
        copy = types.FunctionType(
            part.__code__, part.__globals__, part.__name__, part.__defaults__, part.__closure__
        )
        copy.__kwdefaults__ = part.__kwdefaults__
        copy.__annotations__ = part.__annotations__
        copy.__doc__ = getattr(Session, name).__doc__
        copy.__qualname__ = f"Session.{name}"
        parts[name] = copy
    return parts


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
