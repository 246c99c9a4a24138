"""Stream capture into CUDA graphs, and their replay on the session's stream.

``with s.capture() as cap: ...`` captures what the block enqueues (launches, copies, numba
kernels) in thread-local mode. The capture ends when the block ends, also when it raises (the
exception propagates and the stream stays usable). ``with s.capture(update=graph):`` records
the same work again with other arguments (other buffers, other scalars) and updates ``graph``
in place instead of making a new one, which costs far less than a new instantiation.
``cap.graph`` is a `Graph`, or None when nothing was captured. A Graph holds every owner its
captured work touched (tensors, foreign arrays, modules, numba kernels) for as long as it
exists, and refuses to launch after its session closed.

During a capture the session refuses what cannot be captured safely: allocations (their memory
would belong to the graph), host copies and synchronization, importing foreign arrays that need
an event on another stream, events, and nested captures. Tensors and Graphs dropped during a
capture are freed after it ends, not inside the graph.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from . import _driver
from ._liveness import capture_on_this_thread
from .errors import BackendError, KernelFault, RuntimeStateError, ValidationError
from .interop.streams import LEGACY, check_context, order_after, stream_value

__all__ = ["Capture", "Graph", "capture", "captured_elsewhere"]

_INVALIDATED = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"
_INVALIDATED_WHY = (
    "the session's stream is blocking, so work enqueued on the legacy default stream during "
    "the capture, from any thread (torch, CuPy or numba ops not given a stream of their own), "
    "had to join it, and the driver invalidated the capture. Keep such work out of the "
    "capture's time, or open the session on a non-blocking stream "
    "(tf.Session(stream=torch.cuda.Stream()))"
)


class Graph:
    """An instantiated CUDA graph of a session; replay with `launch`."""

    __slots__ = ("__weakref__", "_exec", "_graph", "node_count", "owners", "state")
    state: Any
    _graph: int
    _exec: _driver.ExecutableGraph | None
    node_count: int
    owners: list[Any]

    @property
    def session(self) -> Any:
        """The `tenferro.Session` this graph belongs to."""
        return self.state.session

    def __init__(self, state: Any, graph: int, node_count: int, owners: list[Any]) -> None:
        self.state = state
        self._graph = 0
        self._exec = None
        self.node_count = node_count
        self.owners = owners
        self._exec = _driver.ExecutableGraph(graph, state.stream, "session.capture")
        self._graph = graph  # owned from here on; before, the capture destroys it on failure

    def launch(self, stream: Any = None) -> None:
        """Replay the graph on the session's stream, or on another stream of its device.

        On another stream the replay is ordered after the work enqueued on the session's
        stream so far, and the session's stream after the replay, so the session's later work
        and the release of the graph's owners follow it; the host never waits. Only enqueues;
        the graph and its owners are held until the stream has passed it.

        Args:
            stream: None for the session's stream; or a stream handle (an int; 1 and 2 the
                legacy and per-thread default streams) or an object with ``__cuda_stream__``
                (a torch or CuPy stream) of the session's device.

        Raises:
            ValidationError: ``stream`` is not a stream value, or a stream of another
                context than the session's.
            RuntimeStateError: The session is closed, used from another thread, or
                capturing; or the graph cannot replay (a refused update left it without an
                executable graph, and making one failed).
            BackendError: The driver refused the replay.
            KernelFault: A kernel fault has stopped the session.
        """
        st = self.state
        op = "graph.launch"
        other = stream_value(stream, "stream", op, objects=True, handle=True)
        st.check_use(op)
        if st.liveness.capturing:
            raise RuntimeStateError(f"{op}: not during a capture")
        if self._exec is None:
            raise RuntimeStateError(
                f"{op}: the graph cannot replay: making its executable "
                "graph again after a refused update failed; capture anew, or capture the "
                "same work again with update=graph"
            )
        name = f"graph of {self.node_count} node(s)"
        try:  # the graph and its owners live until the stream passes the replay
            if other is None or other == st.stream:
                st.enqueue(op, name, None, self._exec.launch, op, self)
                return
            check_context(other, st.context, "stream", op)
            if st.ordering.pending:  # the producers first, then everything on the session's
                st.ordering.flush(op)
            order_after(other, st.stream, st.import_event, op)
            st.enqueue(
                op, name, None, functools.partial(_replay_on, self._exec, other, st), op, self
            )
        except KernelFault as exc:
            raise st.record_fault(exc) from None

    def take_update(self, graph: int, node_count: int, owners: list[Any], op: str) -> None:
        """Take the node parameters of ``graph`` (a new capture of the same work) and its owners.

        Refused (`ValidationError`) when the work is not the same: another node count (seen
        before the driver is asked), or other kernels or order (the driver's reason). Then
        this graph is as it was: an executable graph the driver may have part-updated is
        replaced by a new one of the old graph. ``graph`` is owned from here on either way.
        """
        if node_count != self.node_count:  # not the same work: the driver is not asked
            why = f"it has {node_count} node(s), the graph {self.node_count}"
        elif self._exec is None:  # it could not replay: the new capture makes it replayable
            try:
                self._exec = _driver.ExecutableGraph(graph, self.state.stream, op)
            except BaseException:
                _driver.graph_destroy(graph)
                raise
            why = None
        else:
            why = self._exec.update(graph, op)
            if why is not None:  # the driver may have left it part-updated: made anew
                stale, self._exec = self._exec, None
                stale.destroy()  # launches in flight finish first; the driver frees it after
                try:
                    self._exec = _driver.ExecutableGraph(self._graph, self.state.stream, op)
                except BaseException:  # the graph can no longer replay; graph is still owned
                    _driver.graph_destroy(graph)
                    raise
        if why is not None:
            _driver.graph_destroy(graph)
            raise ValidationError(
                f"{op}: update=graph: the new capture is not the same work as the graph's, so "
                f"it cannot update it ({why}); capture without update= for a new graph"
            )
        self.state.liveness.hold(self.owners)  # replays in flight may still use them
        old, self._graph = self._graph, graph
        self.node_count, self.owners = node_count, owners
        _driver.graph_destroy(old)

    def __del__(self) -> None:
        exec_graph, graph = getattr(self, "_exec", None), getattr(self, "_graph", 0)
        self._exec, self._graph = None, 0
        if exec_graph is None and not graph:
            return
        try:  # never raise from a finaliser (at exit, the modules' globals may be gone)
            if _driver.forked_child():  # a forked child's graphs are the parent's
                return
            live = getattr(getattr(self, "state", None), "liveness", None)
            if live is None or not live.capturing:  # its session's capture, or one on this thread
                live = capture_on_this_thread()
            if live is not None and live.capturing:  # a destroy now would invalidate the capture
                live.defer_release(lambda: _destroy(exec_graph, graph))
            else:
                _destroy(exec_graph, graph)
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"Graph({self.node_count} node(s), {len(self.owners)} owner group(s))"


def _replay_on(exec_graph: _driver.ExecutableGraph, stream: int, st: Any, op: str) -> None:
    """Replay on ``stream``, then order the session's stream after it (a timeline times both)."""
    exec_graph.launch_on(stream, op)
    order_after(st.stream, stream, st.import_event, op)


def _destroy(exec_graph: _driver.ExecutableGraph | None, graph: int) -> None:
    """Destroy a Graph's executable and graph; never raises (a finaliser calls it)."""
    for destroy in (
        exec_graph and exec_graph.destroy,
        graph and (lambda: _driver.graph_destroy(graph)),
    ):
        try:
            if destroy:
                destroy()
        except Exception:
            pass


class Capture:
    """The context manager ``s.capture()`` returns; ``graph`` is set when the block ends."""

    __slots__ = ("_saved_holds", "graph", "state", "update")
    _saved_holds: list[Any] | None
    graph: Graph | None
    state: Any
    update: Graph | None

    @property
    def session(self) -> Any:
        """The `tenferro.Session` this capture belongs to."""
        return self.state.session

    def __init__(self, state: Any, update: Graph | None = None) -> None:
        self.state = state
        self.update = update
        self.graph = None

    def __enter__(self) -> Capture:
        st = self.state
        op = "session.capture"
        st.check_use(op)
        if st.liveness.capturing:
            raise RuntimeStateError(f"{op}: a capture is already running on this session")
        if st.active_timeline is not None:
            raise RuntimeStateError(
                f"{op}: not inside s.timeline(); timing events are not captured"
            )
        if st.ordering.pending:  # spans made before the capture: their order is not captured
            try:
                st.ordering.flush(op)
            except KernelFault as exc:
                raise st.record_fault(exc) from None
        _driver.capture_begin(st.stream, op)
        self._saved_holds = st.liveness.begin_capture()
        st.refresh_fast_path()  # every captured launch goes where its owners are collected
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        st = self.state
        live = st.liveness
        owners = live.end_capture(self._saved_holds)  # the stream records again, even on error
        self._saved_holds = None
        st.refresh_fast_path()
        try:
            graph = _driver.capture_end(st.stream, "session.capture")
        except BackendError as end_exc:
            if isinstance(end_exc, KernelFault):
                end_exc = st.record_fault(end_exc)
            elif end_exc.result_name == _INVALIDATED and LEGACY in st.ordering.in_order_with:
                end_exc = BackendError(
                    f"{end_exc}: {_INVALIDATED_WHY}", end_exc.result_name, end_exc.result_code
                )
            if exc is not None:
                exc.add_note(f"tenferro: ending the capture also failed: {end_exc}")
                return
            raise end_exc from None
        finally:
            live.free_deferred()
        if not graph:
            return
        try:
            if exc is not None:  # the body raised: its partial graph is discarded
                _driver.graph_destroy(graph)
                return
            count = _driver.graph_node_count(graph)
            if count == 0:
                _driver.graph_destroy(graph)
                return
            if self.update is not None:
                handle, graph = graph, 0  # take_update owns it from here, refused or not
                self.update.take_update(handle, count, owners, "session.capture")
                self.graph = self.update
                return
            self.graph = Graph(st, graph, count, owners)
        except BaseException:
            if self.graph is None and graph:
                _driver.graph_destroy(graph)
            raise


@contextlib.contextmanager
def captured_elsewhere(st: Any) -> Iterator[None]:
    """Work the block enqueues while another library captures the session's stream.

    The session behaves as in its own capture (no fence events, no allocations, no waits; the
    launches take the path that collects their owners), and keeps those owners until it
    closes: the other library's graph may replay them for as long as it likes.
    """
    live = st.liveness
    saved = live.begin_capture()
    st.refresh_fast_path()
    try:
        yield
    finally:
        live.retain(live.end_capture(saved))
        st.refresh_fast_path()


def capture(st: Any, update: Graph | None = None) -> Capture:
    """``with s.capture() as cap: ...``: capture the block's work; then ``cap.graph``.

    ``cap.graph`` is a `Graph` to replay with ``graph.launch()``, or None when the block
    enqueued nothing. With ``update=graph`` the block's work (the same kernels in the same
    order, with other arguments) updates that graph in place, and ``cap.graph`` is it. See
    `tenferro.graph` for what is refused during a capture.
    """
    if update is not None and (type(update) is not Graph or update.state is not st):
        raise ValidationError(
            f"session.capture: update must be a Graph of this session, got {type(update).__name__}"
        )
    return Capture(st, update)
