"""`Session`: one device's primary context and one stream, in a ``with`` block, on one thread.

It keeps scope, thread and fault state, `launch`, `bind` and `synchronize`; every other method
is the function of the part that owns the operation (`tenferro.tensor`, `tenferro.module`,
...).
"""

from __future__ import annotations

import collections
import functools
import operator
import threading
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from . import _driver, _liveness, events, graph, info, module, numba_kernels, resources, scope
from . import tensor as tensor_ops
from . import timeline as timeline_part
from ._liveness import Liveness
from .errors import KernelFault, RuntimeStateError, ValidationError
from .interop import imports, stream_value
from .interop.streams import StreamOrdering, open_stream
from .launch import BoundLaunch, LaunchConfig, launch_checked, launchable
from .module import Function, Module
from .numba_kernels import NumbaKernel
from .profiling import named_range
from .resources import ResourceCache

__all__ = ["FENCE_BYTES", "FENCE_EVERY", "Session"]

P = ParamSpec("P")
R = TypeVar("R")
_get_ident = threading.get_ident
_is = operator.is_
FENCE_EVERY = 256  # launches between liveness fences: bounds what a long loop keeps alive
FENCE_BYTES = 256 << 20  # bytes allocated between fences: bounds the memory held owners pin


def _reports_faults(part: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """A Session method made of the part's ``part(session, ...)``, with the part's docstring.

    A kernel fault that its driver calls report stops the session (`Session.fault_seen`).
    """
    @functools.wraps(part)
    def method(self: Session, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return part(self, *args, **kwargs)
        except KernelFault as exc:
            raise self.fault_seen(exc) from None

    return method


class Session:
    """A scoped device session: ``with tf.Session(device=0) as s: ...``.

    ``stream=None`` makes the session own a new blocking stream (ordered with the legacy
    default stream, torch's); a stream handle or an object with ``__cuda_stream__`` makes it
    work on that stream (not destroyed at the end).
    Opening raises `RuntimeStateError` with no driver or GPU. Every method refuses use from
    another thread and after the block; leaving the block synchronizes, even when it raised.
    """

    def __init__(self, device: int = 0, stream: Any = None) -> None:
        if not isinstance(device, int) or isinstance(device, bool) or device < 0:
            raise ValidationError(f"Session: {device=} must be an int >= 0")
        self.device = device
        self._external_stream = stream_value(stream, "stream", "Session", objects=True, handle=True)
        self._stream_owner = stream  # an object with __cuda_stream__ keeps its stream alive
        self._open = False
        self.stream = 0  # the stream's handle while open (stream_handle checks use first)
        self.thread: int | None = None
        self._modules: list[Module] = []
        self.liveness = Liveness(0, FENCE_EVERY, FENCE_BYTES)  # its stream is set on entry
        self.recent_launches: collections.deque[str] = collections.deque(maxlen=8)
        self.launch_count = 0  # kernels and graph replays enqueued (not captured), for repr(s)
        self.faulted = False
        self.fast_path_ok = False  # open, not faulted, not capturing: the launch fast path may run
        self.resources = ResourceCache()
        self.ordering = StreamOrdering(0, 0, frozenset())  # producers to wait for; set on entry
        self.active_timeline: timeline_part.Timeline | None = None  # inside s.timeline() only

    # --- scope ---------------------------------------------------------------------------

    def __enter__(self) -> Session:
        if self._open or self.thread is not None:
            raise RuntimeStateError("session.__enter__: a Session is entered once")
        self.context = _driver.PrimaryContext.get(self.device, "session")
        self._prev_ctx = self.context.make_current()
        try:
            self.stream, in_order = open_stream(self._external_stream, self.context, "Session")
            self.import_event = _driver.event_create()
            self.export_event = _driver.event_create()  # used under interop.dlpack_export's lock
        except BaseException:
            if self._external_stream is None and self.stream:
                _driver.stream_destroy(self.stream)
            _driver.set_current(self._prev_ctx)
            raise
        self.liveness.stream = self.stream
        self.ordering = StreamOrdering(self.stream, self.import_event, in_order)
        self.launcher = _driver.launcher()
        self.thread = threading.get_ident()
        self._open = True
        self.fast_path_ok = True
        scope.entered(self)
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
        scope.left(self)
        self.fast_path_ok = False
        self.liveness.close()
        self._stream_owner = None
        self.resources.clear()
        for release in (functools.partial(_driver.event_destroy, self.import_event),
                        functools.partial(_driver.event_destroy, self.export_event),
                        *(m.unload for m in self._modules)):
            try:
                release()
            except Exception:  # what is left to release is released all the same
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

    open = classmethod(scope.open_session)  # kept open across cells, until close()
    close = scope.close_session

    @property
    def is_open(self) -> bool:
        """True inside the ``with`` block (or between `open` and `close`)."""
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

    def check_use(self, op: str, *, faulted_ok: bool = False) -> None:
        """Refuse use (naming ``op``) when closed, from another thread, or after a fault."""
        if not self._open:
            raise RuntimeStateError(f"{op}: the session is closed (used outside its with block)")
        if threading.get_ident() != self.thread:
            raise RuntimeStateError(f"{op}: the session belongs to the thread that opened it; "
                                    "open a Session on this thread instead")
        if self.faulted and not faulted_ok:
            raise KernelFault(f"{op}: an earlier kernel fault made this session unusable",
                              launches=tuple(self.recent_launches))

    def refresh_fast_path(self) -> None:
        """Let `launch` take its fast path only while open, not faulted, capturing or timing."""
        self.fast_path_ok = self._open and not self.faulted and not self.liveness.capturing \
            and self.active_timeline is None

    def fault_seen(self, exc: KernelFault) -> KernelFault:
        """Record a kernel fault that a driver call of this session reported; what to raise.

        A fault is sticky in the context: whichever call sees it first stops the session, the
        exception returned names the last launches, every later use is refused, and leaving
        the ``with`` block does not raise it again.
        """
        if self.faulted:  # already reported; this is a refusal of the dead session
            return exc
        self.faulted = True
        self.fast_path_ok = False
        last = tuple(self.recent_launches)
        return KernelFault(f"{exc}; last launches: {list(last)}", exc.result_name,
                           exc.result_code, last)

    # --- what the parts own: one line each (the part's function, called with the session) ---

    retain = _reports_faults(_liveness.retain)
    memory_stats = _reports_faults(tensor_ops.memory_stats)
    trim_memory = _reports_faults(tensor_ops.trim_memory)
    alloc_output = _reports_faults(tensor_ops.alloc_output)
    alloc_zeros = _reports_faults(tensor_ops.alloc_zeros)
    alloc_bytes = _reports_faults(tensor_ops.alloc_bytes)
    upload = _reports_faults(tensor_ops.upload)
    download = _reports_faults(tensor_ops.download)
    copy = _reports_faults(tensor_ops.copy)
    memset = _reports_faults(tensor_ops.memset)
    copy_peer = _reports_faults(tensor_ops.copy_peer)
    tensor = imports.tensor  # a span's import reports its own faults: no wrapper on this path
    tensor_mut = imports.tensor_mut
    from_dlpack = imports.from_dlpack
    readonly = imports.readonly
    compile = _reports_faults(module.compile_module)
    load_ptx = _reports_faults(module.load_ptx_module)
    load_cubin = _reports_faults(module.load_cubin_module)
    numba_kernel = _reports_faults(numba_kernels.numba_kernel)
    record_event = _reports_faults(events.record_event)
    wait = _reports_faults(events.wait_event)
    resource = _reports_faults(resources.resource)
    capture = graph.capture
    timeline = timeline_part.timeline
    range = named_range
    __repr__ = info.session_repr
    _repr_html_ = info.session_html

    def add_module(self, module: Module) -> Module:
        """Keep ``module`` loaded until the session ends (the loaders in `module` call this)."""
        self._modules.append(module)
        return module

    # --- launches and the barrier ----------------------------------------------------------

    def launch(self, fn: Function | NumbaKernel, config: LaunchConfig,
               args: list | tuple) -> None:
        """Check and enqueue one launch on the session's stream; only enqueues.

        Every check of the design runs, but nothing is checked twice: a Function remembers its
        last config, and arguments that are the very objects of its previous launch are
        already checked and packed (and held until replaced, then until the stream passes).
        """
        try:
            if fn.__class__ is NumbaKernel and fn.session is self:  # its Function, if compiled
                fn = fn.known_function(args) or fn
            if fn.__class__ is not Function or fn.session is not self or \
                    config is not fn.last_config or not self.fast_path_ok or \
                    _get_ident() != self.thread:
                launch_checked(self, fn, config, args)
                return
            param_block = fn.param_block
            prev = param_block.last_args  # empty after a synchronize: all is checked again
            if not prev or len(args) != len(prev) or not all(map(_is, args, prev)):
                if not isinstance(args, (list, tuple)):
                    raise TypeError  # named below, with the refusal of len() of a non-sequence
                replaced = param_block.last_spans
                param_block.pack_new(args, self, "session.launch")
                # The previous launch may still be running: hold what it used, unless the
                # block kept those very spans (new scalars alone), which it still references.
                if replaced and replaced is not param_block.last_spans:
                    self.liveness.hold(replaced)
            if self.ordering.pending:  # spans of producers on other streams were made
                self.ordering.flush("session.launch")
            err = self.launcher(fn.record_address)
            if err:
                _driver.raise_launch_error(err, "session.launch")
            self.recent_launches.append(fn.name)
            self.launch_count += 1
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

    def synchronize(self) -> None:
        """Wait for the stream; a kernel fault raises `KernelFault` and ends the session's use."""
        op = "session.synchronize"
        self.check_use(op, faulted_ok=True)  # a faulted stream reports its fault again
        self.refuse_in_capture(op, "a capturing stream cannot be waited for")
        try:
            _driver.stream_synchronize(self.stream, op)
        except KernelFault as exc:
            raise self.fault_seen(exc) from None
        self.liveness.release_all()
        self.launcher = _driver.launcher()  # the @njit one, once it is built

