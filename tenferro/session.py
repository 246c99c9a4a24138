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

from . import _driver, dtypes
from ._liveness import Liveness
from .errors import KernelFault, RuntimeStateError, ValidationError
from .events import Event
from .graph import Capture
from .interop import check_memory, order_after, read_foreign, stream_value
from .launch import BoundLaunch, LaunchConfig, check_against
from .module import Function, Module, compile_cuda
from .numba_kernels import NumbaKernel, as_dispatcher, compile_for_session
from .resources import ResourceCache
from .signature import parse_ptx
from .spans import DeviceBytes, Span, TensorMut, TensorRef, overlaps
from .tensor import Tensor

__all__ = ["FENCE_BYTES", "FENCE_EVERY", "Session", "from_dlpack"]

_local = threading.local()  # .open: this thread's open sessions, innermost last


_get_ident = threading.get_ident
_is = operator.is_
_ADDRESS_END = 1 << 64
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


def _shape_arg(shape: Any, op: str) -> tuple[int, ...]:
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


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


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
        self._external_stream = stream_value(stream, "stream", "Session", objects=True)
        self._stream_owner = stream  # an object with __cuda_stream__ keeps its stream alive
        self._open = False
        self._thread: int | None = None
        self._modules: list[Module] = []
        self.liveness = Liveness(0, FENCE_EVERY, FENCE_BYTES)  # its stream is set on entry
        self._last: collections.deque[str] = collections.deque(maxlen=8)
        self._faulted = False
        self._fast = False  # open, not faulted, not capturing: the launch fast path may run
        self._resources = ResourceCache()

    # --- scope ---------------------------------------------------------------------------

    def __enter__(self) -> Session:
        if self._open or self._thread is not None:
            raise RuntimeStateError("session.__enter__: a Session is entered once")
        self.context = _driver.PrimaryContext.get(self.device, "session")
        count = _driver.device_count()
        if self.device >= count:
            raise ValidationError(f"Session: device={self.device} but {count} device(s) visible")
        self._prev_ctx = self.context.make_current()
        try:
            if self._external_stream is None:
                self._stream = _driver.stream_create()
            else:
                self._stream = self._external_stream
                if self._stream > 2:  # 1 and 2 are the default streams of the current context
                    ctx = _driver.stream_context(self._stream)
                    if ctx != self.context.handle:
                        raise ValidationError(
                            f"Session: stream=0x{self._stream:x} belongs to another context "
                            f"(0x{ctx:x}), not device {self.device}'s primary context")
            self._import_event = _driver.event_create()
            self._export_event = _driver.event_create()  # used under interop.dlpack_export's lock
        except BaseException:
            if self._external_stream is None and getattr(self, "_stream", 0):
                _driver.stream_destroy(self._stream)
            _driver.set_current(self._prev_ctx)
            raise
        self._sobj = _driver.stream_object(self._stream)
        self.liveness.stream = self._stream
        self._launch = _driver.launcher()
        self._thread = threading.get_ident()
        self._open = True
        self._fast = True
        if not hasattr(_local, "open"):
            _local.open = []
        _local.open.append(self)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            if not self._faulted:  # a faulted stream reports the same fault again; once is enough
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
        self._fast = False
        self.liveness.close()
        self._stream_owner = None
        self._resources.clear()
        for ev in (self._import_event, self._export_event):
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
                _driver.stream_destroy(self._stream)
            # What the session freed goes back to the device; Tensors still held stay.
            _driver.mem_pool_trim(self.context.pool, 0, "session.__exit__")
        except Exception:  # a context poisoned by a fault refuses; the process must restart
            if not self._faulted:
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
        self._check_use("session.stream_handle")
        return self._stream

    def _stream_for_export(self) -> int:
        return self._stream

    def _refuse_in_capture(self, op: str, why: str) -> None:
        if self.liveness.capturing:
            raise RuntimeStateError(f"{op}: not allowed during s.capture(): {why}")

    def _check_use(self, op: str) -> None:
        if not self._open:
            raise RuntimeStateError(f"{op}: the session is closed (used outside its with block)")
        if threading.get_ident() != self._thread:
            raise RuntimeStateError(f"{op}: the session belongs to the thread that opened it; "
                                    "open a Session on this thread instead")
        if self._faulted:
            raise KernelFault(f"{op}: an earlier kernel fault made this session unusable",
                              launches=tuple(self._last))

    def fault_seen(self, exc: KernelFault) -> KernelFault:
        """Record that a driver call of this session reported a kernel fault; what to raise.

        A fault is sticky in the device's context, so whichever call sees it first (a
        synchronize, a copy, a launch, an allocation, an event query) stops the session: the
        exception returned names the last launches, and every later use is refused. Leaving the
        ``with`` block does not raise it a second time. Tenferro's parts call this for faults
        their own driver calls report.
        """
        if self._faulted:  # already reported; this is a refusal of the dead session
            return exc
        self._faulted = True
        self._fast = False
        last = tuple(self._last)
        return KernelFault(f"{exc}; last launches: {list(last)}", exc.result_name,
                           exc.result_code, last)

    # --- liveness ------------------------------------------------------------------------

    @_reports_faults
    def retain(self, obj: Any) -> Any:
        """Keep ``obj`` alive until the session closes; returns it."""
        self._check_use("session.retain")
        self.liveness.retain(obj)
        return obj

    # --- memory --------------------------------------------------------------------------

    def _new_tensor(self, shape: Any, dtype: Any, op: str) -> Tensor:
        self._check_use(op)
        self._refuse_in_capture(op, "the memory would belong to the graph; allocate before "
                                "the capture")
        t = Tensor._allocate(self, _shape_arg(shape, op), dtypes.from_numpy(dtype, op), op)
        self.liveness.allocated_bytes(t.nbytes)  # past FENCE_BYTES, passed owners go
        return t

    @_reports_faults
    def memory_stats(self) -> dict[str, int]:
        """Bytes of tenferro's memory pool on this device: reserved from the device and used.

        ``reserved_bytes`` / ``used_bytes`` now, ``*_high`` their peaks. Freed Tensors stay
        reserved for reuse until `trim_memory` or the end of the session.
        """
        self._check_use("session.memory_stats")
        return _driver.mem_pool_stats(self.context.pool)

    @_reports_faults
    def trim_memory(self, keep_bytes: int = 0) -> None:
        """Give the device back what the pool holds unused, keeping at least ``keep_bytes``."""
        op = "session.trim_memory"
        self._check_use(op)
        if not _is_int(keep_bytes) or not 0 <= keep_bytes < _ADDRESS_END:
            raise ValidationError(f"{op}: {keep_bytes=} must be an int >= 0")
        _driver.mem_pool_trim(self.context.pool, int(keep_bytes), op)

    @_reports_faults
    def alloc_output(self, shape: Any, dtype: Any) -> Tensor:
        """An uninitialised Tensor, for a kernel to write every element of."""
        return self._new_tensor(shape, dtype, "session.alloc_output")

    @_reports_faults
    def alloc_zeros(self, shape: Any, dtype: Any) -> Tensor:
        """A zero-filled Tensor."""
        op = "session.alloc_zeros"
        t = self._new_tensor(shape, dtype, op)
        _driver.memset_d8_async(t.ptr, 0, t.nbytes, self._stream, op)
        return t

    @_reports_faults
    def alloc_bytes(self, nbytes: int) -> DeviceBytes:
        """An untyped, exclusive device workspace of ``nbytes`` bytes."""
        op = "session.alloc_bytes"
        if not isinstance(nbytes, (int, np.integer)) or isinstance(nbytes, bool) or nbytes < 0:
            raise ValidationError(f"{op}: {nbytes=} must be an int >= 0")
        t = self._new_tensor((int(nbytes),), np.uint8, op)
        return DeviceBytes(t.ptr, t.shape, t.strides, t.scalar_type, self.device, t, self)

    @_reports_faults
    def upload(self, array: np.ndarray) -> Tensor:
        """Copy a host array into a new Tensor of the same dtype and shape (stream-ordered)."""
        op = "session.upload"
        if not isinstance(array, np.ndarray):
            raise ValidationError(f"{op}: array must be a numpy.ndarray, got "
                                  f"{type(array).__name__}")
        host = np.ascontiguousarray(array).reshape(array.shape)  # 0-d stays 0-d
        self._refuse_in_capture(op, "host copies cannot be captured; upload before the capture")
        t = self._new_tensor(host.shape, host.dtype, op)
        if t.nbytes:
            _driver.memcpy_htod_async(t.ptr, host.ctypes.data, t.nbytes, self._stream, op)
        self.liveness.hold(host)  # the host source stays alive until the stream passes the copy
        return t

    @_reports_faults
    def download(self, x: Any) -> np.ndarray:
        """Copy a Tensor, span or foreign device array to a new numpy array; waits for the stream.

        Strided spans come back with their logical shape, C-contiguous. bf16 comes back as
        ``ml_dtypes.bfloat16`` when that is installed, else as its uint16 bits.
        """
        op = "session.download"
        self._check_use(op)
        self._refuse_in_capture(op, "it waits for the stream")
        span = x if isinstance(x, Span) and x.session is self else self._span(
            x, TensorRef, None, True, op)
        t = span.scalar_type
        np_dtype = t.numpy if t.numpy is not None else np.dtype(np.uint16)
        if span.nbytes == 0:
            return np.empty(span.shape, dtype=np_dtype)
        raw = np.empty(span.hi - span.lo, dtype=np.uint8)
        _driver.memcpy_dtoh_async(raw.ctypes.data, span.lo, raw.nbytes, self._stream, op)
        self.liveness.hold(span)
        self.synchronize()
        if span.is_c_contiguous:
            return raw.view(np_dtype).reshape(span.shape)
        view = np.ndarray(span.shape, dtype=np_dtype, buffer=raw, offset=span.ptr - span.lo,
                          strides=span.strides)
        return np.ascontiguousarray(view)

    @_reports_faults
    def copy(self, dst: Any, src: Any) -> None:
        """Copy ``src`` into ``dst`` on the stream (device to device).

        Refused: different byte sizes, different dtypes (unless one side is `DeviceBytes`),
        non-contiguous sides, overlapping memory, a read-only destination.
        """
        op = "session.copy"
        d = self._span(dst, TensorMut, None, False, f"{op}: dst")
        s = self._span(src, TensorRef, None, False, f"{op}: src")
        if d.nbytes != s.nbytes:
            raise ValidationError(f"{op}: dst has {d.nbytes} bytes, src has {s.nbytes}")
        untyped = isinstance(dst, DeviceBytes) or isinstance(src, DeviceBytes)
        if not untyped and d.scalar_type is not s.scalar_type:
            raise ValidationError(f"{op}: dst is {d.scalar_type.name}, src is "
                                  f"{s.scalar_type.name}")
        if overlaps(d, s):
            raise ValidationError(f"{op}: dst and src overlap in memory")
        if d.nbytes:
            _driver.memcpy_dtod_async(d.ptr, s.ptr, d.nbytes, self._stream, op)
        self.liveness.hold((d, s))

    @_reports_faults
    def copy_peer(self, dst: Any, src: Any) -> None:
        """Copy ``src``, memory of another session (any device), into ``dst`` of this one.

        ``src`` is a tf.Tensor or a span of another session, on this device or another one;
        ``dst`` is writable memory of this session. The copy runs on this session's stream,
        ordered after ``src``'s session stream with an event (no host sync); peer access is
        enabled where the hardware allows it, and the driver stages the copy where it does
        not. Sizes and dtypes must match, both sides compact. A later write to ``src`` from its
        own session must wait for this copy: ``other.wait(s.record_event())``.
        """
        op = "session.copy_peer"
        d = self._span(dst, TensorMut, None, False, f"{op}: dst")
        if isinstance(src, Tensor):
            other, ptr, nbytes, t, owner = src._session, src.ptr, src.nbytes, \
                src.scalar_type, src
            ctx = src._context
        elif isinstance(src, Span) and src.session is not self:
            other, ptr, nbytes, t, owner = src.session, src.ptr, src.nbytes, src.scalar_type, \
                src.owner
            ctx = other.context
            if not src.is_c_contiguous:
                raise ValidationError(f"{op}: src has non-compact strides={src.strides}")
        else:
            raise ValidationError(f"{op}: src must be a tf.Tensor or a span of another session, "
                                  f"got {type(src).__name__}; use s.copy within one session")
        if other is self:
            raise ValidationError(f"{op}: src belongs to this session; use s.copy")
        if d.nbytes != nbytes:
            raise ValidationError(f"{op}: dst has {d.nbytes} bytes, src has {nbytes}")
        if d.scalar_type is not t:
            raise ValidationError(f"{op}: dst is {d.scalar_type.name}, src is {t.name}")
        if other._open and other._thread is not None and other._faulted:
            raise RuntimeStateError(f"{op}: src's session (device {other.device}) faulted")
        self._refuse_in_capture(op, "ordering after another session's stream needs an event")
        if other._open:  # order after the source session's work, device to device
            # The event must belong to the source's context to be recorded on its stream; a
            # stream may wait on an event of another context.
            ctx.push()
            try:
                ev = _driver.event_create()
                try:
                    _driver.event_record(ev, other._stream, op)
                    _driver.stream_wait_event(self._stream, ev, op)
                finally:
                    _driver.event_destroy(ev)  # released once the wait has been satisfied
            finally:
                ctx.pop()
        if ctx.ordinal != self.device:
            _driver.enable_peer_access(self.context, ctx, op)
        if nbytes:
            _driver.memcpy_peer_async(d.ptr, self.context.handle, ptr, ctx.handle, nbytes,
                                      self._stream, op)
        self.liveness.hold((d, owner))

    # --- spans ---------------------------------------------------------------------------

    def tensor(self, x: Any, dtype: Any = None, *, allow_strided: bool = False) -> TensorRef:
        """A read-only span over a Tensor or a CUDA Array Interface / DLPack device array."""
        return self._span(x, TensorRef, dtype, allow_strided, "session.tensor")

    def tensor_mut(self, x: Any, dtype: Any = None, *, allow_strided: bool = False) -> TensorMut:
        """An exclusive, writable span; refuses producers that marked their array read-only."""
        return self._span(x, TensorMut, dtype, allow_strided, "session.tensor_mut")

    def from_dlpack(self, x: Any, *, writable: bool = False, dtype: Any = None,
                    allow_strided: bool = False) -> TensorRef | TensorMut:
        """A span over ``x`` taken through DLPack even where x also has a CUDA Array Interface.

        ``x`` is an object with ``__dlpack__`` (asked with this session's stream, so the
        producer orders itself before it) or an unused DLPack capsule (consumed as it is: its
        producer must have finished writing it). ``writable=True`` gives a TensorMut and
        refuses a capsule flagged READ_ONLY.
        """
        cls = TensorMut if writable else TensorRef
        return self._span(x, cls, dtype, allow_strided, "session.from_dlpack", dlpack=True)

    def _span(self, x: Any, cls: type, dtype: Any, allow_strided: bool, op: str,
              dlpack: bool = False) -> Any:
        self._check_use(op)
        if isinstance(x, Tensor):
            if x._session is not self:
                self._adopt_tensor(x, op)
            ptr, shape, strides, t, owner = x.ptr, x.shape, x.strides, x.scalar_type, x
            readonly = False
        elif isinstance(x, Span):
            if x.session is not self:
                raise ValidationError(f"{op}: x is a {type(x).__name__} of another session")
            ptr, shape, strides, t, owner = x.ptr, x.shape, x.strides, x.scalar_type, x.owner
            readonly = not x.writable
            if type(x) is DeviceBytes and cls is TensorMut:
                cls = DeviceBytes  # a workspace stays untyped where a writable span is asked
        else:
            f = read_foreign(x, self._stream, self.device, self.liveness.capturing, op,
                             dlpack_only=dlpack)
            check_memory(f, self.device, op)
            if f.stream is not None and f.stream != self._stream:
                self._refuse_in_capture(op, "ordering after the producer's stream needs an "
                                        "event; make the span before the capture")
                self._order_after(f.stream, op)
            ptr, shape, strides, t, owner, readonly = (f.ptr, f.shape, f.strides, f.scalar_type,
                                                       f.owner, f.readonly)
        if readonly and cls is not TensorRef:
            raise ValidationError(f"{op}: x is read-only (its producer says so); use "
                                  "s.tensor(x) to read it")
        if dtype is not None:
            want = dtype if isinstance(dtype, dtypes.ScalarType) else dtypes.from_numpy(dtype, op)
            if want is not t:
                raise ValidationError(f"{op}: dtype={want.name} was asked but x is {t.name}")
        span = cls(ptr, shape, strides, t, self.device, owner, self)
        if not span.is_c_contiguous:
            if not allow_strided:
                raise ValidationError(
                    f"{op}: x has non-compact strides={strides} (bytes) for shape={shape}; "
                    "pass allow_strided=True for a kernel that takes strides, or copy it")
            if any(d > 1 and st % t.itemsize for d, st in zip(shape, strides, strict=True)):
                raise ValidationError(
                    f"{op}: x has strides={strides} (bytes) that are not multiples of its "
                    f"{t.itemsize}-byte {t.name} elements; a kernel would read misplaced data")
            if span.lo < 0 or span.hi > _ADDRESS_END:
                raise ValidationError(
                    f"{op}: x's strides={strides} (bytes) for shape={shape} from 0x{ptr:x} "
                    "reach outside the address space; the producer described it wrongly")
            if cls is not TensorRef and any(d > 1 and st == 0 for d, st in
                                            zip(shape, strides, strict=True)):
                raise ValidationError(f"{op}: x has a zero stride (a broadcast view); writes "
                                      f"through it would race (strides={strides})")
        elif span.hi > _ADDRESS_END:
            raise ValidationError(f"{op}: x's {span.nbytes} bytes from 0x{ptr:x} reach outside "
                                  "the address space; the producer described it wrongly")
        if span.nbytes and ptr % t.itemsize:
            raise ValidationError(f"{op}: x's data pointer 0x{ptr:x} is not aligned to its "
                                  f"{t.itemsize}-byte {t.name} elements")
        return span

    def _order_after(self, stream: int, op: str) -> None:
        """Order the session's stream after ``stream``'s work so far, without blocking the host."""
        try:
            order_after(self._stream, stream, self._import_event, op)
        except KernelFault as exc:
            raise self.fault_seen(exc) from None

    def _adopt_tensor(self, x: Tensor, op: str) -> None:
        if x.device != self.device:
            raise ValidationError(f"{op}: x lives on device {x.device}, this session is on "
                                  f"device {self.device}")
        other = x._session
        if other._open:  # the other session may still be writing it: order after its stream
            self._refuse_in_capture(op, "a Tensor of another open session needs an event")
            self._order_after(other._stream, op)

    def readonly(self, span: Span) -> TensorRef:
        """A read-only view of a span or Tensor of this session."""
        return self._span(span, TensorRef, None, True, "session.readonly")

    # --- modules and launches ------------------------------------------------------------

    def _add_module(self, m: Module) -> Module:
        self._modules.append(m)
        return m

    @_reports_faults
    def compile(self, source: str, options: Any = None, name_expressions: Any = None,
                arch: str | None = None) -> Module:
        """Compile CUDA C to CUBIN for this device's architecture (disk-cached) and load it.

        ``arch`` may name the device's own architecture with its ``a`` suffix (``"sm_90a"``:
        architecture-specific instructions such as wgmma) or ``f`` suffix; any other
        architecture is refused, since its CUBIN would not load here.
        """
        op = "session.compile"
        self._check_use(op)
        major, minor = self.context.compute_capability
        own = f"sm_{major}{minor}"
        if arch is None:
            arch = own
        elif arch not in (own, own + "a", own + "f"):
            raise ValidationError(f"{op}: {arch=} is not this device's architecture ({own}, "
                                  f"{own}a or {own}f)")
        r = compile_cuda(source, arch=arch, options=options,
                         name_expressions=name_expressions,
                         _driver_version=_driver.driver_version())
        return self._add_module(Module(self, r.image, "cubin", r.signatures, r.lowered_names, op,
                                       compile_log=r.log))

    @_reports_faults
    def load_ptx(self, text: str | bytes) -> Module:
        """Load PTX text; its ``.entry`` parameter lists become the functions' signatures."""
        op = "session.load_ptx"
        self._check_use(op)
        if isinstance(text, (bytes, bytearray)):
            try:
                text = bytes(text).decode()
            except UnicodeDecodeError as exc:
                raise ValidationError(f"{op}: text is not UTF-8 at byte {exc.start}; PTX is "
                                      "ASCII text") from None
        if not isinstance(text, str):
            raise ValidationError(f"{op}: text must be str or bytes, got {type(text).__name__}")
        text = text.rstrip("\0")  # a C string's terminator is fine; an inner NUL is not
        if "\0" in text:
            raise ValidationError(f"{op}: text has a NUL character at offset {text.find(chr(0))}; "
                                  "the driver would load only what comes before it")
        try:
            text.encode()
        except UnicodeEncodeError as exc:
            raise ValidationError(f"{op}: text cannot be encoded at offset {exc.start}") from None
        sigs = parse_ptx(text, op)
        image = text.encode() + b"\0"
        return self._add_module(Module(self, image, "ptx", sigs, None, op))

    @_reports_faults
    def load_cubin(self, image: bytes) -> Module:
        """Load a CUBIN; parameter sizes come from the driver (cuFuncGetParamInfo).

        A CUBIN says only each parameter's size, so any 8-byte argument fits an 8-byte slot:
        prefer `compile` or `load_ptx` where the types should be checked.
        """
        op = "session.load_cubin"
        self._check_use(op)
        if not isinstance(image, (bytes, bytearray, memoryview)):
            raise ValidationError(f"{op}: image must be bytes, got {type(image).__name__}")
        return self._add_module(Module(self, bytes(image), "cubin", {}, None, op))

    def _launchable(self, fn: Any, config: Any, args: list | tuple, op: str) -> Function:
        """The Function to launch, with the session, fn, config and args checked."""
        self._check_use(op)
        if not isinstance(args, (list, tuple)):
            raise ValidationError(f"{op}: args must be a list or tuple of kernel arguments, got "
                                  f"{type(args).__name__}")
        if type(fn) is not Function:
            if type(fn) is not NumbaKernel:
                raise ValidationError(f"{op}: fn must be a Function of this session, got "
                                      f"{type(fn).__name__}")
            if fn.session is not self:
                raise ValidationError(f"{op}: fn is a NumbaKernel of another session")
            fn = fn.function_for(args, op)
        if fn.session is not self:
            raise ValidationError(f"{op}: fn is a Function of another session")
        if type(config) is not LaunchConfig:  # before the set lookup: a list would not hash
            raise ValidationError(f"{op}: config must be a LaunchConfig, got "
                                  f"{type(config).__name__}")
        if config not in fn.checked_configs:
            check_against(config, fn, op)
            fn.checked_configs.add(config)
        if fn.last_config is not config:
            fn.last_config = config
            fn.record = _driver.LaunchRecord(fn.handle, config.dims, self._stream,
                                             fn.block.address)
            fn.record_address = fn.record.address
        return fn

    @_reports_faults
    def numba_kernel(self, kernel: Any, signature: Any = None) -> Function | NumbaKernel:
        """A numba-cuda kernel for this session, launched by `launch` like any Function.

        ``kernel`` is a ``@cuda.jit`` dispatcher or a plain Python function. With a numba
        ``signature`` (``"void(float32[::1], float32[:], float32)"``) it compiles now and returns
        a Function; without one it returns a `NumbaKernel` that `launch` specializes on the
        arguments' dtypes, ndim and layout (compiled once per combination).
        """
        op = "session.numba_kernel"
        self._check_use(op)
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
                    config is not fn.last_config or not self._fast or \
                    _get_ident() != self._thread:
                self._launch_checked(fn, config, args)
                return
            block = fn.block
            prev = block._prev
            if len(args) != len(prev) or not all(map(_is, args, prev)):
                if not isinstance(args, (list, tuple)):
                    raise TypeError  # named below, with the refusal of len() of a non-sequence
                replaced = block._prev_spans
                block.pack(args, self, "session.launch")
                if replaced:  # the previous launch may still be running: hold what it used
                    self.liveness.hold(replaced)
            err = self._launch(fn.record_address)
            if err:
                _driver.raise_launch_error(err, "session.launch")
            self._last.append(fn.name)
        except KernelFault as exc:  # no cost unless raised: a fence query or the launch saw it
            raise self.fault_seen(exc) from None
        except TypeError:  # no cost unless raised: args that are not a list or tuple
            if not isinstance(args, (list, tuple)):
                raise ValidationError(f"session.launch: args must be a list or tuple of kernel "
                                      f"arguments, got {type(args).__name__}") from None
            raise

    def _launch_checked(self, fn: Any, config: Any, args: list | tuple) -> None:
        """`launch` when anything is new: a function, a config, a capture, another thread."""
        op = "session.launch"
        fn = self._launchable(fn, config, args, op)
        block = fn.block
        replaced = block._prev_spans
        spans = block.pack(args, self, op)
        err = self._launch(fn.record_address)
        if err:
            _driver.raise_launch_error(err, op)
        live = self.liveness
        if replaced and replaced is not spans:
            live.hold(replaced)
        live.hold(spans)  # always: a capture's graph takes its owners from here
        self._last.append(fn.name)

    @_reports_faults
    def bind(self, fn: Function | NumbaKernel, config: LaunchConfig,
             args: list | tuple) -> BoundLaunch:
        """Check and pack a launch once; calling the result enqueues it with no further work.

        Every refusal of `launch` happens here instead. A NumbaKernel is specialized on
        ``args`` now.
        """
        op = "session.bind"
        fn = self._launchable(fn, config, args, op)
        return BoundLaunch(self, fn, config, args, op)

    def begin_capture(self) -> list:
        """Start capturing the stream, for `Capture`; returns the holds to give `end_capture`."""
        op = "session.capture"
        self._check_use(op)
        if self.liveness.capturing:
            raise RuntimeStateError(f"{op}: a capture is already running on this session")
        _driver.capture_begin(self._stream, op)
        self._fast = False  # every captured launch goes where its owners are collected
        return self.liveness.begin_capture()

    def end_capture(self, saved: list) -> tuple[int, list]:
        """End the capture: (the graph's handle or 0, the owners its work touched).

        The session records again even when the driver's end of capture raises.
        """
        live = self.liveness
        owners = live.end_capture(saved)
        self._fast = self._open and not self._faulted
        try:
            graph = _driver.capture_end(self._stream, "session.capture")
        except KernelFault as exc:
            raise self.fault_seen(exc) from None
        finally:
            live.free_deferred()
        return graph, owners

    def replay(self, graph: Any, exec_obj: Any) -> None:
        """Enqueue an instantiated graph on the stream and hold it until the stream passes."""
        op = "graph.launch"
        self._check_use(op)
        if self.liveness.capturing:
            raise RuntimeStateError(f"{op}: not during a capture")
        try:
            _driver.graph_launch(exec_obj, self._sobj, op)
            self.liveness.hold(graph)  # the graph and its owners live until the stream passes
        except KernelFault as exc:
            raise self.fault_seen(exc) from None

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
        op = "session.record_event"
        self._check_use(op)
        self._refuse_in_capture(op, "events are not captured")
        ev = Event(self, timing)
        _driver.event_record(ev.handle, self._stream, op)
        return ev

    @_reports_faults
    def wait(self, event: Event) -> None:
        """Order later work on this session's stream after ``event`` (no host block)."""
        op = "session.wait"
        self._check_use(op)
        self._refuse_in_capture(op, "events are not captured")
        if not isinstance(event, Event):
            raise ValidationError(f"{op}: event must be an Event, got {type(event).__name__}")
        event._check(op)
        _driver.stream_wait_event(self._stream, event.handle, op)

    def synchronize(self) -> None:
        """Wait for the stream; a kernel fault raises `KernelFault` and ends the session's use."""
        op = "session.synchronize"
        if not self._open:  # the stream is destroyed at the end of the block
            raise RuntimeStateError(f"{op}: the session is closed (used outside its with block)")
        if threading.get_ident() != self._thread:
            raise RuntimeStateError(f"{op}: the session belongs to the thread that opened it")
        self._refuse_in_capture(op, "a capturing stream cannot be waited for")
        try:
            _driver.stream_synchronize(self._stream, op)
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
        self._check_use("session.resource")
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
