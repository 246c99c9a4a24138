"""`SessionState`: what the parts of one session share, and the one routine that enqueues.

A `tenferro.Session` is the user's surface; every part it delegates to (memory operations,
span import, modules, launches, graphs, events, timelines) is handed this object, never the
Session. It holds the device, context and stream, the thread that owns them, whether the
session is open or stopped by a kernel fault, the owners held behind enqueued work
(`Liveness`), the producers' streams to order after (`StreamOrdering`) and the launch counters.

Every launch kind (``s.launch``, ready and numba kernels, bound launches, graph replay) is
enqueued by `enqueue`, or by `enqueue_fast` where the caller has seen `fast_path_ok`: flush
the producers' ordering, call the driver, raise its error, time it inside a timeline, record
its name for a fault's message, count it, hold what it uses.
"""

from __future__ import annotations

import collections
import functools
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from . import _driver, profiling
from ._liveness import Liveness
from .errors import KernelFault, RuntimeStateError
from .interop.streams import StreamOrdering, open_stream
from .resources import ResourceCache

__all__ = ["FENCE_BYTES", "FENCE_EVERY", "SessionState"]

FENCE_EVERY = 256  # launches between liveness fences: bounds what a long loop keeps alive
FENCE_BYTES = 256 << 20  # bytes allocated between fences: bounds the memory held owners pin
_get_ident = threading.get_ident
_open_states: weakref.WeakSet[SessionState] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The parent's open sessions are not this process's: every use is refused, naming the fork.
    for st in list(_open_states):
        st.forked = True
        st.fast_path_ok = False


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


