"""Stream capture into CUDA graphs, and their replay on the session's stream.

``with s.capture() as cap: ...`` captures what the block enqueues (launches, copies, numba
kernels) in thread-local mode. The capture ends when the block ends, also when it raises (the
exception propagates and the stream stays usable). ``with s.capture(update=graph):`` records
the same work again with other arguments (other buffers, other scalars) and updates ``graph``
in place instead of making a new one, which costs far less than a new instantiation.
``cap.graph`` is a `Graph`, or None when nothing was captured. A Graph holds every owner its
captured work touched (tensors, foreign arrays, modules, numba kernels) for as long as it
exists, and refuses to launch after its session closed.

``graph.kernels`` are the kernels the capture launched through the session (``s.launch``,
ready and numba kernels, bound launches), in order, as `GraphKernel` s: ``update(i, arg)``
and ``set_args(args)`` give one of them new arguments for the replays to come, checked as a
launch checks them, without a capture; the graph holds the new spans' owners.

During a capture the session refuses what cannot be captured safely: allocations (their memory
would belong to the graph), host copies and synchronization, importing foreign arrays that need
an event on another stream, events, and nested captures. Tensors and Graphs dropped during a
capture are freed after it ends, not inside the graph.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from . import _driver
from ._liveness import capture_on_this_thread
from .conditions import GraphCondition
from .errors import BackendError, KernelFault, RuntimeStateError, ValidationError
from .interop.streams import LEGACY, check_context, order_after, stream_value
from .signature import display_name

__all__ = ["Capture", "Graph", "GraphKernel", "capture", "captured_elsewhere"]

_get_ident = threading.get_ident

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

    __slots__ = (
        "__weakref__",
        "_exec",
        "_exec_source",
        "_graph",
        "_launch_name",
        "kernels",
        "node_count",
        "owners",
        "state",
    )
    state: Any
    _graph: int
    _exec_source: int
    _exec: _driver.ExecutableGraph | None
    _launch_name: str  # how a replay is named among the session's last launches
    node_count: int
    owners: list[Any]
    kernels: tuple[GraphKernel, ...]

    @property
    def session(self) -> Any:
        """The `tenferro.Session` this graph belongs to."""
        return self.state.session

    def __init__(
        self,
        state: Any,
        graph: int,
        node_count: int,
        owners: list[Any],
        kernels: list[tuple[Any, ...]] | tuple[()] = (),
    ) -> None:
        self.state = state
        self._graph = self._exec_source = 0
        self._exec = None
        self.node_count = node_count
        self._launch_name = f"graph of {node_count} node(s)"
        self.owners = owners
        self.kernels = ()
        self._exec = _driver.ExecutableGraph(graph, state.stream, "session.capture")
        # owned from here on; before, the capture destroys it on failure. _graph is the graph
        # a new executable graph would be made from; _exec_source the one the executable graph
        # was made from (an update in place keeps it: its nodes name the executable's nodes).
        self._graph = self._exec_source = graph
        self.kernels = self._kernels_of(kernels)

    def _kernels_of(
        self, captured: list[tuple[Any, ...]] | tuple[()], exec_nodes: list[int] | None = None
    ) -> tuple[GraphKernel, ...]:
        """The `GraphKernel` s of what `SessionState.note_captured_kernel` recorded.

        ``exec_nodes``: the nodes of the executable graph's source that they are, in order,
        where that is another graph than theirs (an update in place); None: their own.
        """
        me = weakref.ref(self)
        records = [record for record in captured if record[0]]
        if exec_nodes is not None and len(exec_nodes) != len(records):
            return ()  # not the same kernels: none can be changed in place
        kernels = []
        for i, (node, fn, config, packed, args, spans) in enumerate(records):
            exec_node = node if exec_nodes is None else exec_nodes[i]
            kernels.append(GraphKernel(self.state, me, node, fn, config, packed, args, spans))
            kernels[-1].exec_node = exec_node
        return tuple(kernels)

    def set_kernel_params(
        self, exec_node: int, graph_node: int, param_pointers: int, op: str
    ) -> None:
        """Give a kernel node the arguments ``param_pointers`` points to (`GraphKernel`)."""
        if self._exec is None:
            raise RuntimeStateError(
                f"{op}: the graph cannot replay: making its executable graph again after a "
                "refused update failed; capture anew, or capture the same work again with "
                "update=graph"
            )
        self._exec.set_kernel_params(exec_node, graph_node, param_pointers, op)

    def _made_from(self, source: int) -> None:
        """The executable graph is now made from ``source``: the old source goes if unused."""
        old, self._exec_source = self._exec_source, source
        if old and old not in (source, self._graph):
            _driver.graph_destroy(old)

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
        exec_graph = self._exec
        # The steady state: on the session's stream, outside a capture and a timeline.
        if (
            stream is None
            and exec_graph is not None
            and st.fast_path_ok
            and _get_ident() == st.thread
        ):
            try:
                st.enqueue_fast(op, self._launch_name, exec_graph.launch, op)
            except KernelFault as exc:
                raise st.record_fault(exc) from None
            st.liveness.hold(self)  # the graph and its owners live until the stream passes
            return
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
        name = self._launch_name
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

    def take_update(
        self,
        graph: int,
        node_count: int,
        owners: list[Any],
        op: str,
        kernels: list[tuple[Any, ...]] | tuple[()] = (),
    ) -> None:
        """Take the node parameters of ``graph`` (a new capture of the same work) and its owners.

        ``kernels`` (the new capture's) replace `kernels`; the old `GraphKernel` s refuse
        updates from then on.

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
            why, in_place = None, False
        else:
            why, in_place = self._exec.update(graph, op), True
            if why is not None:  # the driver may have left it part-updated: made anew
                stale, self._exec = self._exec, None
                stale.destroy()  # launches in flight finish first; the driver frees it after
                try:
                    self._exec = _driver.ExecutableGraph(self._graph, self.state.stream, op)
                except BaseException:  # the graph can no longer replay; graph is still owned
                    _driver.graph_destroy(graph)
                    raise
                self._made_from(self._graph)  # the kernels' nodes are the executable's again
                for kernel in self.kernels:
                    kernel.made_anew()
        if why is not None:
            _driver.graph_destroy(graph)
            raise ValidationError(
                f"{op}: update=graph: the new capture is not the same work as the graph's, so "
                f"it cannot update it ({why}); capture without update= for a new graph"
            )
        self.state.liveness.hold(self.owners)  # replays in flight may still use them
        old_kernels = self.kernels
        if old_kernels:  # and the spans given to its kernels since
            self.state.liveness.hold(old_kernels)
            for kernel in old_kernels:
                kernel.retire()
        old_graphs = {self._graph, self._exec_source}
        self._graph = graph
        self.node_count, self.owners = node_count, owners
        if in_place:  # the executable graph is still the one made from _exec_source
            exec_nodes = [kernel.exec_node for kernel in old_kernels]
            self.kernels = self._kernels_of(kernels, exec_nodes)
        else:
            self._exec_source = graph
            self.kernels = self._kernels_of(kernels)
        for unused in old_graphs - {self._graph, self._exec_source, 0}:
            _driver.graph_destroy(unused)

    def __del__(self) -> None:
        exec_graph, graph = getattr(self, "_exec", None), getattr(self, "_graph", 0)
        source = getattr(self, "_exec_source", 0)
        self._exec, self._graph, self._exec_source = None, 0, 0
        graphs = (graph, source) if source and source != graph else (graph,)
        if exec_graph is None and not any(graphs):
            return
        try:  # never raise from a finaliser (at exit, the modules' globals may be gone)
            if _driver.forked_child():  # a forked child's graphs are the parent's
                return
            live = getattr(getattr(self, "state", None), "liveness", None)
            if live is None or not live.capturing:  # its session's capture, or one on this thread
                live = capture_on_this_thread()
            if live is not None and live.capturing:  # a destroy now would invalidate the capture
                live.defer_release(lambda: _destroy(exec_graph, graphs))
            else:
                _destroy(exec_graph, graphs)
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"Graph({self.node_count} node(s), {len(self.owners)} owner group(s))"


class GraphKernel:
    """A kernel launch captured in a `Graph`, whose arguments can change between replays.

    ``graph.kernels`` lists them in the order they were launched. `update` and `set_args`
    check new arguments as ``s.launch`` checks them (the kernel's parameter list, spans of
    this session, exclusive writable spans) and give them to the graph's node for the
    replays to come, without a new capture; replays already enqueued keep the old ones. The
    graph holds the new spans; the spans replaced are held until the stream has passed the
    replays enqueued so far. The function, grid and block stay those captured.
    """

    __slots__ = (
        "_graph",
        "_node",
        "_param_block",
        "_snapshot",
        "args",
        "config",
        "exec_node",
        "fn",
        "spans",
        "state",
    )
    state: Any
    fn: Any
    config: Any
    args: list[Any]
    spans: list[Any]
    exec_node: int
    _graph: Callable[[], Graph | None] | None
    _node: int
    _param_block: Any
    _snapshot: bytes

    def __init__(
        self,
        state: Any,
        graph: Callable[[], Graph | None],
        node: int,
        fn: Any,
        config: Any,
        packed: bytes,
        args: tuple[Any, ...],
        spans: list[Any],
    ) -> None:
        self.state = state
        self._graph = graph
        self._node = node  # in the graph a new executable graph would be made from
        # the same node in the graph the executable graph was made from (another graph after
        # an update in place: the Graph sets it then)
        self.exec_node = node
        self.fn = fn
        self.config = config
        self._param_block = None  # made at the first change, from the bytes captured
        self._snapshot = packed
        self.args = list(args)
        self.spans = list(spans)

    @property
    def session(self) -> Any:
        """The `tenferro.Session` this kernel's graph belongs to."""
        return self.state.session

    @property
    def name(self) -> str:
        """The kernel's name, as launch errors and timelines show it."""
        return display_name(self.fn.name)

    def update(self, index: int, arg: Any) -> None:
        """Replace argument ``index`` for the replays to come; only that slot is checked.

        A refused update changes nothing: the node's arguments, ``args`` and ``spans`` stay
        as they were.

        Args:
            index: The argument's position, from 0 to ``len(args) - 1``.
            arg: The new argument, checked against that parameter as `Session.launch` checks
                it (and, a span, for overlaps with the other spans).

        Raises:
            ValidationError: ``index`` is out of range, or ``arg`` is refused for that
                parameter or overlaps another span where one of them is writable.
            RuntimeStateError: The session is closed, used from another thread or capturing,
                the graph is gone, or it was updated by a new capture since (its kernels are
                new ones).
            BackendError: The driver refused the new arguments.
            KernelFault: A kernel fault has stopped the session.
        """
        op = "graph_kernel.update"
        graph, block = self._check(op)
        saved = block.snapshot()
        args, spans = block.replace(self.args, index, arg, self.state, op)
        self._give(graph, block, saved, args, spans, op)

    def set_args(self, args: list[Any] | tuple[Any, ...]) -> None:
        """Replace every argument for the replays to come, all checked as a launch's are.

        For changes one `update` at a time would refuse on the way, such as two spans that
        swap places. A refusal changes nothing.

        Args:
            args: The kernel's arguments, as `Session.launch` takes them.

        Raises:
            ValidationError: ``args`` is not a list or tuple, or is refused as a launch's
                would be (count, types, sessions, overlaps).
            RuntimeStateError: As for `update`.
            BackendError: The driver refused the new arguments.
            KernelFault: A kernel fault has stopped the session.
        """
        op = "graph_kernel.set_args"
        graph, block = self._check(op)
        if not isinstance(args, (list, tuple)):
            raise ValidationError(
                f"{op}: args must be a list or tuple of kernel arguments, got {type(args).__name__}"
            )
        saved = block.snapshot()
        try:
            spans = block.pack(args, self.state, op)
        except BaseException:
            block.restore(saved)
            raise
        self._give(graph, block, saved, list(args), list(spans), op)

    def retire(self) -> None:
        """Refuse changes from now on: a new capture replaced the graph's kernels."""
        self._graph = None

    def made_anew(self) -> None:
        """The executable graph was made again from this kernel's own graph: its node is it."""
        self.exec_node = self._node

    def _check(self, op: str) -> tuple[Graph, Any]:
        """The graph and the packed block to change, once the change may go ahead."""
        st = self.state
        st.check_use(op)
        if st.liveness.capturing:
            raise RuntimeStateError(f"{op}: not during a capture")
        graph = self._graph() if self._graph is not None else None
        if graph is None:
            why = "is gone" if self._graph is not None else "was updated by a new capture since"
            raise RuntimeStateError(
                f"{op}: the graph of {self.name!r} {why}; take its kernels from graph.kernels"
            )
        block = self._param_block
        if block is None:
            block = self._param_block = self.fn.param_block.fresh()
            block.restore(self._snapshot)
        return graph, block

    def _give(
        self, graph: Graph, block: Any, saved: bytes, args: list[Any], spans: list[Any], op: str
    ) -> None:
        """Hand the packed block to the node; on a refusal, put the bytes back."""
        try:
            graph.set_kernel_params(self.exec_node, self._node, block.address, op)
        except KernelFault as exc:
            block.restore(saved)
            raise self.state.record_fault(exc) from None
        except BaseException:
            block.restore(saved)
            raise
        self.state.liveness.hold(self.spans)  # replays already enqueued may still read them
        self.args, self.spans = args, spans

    def __repr__(self) -> str:
        return f"GraphKernel({self.name}, {self.config})"


def _replay_on(exec_graph: _driver.ExecutableGraph, stream: int, st: Any, op: str) -> None:
    """Replay on ``stream``, then order the session's stream after it (a timeline times both)."""
    exec_graph.launch_on(stream, op)
    order_after(st.stream, stream, st.import_event, op)


def _destroy(exec_graph: _driver.ExecutableGraph | None, graphs: tuple[int, ...]) -> None:
    """Destroy a Graph's executable graph and graphs; never raises (a finaliser calls it)."""
    for destroy in (
        exec_graph and exec_graph.destroy,
        *(graph and functools.partial(_driver.graph_destroy, graph) for graph in graphs),
    ):
        try:
            if destroy:
                destroy()
        except Exception:
            pass


class Capture:
    """The context manager ``s.capture()`` returns; ``graph`` is set when the block ends.

    Inside the block, `condition`, `capture_if` and `capture_while` add conditional nodes
    whose condition a kernel of the graph sets.
    """

    __slots__ = (
        "_bodies",
        "_conditions",
        "_paused_graph",
        "_saved_holds",
        "graph",
        "running",
        "state",
        "update",
    )
    _saved_holds: list[Any] | None
    _bodies: list[int]
    _conditions: list[GraphCondition]
    _paused_graph: int
    graph: Graph | None
    running: bool
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
        self.running = False  # inside the block: conditions are arguments then
        self._bodies = []  # the conditional nodes whose bodies are being captured, outermost first
        self._paused_graph = 0  # the graph a conditional body paused: ours if the capture fails
        self._conditions = []  # the conditions made in the block

    def condition(self, default: int = 1) -> GraphCondition:
        """A condition for `capture_if` or `capture_while`, which a kernel of the graph sets.

        Pass it to a kernel where the kernel takes a ``cudaGraphConditionalHandle``; the
        kernel calls ``cudaGraphSetConditional(handle, value)`` (declared by
        ``<cuda_device_runtime_api.h>``, or by the kernel itself as
        ``extern "C" __device__ void cudaGraphSetConditional(unsigned long long, unsigned)``;
        the driver provides it when the module loads). At the start of
        every replay the condition is ``default`` again. Made inside a conditional body, it
        drives a node of that body.

        Args:
            default: The value at the start of every replay, from 0 to 2**32 - 1: 1 runs a
                while loop's body at least once, and an if's body unless a kernel sets 0.

        Returns:
            A `GraphCondition` of this capture.

        Raises:
            ValidationError: ``default`` is not an int in range, or the driver has no
                conditional graph nodes (CUDA 12.4 or later).
            RuntimeStateError: Not inside this capture's block, or the session is closed or
                used from another thread.
            BackendError: The driver refused to make the condition.
        """
        op = "capture.condition"
        st = self._check_running(op)
        if not isinstance(default, int) or not 0 <= default <= 0xFFFFFFFF:
            raise ValidationError(f"{op}: {default=} must be an int from 0 to 4294967295")
        version = _driver.driver_version()
        if version < 12040:
            raise ValidationError(
                f"{op}: conditional graph nodes need a CUDA 12.4 or later driver; this one is "
                f"CUDA {version // 1000}.{version % 1000 // 10}"
            )
        handle = _driver.conditional_handle_create(st.stream, st.context.handle, default, op)
        made_in = self._bodies[-1] if self._bodies else 0
        self._conditions.append(GraphCondition(st, self, handle, int(default), made_in))
        return self._conditions[-1]

    def capture_if(self, condition: GraphCondition) -> contextlib.AbstractContextManager[None]:
        """``with cap.capture_if(condition):`` the block's work runs at a replay if it is set.

        The block's work is captured into the body of an if node that follows the work
        captured so far; the work after the block follows the node. Each replay runs the
        body when ``condition`` is nonzero at that point. Kernels launched in the body are
        not in ``graph.kernels``.

        Args:
            condition: A `GraphCondition` of this capture, made at this level (not inside
                another body than the one it was made in), that drives no node yet.

        Returns:
            A context manager for the body.

        Raises:
            ValidationError: ``condition`` is not such a condition.
            RuntimeStateError: Not inside this capture's block.
            BackendError: The driver refused the node.
        """
        return self._body(condition, False, "capture.capture_if")

    def capture_while(self, condition: GraphCondition) -> contextlib.AbstractContextManager[None]:
        """``with cap.capture_while(condition):`` the block's work repeats while it is set.

        As `capture_if`, with a while node: at a replay the body runs again and again for as
        long as ``condition`` is nonzero when a pass ends (and when the node is reached). A
        kernel of the body sets it to 0 to end the loop.

        Args:
            condition: A `GraphCondition` of this capture (as for `capture_if`).

        Returns:
            A context manager for the body.

        Raises:
            ValidationError: ``condition`` is not such a condition.
            RuntimeStateError: Not inside this capture's block.
            BackendError: The driver refused the node.
        """
        return self._body(condition, True, "capture.capture_while")

    def _unused_conditions(self) -> ValidationError | None:
        """The refusal of a capture whose conditions do not all drive a node, or None."""
        unused = [c for c in self._conditions if c.drives is None]
        if not unused:
            return None
        return ValidationError(
            f"session.capture: {len(unused)} condition(s) made with cap.condition() drive no "
            "node; the driver cannot make a graph with them: give each a capture_if or "
            "capture_while block, or make only those the capture uses"
        )

    def _check_running(self, op: str) -> Any:
        st = self.state
        st.check_use(op)
        if not self.running:
            raise RuntimeStateError(f"{op}: only inside the capture's with block")
        return st

    @contextlib.contextmanager
    def _body(self, condition: Any, loop: bool, op: str) -> Iterator[None]:
        st = self._check_running(op)
        if type(condition) is not GraphCondition or condition.capture is not self:
            got = "one of another capture"
            if type(condition) is not GraphCondition:
                got = type(condition).__name__
            raise ValidationError(
                f"{op}: condition must be a GraphCondition of this capture (cap.condition()), "
                f"got {got}"
            )
        if condition.drives is not None:
            raise ValidationError(
                f"{op}: condition already drives an {condition.drives} node; a condition drives "
                "one node: make another with cap.condition()"
            )
        if condition.made_in != (self._bodies[-1] if self._bodies else 0):
            raise ValidationError(
                f"{op}: condition was made in another conditional body than this one; make it "
                "where its node goes"
            )
        try:
            graph, node = _driver.conditional_begin(
                st.stream, st.context.handle, condition.handle, loop, op
            )
        except KernelFault as exc:
            raise st.record_fault(exc) from None
        if not self._bodies:
            self._paused_graph = graph
        condition.drives = "while" if loop else "if"
        self._bodies.append(node)
        kernels, st.capture_kernels = st.capture_kernels, None  # a body's kernels: not listed
        try:
            yield
        except BaseException as exc:
            try:
                _driver.conditional_end(st.stream, graph, node, op)
            except BackendError as end_exc:
                if isinstance(end_exc, KernelFault):
                    end_exc = st.record_fault(end_exc)
                exc.add_note(f"tenferro: ending the {condition.drives} body also failed: {end_exc}")
            raise
        else:
            try:
                _driver.conditional_end(st.stream, graph, node, op)
            except KernelFault as exc:
                raise st.record_fault(exc) from None
        finally:
            self._bodies.pop()
            st.capture_kernels = kernels

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
        st.capture_kernels = []
        st.refresh_fast_path()  # every captured launch goes where its owners are collected
        self.running = True
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        st = self.state
        live = st.liveness
        self.running = False
        owners = live.end_capture(self._saved_holds)  # the stream records again, even on error
        self._saved_holds = None
        kernels, st.capture_kernels = st.capture_kernels or [], None
        st.refresh_fast_path()
        paused, self._paused_graph = self._paused_graph, 0
        try:
            graph = _driver.capture_end(st.stream, "session.capture")
            if not graph and paused:  # a capture into our own graph ended without it
                _driver.graph_destroy(paused)
        except BackendError as end_exc:
            if paused:  # a capture into our own graph leaves it to us when it fails
                with contextlib.suppress(BackendError):
                    _driver.graph_destroy(paused)
            if isinstance(end_exc, KernelFault):
                end_exc = st.record_fault(end_exc)
            elif end_exc.result_name == _INVALIDATED and LEGACY in st.ordering.in_order_with:
                end_exc = BackendError(
                    f"{end_exc}: {_INVALIDATED_WHY}", end_exc.result_name, end_exc.result_code
                )
            if exc is not None:
                exc.add_note(f"tenferro: ending the capture also failed: {end_exc}")
                return
            unused = self._unused_conditions()
            if unused is not None:
                raise unused from None
            raise end_exc from None
        finally:
            live.free_deferred()
        if not graph:
            return
        try:
            if exc is not None:  # the body raised: its partial graph is discarded
                _driver.graph_destroy(graph)
                return
            unused = self._unused_conditions()
            if unused is not None:  # the driver would refuse the graph with INVALID_VALUE
                _driver.graph_destroy(graph)
                graph = 0
                raise unused
            count = _driver.graph_node_count(graph)
            if count == 0:
                _driver.graph_destroy(graph)
                return
            if self.update is not None:
                handle, graph = graph, 0  # take_update owns it from here, refused or not
                self.update.take_update(handle, count, owners, "session.capture", kernels)
                self.graph = self.update
                return
            self.graph = Graph(st, graph, count, owners, kernels)
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
