"""`Session`: one device's primary context and one stream, in a ``with`` block, on one thread.

Everything a session hands out (tensors' spans, modules, functions, events) is usable only on
the opening thread and only inside the block. Owners of the memory behind every enqueued
operation stay referenced by the session until the stream has passed it: a fence event is
recorded every `FENCE_EVERY` launches and retired when it completes, and `synchronize` (the only
host barrier) drops them all.
"""

from __future__ import annotations

import collections
import functools
import operator
import threading
from typing import Any

import numpy as np

from . import _driver
from . import tensor as tensor_ops
from ._liveness import Liveness
from .errors import KernelFault, RuntimeStateError, ValidationError
from .events import Event, record_event, wait_event
from .graph import Capture
from .interop import stream_value
from .interop.imports import import_span
from .launch import BoundLaunch, LaunchConfig, launch_checked, launchable
from .module import Function, Module, compile_module, load_cubin_module, load_ptx_module
from .numba_kernels import NumbaKernel, as_dispatcher, compile_for_session
from .resources import ResourceCache
from .spans import DeviceBytes, Span, TensorMut, TensorRef
from .tensor import Tensor

__all__ = ["FENCE_BYTES", "FENCE_EVERY", "Session", "from_dlpack"]

_local = threading.local()  # .open: this thread's open sessions, innermost last


_get_ident = threading.get_ident
_is = operator.is_
FENCE_EVERY = 256  # launches between liveness fences: bounds what a long loop keeps alive
FENCE_BYTES = 256 << 20  # bytes allocated between fences: bounds the memory held owners pin