class SessionState:
    """The state a session's parts share; made by a `Session`, opened and closed with it.

    ``session`` is the user's `Session` it belongs to (what objects' ``.session`` give back).
    ``stream`` is the stream's handle while open; ``thread`` the opening thread's ident.
    ``fast_path_ok``: open, not faulted, not capturing and no timeline, so a launch may take
    the short path. ``launch_count`` counts kernels and graph replays enqueued (not
    captured); ``recent_launches`` names the last eight, for a fault's message.
    """

    __slots__ = (
        "__weakref__",
        "active_timeline",
        "capture_kernels",
        "context",
        "device",
        "export_event",
        "external_stream",
        "fast_path_ok",
        "faulted",
        "forked",
        "import_event",
        "is_open",
        "launch_count",
        "launch_ranges",
        "launcher",
        "liveness",
        "modules",
        "ordering",
        "previous_context",
        "recent_launches",
        "resources",
        "session",
        "stream",
        "stream_owner",
        "thread",
    )
    session: Any
    device: int
    external_stream: int | None
    stream_owner: Any
    context: Any
    previous_context: Any
    stream: int
    thread: int | None
    is_open: bool
    faulted: bool
    forked: bool
    fast_path_ok: bool
    liveness: Liveness
    ordering: StreamOrdering
    recent_launches: collections.deque[str]
    launch_count: int
    launcher: Callable[[int], int]
    active_timeline: Any
    capture_kernels: list[tuple[Any, ...]] | None
    launch_ranges: profiling.LaunchRanges | None
    import_event: int
    export_event: int
    modules: list[Any]
    resources: ResourceCache

    def __init__(
        self, session: Any, device: int, external_stream: int | None, stream_owner: Any
    ) -> None:
        self.session = session
        self.device = device
        self.external_stream = external_stream  # None: the session makes and owns its stream
        self.stream_owner = stream_owner  # an object with __cuda_stream__ keeps its stream alive
        self.context = None
        self.previous_context = None
        self.stream = 0
        self.thread = None
        self.is_open = False
        self.faulted = False
        self.forked = False  # opened in the parent of this forked process
        self.fast_path_ok = False
        self.liveness = Liveness(0, FENCE_EVERY, FENCE_BYTES)  # its stream is set on open
        self.ordering = StreamOrdering(0, 0, frozenset())  # producers to wait for; set on open
        self.recent_launches = collections.deque(maxlen=8)
        self.launch_count = 0
        self.launcher = _driver.launcher()
        self.active_timeline = None  # inside s.timeline() only
        self.capture_kernels = None  # inside s.capture() only: the kernels it captured
        self.launch_ranges = None  # TENFERRO_NVTX_LAUNCHES=1: a range around each launch
        self.import_event = self.export_event = 0
        self.modules = []
        self.resources = ResourceCache()

    # --- scope -------------------------------------------------------------------------

    def open(self) -> None:
        """Make the device's primary context current and open the stream, on this thread."""
        if self.is_open or self.thread is not None:
            raise RuntimeStateError("session.__enter__: a Session is entered once")
        self.launch_ranges = profiling.launch_ranges("session.__enter__")
        self.context = _driver.PrimaryContext.get(self.device, "session")
        self.previous_context = self.context.make_current()
        try:
            self.stream, in_order = open_stream(self.external_stream, self.context, "Session")
            self.import_event = _driver.event_create()
            self.export_event = _driver.event_create()  # used under interop.dlpack_export's lock
        except BaseException:
            if self.external_stream is None and self.stream:
                _driver.stream_destroy(self.stream)
            _driver.set_current(self.previous_context)
            raise
        self.liveness.stream = self.stream
        self.ordering = StreamOrdering(self.stream, self.import_event, in_order)
        self.launcher = _driver.launcher()
        self.thread = _get_ident()
        self.is_open = True
        self.fast_path_ok = self.launch_ranges is None
        _open_states.add(self)

    def close(self) -> None:
        """Release what the session holds and restore the context current before it opened."""
        self.is_open = False
        self.fast_path_ok = False
        _open_states.discard(self)
        if self.forked:  # the parent's driver objects: not this process's to release
            return
        self.liveness.close()
        self.stream_owner = None
        self.resources.clear()
        for release in (
            functools.partial(_driver.event_destroy, self.import_event),
            functools.partial(_driver.event_destroy, self.export_event),
            *(m.unload for m in self.modules),
        ):
            try:
                release()
            except Exception:  # what is left to release is released all the same
                pass
        self.modules.clear()
        try:
            if self.external_stream is None:
                _driver.stream_destroy(self.stream)
            # What the session freed goes back to the device; Tensors still held stay.
            self.context.trim_pool(0, "session.__exit__")
        except Exception:  # a context poisoned by a fault refuses; the process must restart
            if not self.faulted:
                raise
        finally:
            _driver.set_current(self.previous_context)

    # --- the guards every operation starts with ----------------------------------------

    def check_use(self, op: str, *, faulted_ok: bool = False) -> None:
        """Refuse use (naming ``op``) when closed, from another thread, or after a fault."""
        self.check_not_forked(op)
        if not self.is_open:
            raise RuntimeStateError(f"{op}: the session is closed (used outside its with block)")
        if _get_ident() != self.thread:
            raise RuntimeStateError(
                f"{op}: the session belongs to the thread that opened it; "
                "open a Session on this thread instead"
            )
        if self.faulted and not faulted_ok:
            raise KernelFault(
                f"{op}: an earlier kernel fault made this session unusable",
                launches=tuple(self.recent_launches),
            )

    def check_not_forked(self, op: str, whose: str = "the session") -> None:
        """Refuse use (naming ``op``) of ``whose`` in a child forked after the session opened."""
        if self.forked:
            raise RuntimeStateError(
                f"{op}: {whose} was opened before this process was forked from its parent: "
                f"{_driver.FORKED_WHY}"
            )

    def refuse_in_capture(self, op: str, why: str) -> None:
        """Raise `RuntimeStateError` naming ``op`` and ``why`` while a capture runs."""
        if self.liveness.capturing:
            raise RuntimeStateError(f"{op}: not allowed during s.capture(): {why}")

    def refresh_fast_path(self) -> None:
        """Let launches take the fast path only while open, not faulted, capturing or timing."""
        self.fast_path_ok = (
            self.is_open
            and not self.faulted
            and not self.liveness.capturing
            and self.active_timeline is None
            and self.launch_ranges is None
        )

    def set_timeline(self, timeline: Any) -> None:
        """Time every launch in ``timeline`` from now on (None: stop timing)."""
        self.active_timeline = timeline
        self.refresh_fast_path()

    def record_fault(self, exc: KernelFault) -> KernelFault:
        """Stop the session on a kernel fault a driver call reported; returns what to raise.

        A fault is sticky in the context: whichever call sees it first stops the session, the
        exception returned names the last launches, every later use is refused, and leaving
        the ``with`` block does not raise it again.
        """
        if self.faulted:  # already reported; this is a refusal of the dead session
            return exc
        self.faulted = True
        self.fast_path_ok = False
        last = tuple(self.recent_launches)
        return KernelFault(
            f"{exc}; last launches: {list(last)}", exc.result_name, exc.result_code, last
        )

    def add_module(self, module: Any) -> Any:
        """Keep ``module`` loaded until the session closes (the loaders call this)."""
        self.modules.append(module)
        return module

    def synchronize(self, op: str) -> None:
        """Wait for the stream; a kernel fault raises `KernelFault` and stops the session."""
        self.check_use(op, faulted_ok=True)  # a faulted stream reports its fault again
        self.refuse_in_capture(op, "a capturing stream cannot be waited for")
        try:
            _driver.stream_synchronize(self.stream, op)
        except KernelFault as exc:
            raise self.record_fault(exc) from None
        self.liveness.release_all()
        self.launcher = _driver.launcher()  # the @njit one, once it is built

    # --- the one enqueue routine -------------------------------------------------------

    def enqueue(
        self, op: str, name: str, config: Any, launch: Callable[[Any], Any], target: Any, holds: Any
    ) -> None:
        """Enqueue one launch: ``launch(target)`` returns a CUresult code (0 or None: success).

        Orders the stream after the producers of new spans, times the launch inside
        ``s.timeline()``, names it for a fault's message (``name``), counts it unless it is
        captured (its graph's replays count), and holds ``holds`` until the stream has passed
        it (during a capture, the graph takes them).
        """
        if self.ordering.pending:
            self.ordering.flush(op)
        timed = self.active_timeline
        if timed is not None:
            timed.before_launch(op)
        ranges = self.launch_ranges
        if ranges is None:
            err = launch(target)
        else:
            ranges.push(name)
            try:
                err = launch(target)
            finally:  # balanced even when Ctrl-C lands in the launch
                ranges.pop()
        if err:
            _driver.raise_launch_error(err, op)
        if timed is not None:
            timed.after_launch(name, config, op)
        self.recent_launches.append(name)
        live = self.liveness
        if not live.capturing:
            self.launch_count += 1
        live.hold(holds)

    def note_captured_kernel(
        self, op: str, fn: Any, config: Any, param_block: Any, args: Any, spans: list[Any]
    ) -> None:
        """Remember the kernel just enqueued as a node of the graph being captured.

        Called only while `capture_kernels` is a list (inside ``s.capture()``), so that a
        launch outside a capture pays one attribute test. What a `GraphKernel` is made from:
        the node, the function and config, the packed bytes as launched (the block is
        repacked by later launches) and the arguments.
        """
        node = _driver.capture_last_node(self.stream, op)
        self.capture_kernels.append(  # type: ignore[union-attr]
            (node, fn, config, param_block.snapshot(), tuple(args), spans)
        )

    def enqueue_fast(self, op: str, name: str, launch: Callable[[Any], Any], target: Any) -> None:
        """`enqueue` where the caller saw `fast_path_ok` on this thread, holding nothing new.

        No timeline and no capture can be running, so there is nothing to time and every
        launch counts; what the launch uses is already held by the caller's arrangement.
        """
        if self.ordering.pending:
            self.ordering.flush(op)
        err = launch(target)
        if err:
            _driver.raise_launch_error(err, op)
        self.recent_launches.append(name)
        self.launch_count += 1