def _reports_faults(method: Any) -> Any:
    """Wrap a Session method: a kernel fault its driver calls report stops the session."""
    @functools.wraps(method)
    def checked(self: Session, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except KernelFault as exc:
            raise self.fault_seen(exc) from None

    return checked


class Session:
    """A scoped device session: ``with tf.Session(device=0) as s: ...``.

    ``stream=None`` makes the session own a new non-blocking stream; a stream handle or an
    object with ``__cuda_stream__`` makes it work on that stream (not destroyed at the end).
    Opening raises `RuntimeStateError` with no driver or GPU. Every method refuses use from
    another thread and after the block; leaving the block synchronizes, even when it raised.
    """

    def __init__(self, device: int = 0, stream: Any = None) -> None:
        if not isinstance(device, int) or isinstance(device, bool) or device < 0:
            raise ValidationError(f"Session: {device=} must be an int >= 0")
        self.device = device
        self._external_stream = stream_value(stream, "stream", "Session", objects=True,
                                             handle=True)
        self._stream_owner = stream  # an object with __cuda_stream__ keeps its stream alive
        self._open = False
        self.stream = 0  # the stream's handle while open (stream_handle checks use first)
        self.thread: int | None = None
        self._modules: list[Module] = []
        self.liveness = Liveness(0, FENCE_EVERY, FENCE_BYTES)  # its stream is set on entry
        self.recent_launches: collections.deque[str] = collections.deque(maxlen=8)
        self.faulted = False
        self.fast_path_ok = False  # open, not faulted, not capturing: the launch fast path may run
        self._resources = ResourceCache()

    # --- scope ---------------------------------------------------------------------------

    def __enter__(self) -> Session:
        if self._open or self.thread is not None:
            raise RuntimeStateError("session.__enter__: a Session is entered once")
        self.context = _driver.PrimaryContext.get(self.device, "session")
        count = _driver.device_count()
        if self.device >= count:
            raise ValidationError(f"Session: device={self.device} but {count} device(s) visible")
        self._prev_ctx = self.context.make_current()
        try:
            if self._external_stream is None:
                self.stream = _driver.stream_create()
            else:
                self.stream = self._external_stream
                if self.stream > 2:  # 1 and 2 are the default streams of the current context
                    ctx = _driver.stream_context(self.stream)
                    if ctx != self.context.handle:
                        raise ValidationError(
                            f"Session: stream=0x{self.stream:x} belongs to another context "
                            f"(0x{ctx:x}), not device {self.device}'s primary context")
            self.import_event = _driver.event_create()
            self.export_event = _driver.event_create()  # used under interop.dlpack_export's lock
        except BaseException:
            if self._external_stream is None and self.stream:
                _driver.stream_destroy(self.stream)
            _driver.set_current(self._prev_ctx)
            raise
        self.liveness.stream = self.stream
        self.launcher = _driver.launcher()
        self.thread = threading.get_ident()
        self._open = True
        self.fast_path_ok = True
        if not hasattr(_local, "open"):
            _local.open = []
        _local.open.append(self)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            if not self.faulted:  # a faulted stream reports the same fault again; once is enough
                self.synchronize()
        except Exception as sync_exc:
            if exc is None:
                raise
            exc.add_note(f"tenferro: synchronizing at the end of the session also failed: "
                         f"{sync_exc}")
        finally:
            self._close()

    def _close(self) -> None:
        self._open = False
        opened = getattr(_local, "open", [])
        if self in opened:
            opened.remove(self)
        self.fast_path_ok = False
        self.liveness.close()
        self._stream_owner = None
        self._resources.clear()
        for ev in (self.import_event, self.export_event):
            try:
                _driver.event_destroy(ev)
            except Exception:
                pass
        for m in self._modules:
            try:
                m.unload()
            except Exception:
                pass
        self._modules.clear()
        try:
            if self._external_stream is None:
                _driver.stream_destroy(self.stream)
            # What the session freed goes back to the device; Tensors still held stay.
            self.context.trim_pool(0, "session.__exit__")
        except Exception:  # a context poisoned by a fault refuses; the process must restart
            if not self.faulted:
                raise
        finally:
            _driver.set_current(self._prev_ctx)

    @property
    def is_open(self) -> bool:
        """True inside the ``with`` block."""
        return self._open

    @property
    def stream_handle(self) -> int:
        """The session's stream as an int handle (to give another library)."""
        self.check_use("session.stream_handle")
        return self.stream

    def refuse_in_capture(self, op: str, why: str) -> None:
        """Raise `RuntimeStateError` naming ``op`` and ``why`` while a capture runs."""
        if self.liveness.capturing:
            raise RuntimeStateError(f"{op}: not allowed during s.capture(): {why}")

    def check_use(self, op: str) -> None:
        """Refuse use (naming ``op``) when closed, from another thread, or after a fault."""
        if not self._open:
            raise RuntimeStateError(f"{op}: the session is closed (used outside its with block)")
        if threading.get_ident() != self.thread:
            raise RuntimeStateError(f"{op}: the session belongs to the thread that opened it; "
                                    "open a Session on this thread instead")
        if self.faulted:
            raise KernelFault(f"{op}: an earlier kernel fault made this session unusable",
                              launches=tuple(self.recent_launches))

    def refresh_fast_path(self) -> None:
        """Let `launch` take its fast path only while open, not faulted and not capturing."""
        self.fast_path_ok = self._open and not self.faulted and not self.liveness.capturing

    def fault_seen(self, exc: KernelFault) -> KernelFault:
        """Record that a driver call of this session reported a kernel fault; what to raise.

        A fault is sticky in the device's context, so whichever call sees it first (a
        synchronize, a copy, a launch, an allocation, an event query) stops the session: the
        exception returned names the last launches, and every later use is refused. Leaving the
        ``with`` block does not raise it a second time. Tenferro's parts call this for faults
        their own driver calls report.
        """
        if self.faulted:  # already reported; this is a refusal of the dead session
            return exc
        self.faulted = True
        self.fast_path_ok = False
        last = tuple(self.recent_launches)
        return KernelFault(f"{exc}; last launches: {list(last)}", exc.result_name,
                           exc.result_code, last)

    # --- liveness ------------------------------------------------------------------------

    @_reports_faults
    def retain(self, obj: Any) -> Any:
        """Keep ``obj`` alive until the session closes; returns it."""
        self.check_use("session.retain")
        self.liveness.retain(obj)
        return obj

    # --- memory (tenferro.tensor) ----------------------------------------------------------

    @_reports_faults
    def memory_stats(self) -> dict[str, int]:
        """Reserved and used bytes of tenferro's memory pool on this device (`tenferro.tensor`)."""
        return tensor_ops.memory_stats(self)

    @_reports_faults
    def trim_memory(self, keep_bytes: int = 0) -> None:
        """Give the device back what the pool holds unused, keeping at least ``keep_bytes``."""
        tensor_ops.trim_memory(self, keep_bytes)

    @_reports_faults
    def alloc_output(self, shape: Any, dtype: Any) -> Tensor:
        """An uninitialised Tensor, for a kernel to write every element of."""
        return tensor_ops.alloc_output(self, shape, dtype)

    @_reports_faults
    def alloc_zeros(self, shape: Any, dtype: Any) -> Tensor:
        """A zero-filled Tensor."""
        return tensor_ops.alloc_zeros(self, shape, dtype)

    @_reports_faults
    def alloc_bytes(self, nbytes: int) -> DeviceBytes:
        """An untyped, exclusive device workspace of ``nbytes`` bytes."""
        return tensor_ops.alloc_bytes(self, nbytes)

    @_reports_faults
    def upload(self, array: np.ndarray) -> Tensor:
        """Copy a host array into a new Tensor of the same dtype and shape (stream-ordered)."""
        return tensor_ops.upload(self, array)

    @_reports_faults
    def download(self, x: Any) -> np.ndarray:
        """Copy a Tensor, span or device array to a new numpy array; waits for the stream."""
        return tensor_ops.download(self, x)

    @_reports_faults
    def copy(self, dst: Any, src: Any) -> None:
        """Copy ``src`` into ``dst`` on the stream, device to device: `tensor.copy`."""
        tensor_ops.copy(self, dst, src)

    @_reports_faults
    def copy_peer(self, dst: Any, src: Any) -> None:
        """Copy memory of another session (any device) into ``dst``: `tensor.copy_peer`."""
        tensor_ops.copy_peer(self, dst, src)

    # --- spans ---------------------------------------------------------------------------

    def tensor(self, x: Any, dtype: Any = None, *, allow_strided: bool = False) -> TensorRef:
        """A read-only span over a Tensor or a CUDA Array Interface / DLPack device array."""
        return import_span(self, x, TensorRef, dtype, allow_strided, "session.tensor")

    def tensor_mut(self, x: Any, dtype: Any = None, *, allow_strided: bool = False) -> TensorMut:
        """An exclusive, writable span; refuses producers that marked their array read-only."""
        return import_span(self, x, TensorMut, dtype, allow_strided, "session.tensor_mut")

    def from_dlpack(self, x: Any, *, writable: bool = False, dtype: Any = None,
                    allow_strided: bool = False) -> TensorRef | TensorMut:
        """A span over ``x`` taken through DLPack even where x also has a CUDA Array Interface.

        ``x`` is an object with ``__dlpack__`` (asked with this session's stream, so the
        producer orders itself before it) or an unused DLPack capsule (consumed as it is: its
        producer must have finished writing it). ``writable=True`` gives a TensorMut and
        refuses a capsule flagged READ_ONLY.
        """
        cls = TensorMut if writable else TensorRef
        return import_span(self, x, cls, dtype, allow_strided, "session.from_dlpack", dlpack=True)

    def readonly(self, span: Span) -> TensorRef:
        """A read-only view of a span or Tensor of this session."""
        return import_span(self, span, TensorRef, None, True, "session.readonly")

    # --- modules and launches ------------------------------------------------------------

    def _add_module(self, m: Module) -> Module:
        self._modules.append(m)  # unloaded when the session closes
        return m

    @_reports_faults
    def compile(self, source: str, options: Any = None, name_expressions: Any = None,
                arch: str | None = None) -> Module:
        """Compile CUDA C for this device (NVRTC, disk-cached) and load it (`module`)."""
        return self._add_module(compile_module(self, source, options, name_expressions, arch))

    @_reports_faults
    def load_ptx(self, text: str | bytes) -> Module:
        """Load PTX text; its ``.entry`` parameter lists become the functions' signatures."""
        return self._add_module(load_ptx_module(self, text))

    @_reports_faults
    def load_cubin(self, image: bytes) -> Module:
        """Load a CUBIN; parameter sizes come from the driver (see `module.load_cubin_module`)."""
        return self._add_module(load_cubin_module(self, image))

    @_reports_faults
    def numba_kernel(self, kernel: Any, signature: Any = None) -> Function | NumbaKernel:
        """A numba-cuda kernel for this session, launched by `launch` like any Function.

        ``kernel`` is a ``@cuda.jit`` dispatcher or a plain Python function. With a numba
        ``signature`` (``"void(float32[::1], float32[:], float32)"``) it compiles now and returns
        a Function; without one it returns a `NumbaKernel` that `launch` specializes on the
        arguments' dtypes, ndim and layout (compiled once per combination).
        """
        op = "session.numba_kernel"
        self.check_use(op)
        dispatcher, name = as_dispatcher(kernel, op)
        if signature is None:
            return NumbaKernel(self, dispatcher, name)
        return compile_for_session(self, dispatcher, signature, name, op)

    def launch(self, fn: Function | NumbaKernel, config: LaunchConfig,
               args: list | tuple) -> None:
        """Check and enqueue one launch on the session's stream; only enqueues.

        Every check of the design runs, but what has been checked is not checked twice: the
        config is remembered per Function, and arguments that are the very objects of the
        Function's previous launch are already checked and packed (and are held by it until
        they are replaced, when the session holds them until the stream passes, or the next
        synchronize).
        """
        try:
            if fn.__class__ is not Function or fn.session is not self or \
                    config is not fn.last_config or not self.fast_path_ok or \
                    _get_ident() != self.thread:
                launch_checked(self, fn, config, args)
                return
            param_block = fn.param_block
            prev = param_block.last_args
            if len(args) != len(prev) or not all(map(_is, args, prev)):
                if not isinstance(args, (list, tuple)):
                    raise TypeError  # named below, with the refusal of len() of a non-sequence
                replaced = param_block.last_spans
                param_block.pack(args, self, "session.launch")
                if replaced:  # the previous launch may still be running: hold what it used
                    self.liveness.hold(replaced)
            err = self.launcher(fn.record_address)
            if err:
                _driver.raise_launch_error(err, "session.launch")
            self.recent_launches.append(fn.name)
        except KernelFault as exc:  # no cost unless raised: a fence query or the launch saw it
            raise self.fault_seen(exc) from None
        except TypeError:  # no cost unless raised: args that are not a list or tuple
            if not isinstance(args, (list, tuple)):
                raise ValidationError(f"session.launch: args must be a list or tuple of kernel "
                                      f"arguments, got {type(args).__name__}") from None
            raise

    @_reports_faults
    def bind(self, fn: Function | NumbaKernel, config: LaunchConfig,
             args: list | tuple) -> BoundLaunch:
        """Check and pack a launch once; calling the result enqueues it with no further work.

        Every refusal of `launch` happens here instead. A NumbaKernel is specialized on
        ``args`` now.
        """
        op = "session.bind"
        fn = launchable(self, fn, config, args, op)
        return BoundLaunch(self, fn, config, args, op)

    def capture(self) -> Capture:
        """``with s.capture() as cap: ...``: capture the block's work; then ``cap.graph``.

        ``cap.graph`` is a `Graph` to replay with ``graph.launch()``, or None when the block
        enqueued nothing. See `tenferro.graph` for what is refused during a capture.
        """
        return Capture(self)

    # --- events and barriers -------------------------------------------------------------

    @_reports_faults
    def record_event(self, timing: bool = True) -> Event:
        """Record an event at the current tail of the session's stream."""
        return record_event(self, timing)

    @_reports_faults
    def wait(self, event: Event) -> None:
        """Order later work on this session's stream after ``event`` (no host block)."""
        wait_event(self, event)

    def synchronize(self) -> None:
        """Wait for the stream; a kernel fault raises `KernelFault` and ends the session's use."""
        op = "session.synchronize"
        if not self._open:  # the stream is destroyed at the end of the block
            raise RuntimeStateError(f"{op}: the session is closed (used outside its with block)")
        if threading.get_ident() != self.thread:
            raise RuntimeStateError(f"{op}: the session belongs to the thread that opened it")
        self.refuse_in_capture(op, "a capturing stream cannot be waited for")
        try:
            _driver.stream_synchronize(self.stream, op)
        except KernelFault as exc:
            raise self.fault_seen(exc) from None
        self.liveness.release_all()

    # --- resources -----------------------------------------------------------------------

    @_reports_faults
    def resource(self, key: Any, init: Any, kind: type | None = None) -> Any:
        """The value cached under ``key`` for this session, made by ``init(session)`` once.

        ``kind``, when given, is the type the value must have; asking for a key with another
        kind than the one it was made with is a `ValidationError`. The cache is bounded
        (least recently used entries go first) and dies with the session.
        """
        self.check_use("session.resource")
        return self._resources.get(key, lambda: init(self), kind, "session.resource")


def from_dlpack(x: Any, *, session: Session | None = None, writable: bool = False,
                dtype: Any = None, allow_strided: bool = False) -> TensorRef | TensorMut:
    """A span over ``x`` through DLPack: `Session.from_dlpack` of ``session``.

    ``session`` defaults to this thread's innermost open session; with none open it raises
    `RuntimeStateError`.
    """
    op = "tenferro.from_dlpack"
    if session is None:
        opened = getattr(_local, "open", None)
        if not opened:
            raise RuntimeStateError(f"{op}: no tf.Session is open on this thread; call it inside "
                                    "`with tf.Session(...)` or pass session=")
        session = opened[-1]
    elif not isinstance(session, Session):
        raise ValidationError(f"{op}: session must be a tf.Session, got "
                              f"{type(session).__name__}")
    return session.from_dlpack(x, writable=writable, dtype=dtype, allow_strided=allow_strided)
