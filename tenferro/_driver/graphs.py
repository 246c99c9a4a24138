"""CUDA graphs: stream capture into a graph, and the executable graph that replays it.

A capture is thread-local (other threads' calls are unaffected by it), and an empty one is
graph 0. `ExecutableGraph` is instantiated once, bound to the stream it replays on, and updated
in place where the driver can take the new graph's parameters. A conditional node (if, while)
is added to a running capture by `conditional_begin`, which pauses the capture and captures
the same stream into the node's body until `conditional_end` resumes it after the node.
"""

from __future__ import annotations

from typing import Any

from .results import check, cu, fail, result_name

__all__ = [
    "ExecutableGraph",
    "capture_begin",
    "capture_end",
    "capture_last_node",
    "conditional_begin",
    "conditional_end",
    "conditional_handle_create",
    "graph_destroy",
    "graph_node_count",
]


def capture_begin(stream: int, op: str) -> None:
    """Begin capturing ``stream`` into a graph (thread-local mode: other threads unaffected)."""
    check(op, cu.cuStreamBeginCapture(cu.CUstream(stream), _thread_local()))


def _thread_local() -> object:
    return cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL


def capture_end(stream: int, op: str) -> int:
    """End the capture of ``stream``; the captured graph's handle (0 when none was made)."""
    return int(check(op, cu.cuStreamEndCapture(cu.CUstream(stream))) or 0)


def _capture_info(s: object, op: str) -> tuple[Any, list[Any]]:
    """(the graph ``s`` is capturing into, the nodes its next work will depend on)."""
    info = check(op, cu.cuStreamGetCaptureInfo(s))
    # (status, id, graph, dependencies, ...): CUDA 13 adds the edge data before the count
    return info[2], info[3]


def capture_last_node(stream: int, op: str) -> int:
    """The node the work last captured on ``stream`` became; 0 where it is not one node.

    A capturing stream's dependencies are what its next work will wait for: just after a
    launch, the launch's kernel node alone.
    """
    dependencies = _capture_info(cu.CUstream(stream), op)[1]
    return int(dependencies[0]) if len(dependencies) == 1 else 0


def conditional_handle_create(stream: int, context: int, default: int, op: str) -> int:
    """A condition of the graph ``stream`` is capturing into, ``default`` at every replay."""
    graph = _capture_info(cu.CUstream(stream), op)[0]
    res = cu.cuGraphConditionalHandleCreate(
        graph, cu.CUcontext(context), default, cu.CU_GRAPH_COND_ASSIGN_DEFAULT
    )
    return int(check(op, res))


def conditional_begin(
    stream: int, context: int, condition: int, loop: bool, op: str
) -> tuple[int, int]:
    """Add an if (a while, ``loop``) node on ``condition`` after the work captured so far.

    Then the capture of ``stream`` pauses and the stream captures into the node's body; the
    caller ends that with `conditional_end`. Returns (the paused graph, the node).
    """
    s = cu.CUstream(stream)
    graph, dependencies = _capture_info(s, op)
    params = cu.CUgraphNodeParams()
    params.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    params.conditional.handle = condition
    params.conditional.type = (
        cu.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE
        if loop
        else cu.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_IF
    )
    params.conditional.size = 1
    params.conditional.ctx = cu.CUcontext(context)
    node = check(op, cu.cuGraphAddNode(graph, dependencies, None, len(dependencies), params))
    body = params.conditional.phGraph_out[0]
    check(op, cu.cuStreamEndCapture(s))  # paused: the graph is ours until it resumes
    err = cu.cuStreamBeginCaptureToGraph(s, body, None, None, 0, _thread_local())[0]
    if err:
        _resume(s, graph, node, op, err)
        raise fail(op, err)
    return int(graph), int(node)


def conditional_end(stream: int, graph: int, node: int, op: str) -> None:
    """End the capture of a conditional node's body; the capture of ``graph`` resumes after it."""
    s = cu.CUstream(stream)
    err = cu.cuStreamEndCapture(s)[0]
    _resume(s, cu.CUgraph(graph), cu.CUgraphNode(node), op, err)
    if err:
        raise fail(op, err)


def _resume(s: object, graph: object, node: object, op: str, before: object) -> None:
    """Capture ``s`` into ``graph`` again, the next work after ``node``.

    ``before`` is the failure that came first (0: none), noted on a failure to resume.
    """
    err = cu.cuStreamBeginCaptureToGraph(s, graph, [node], None, 1, _thread_local())[0]
    if err:
        exc = fail(op, err)
        if before:
            exc.add_note(f"tenferro: before it, the body's capture failed: {result_name(before)}")
        raise exc


def graph_node_count(graph: int) -> int:
    """How many nodes a graph has."""
    res = cu.cuGraphGetNodes(cu.CUgraph(graph), 0)
    return int(check("cuGraphGetNodes", res)[1])


def graph_destroy(graph: int) -> None:
    """Destroy a graph."""
    check("cuGraphDestroy", cu.cuGraphDestroy(cu.CUgraph(graph)))


class ExecutableGraph:
    """An instantiated graph bound to the stream it replays on; destroyed by `destroy`."""

    __slots__ = ("_exec", "_stream", "handle")

    def __init__(self, graph: int, stream: int, op: str) -> None:
        self._exec = check(op, cu.cuGraphInstantiate(cu.CUgraph(graph), 0))
        self._stream = cu.CUstream(stream)
        self.handle = int(self._exec)

    def launch(self, op: str) -> None:
        """Enqueue the graph on its stream."""
        err = cu.cuGraphLaunch(self._exec, self._stream)[0]
        if err:
            raise fail(op, err)

    def launch_on(self, stream: int, op: str) -> None:
        """Enqueue the graph on another ``stream`` (the caller orders it with its own)."""
        err = cu.cuGraphLaunch(self._exec, cu.CUstream(stream))[0]
        if err:
            raise fail(op, err)

    def update(self, graph: int, op: str) -> str | None:
        """Take ``graph``'s node parameters in place (cuGraphExecUpdate); None when it did.

        Otherwise the reason, the CUgraphExecUpdateResult's name (the topology changed, a node's
        function changed, ...), and this executable graph may be left part-updated: the caller
        makes a new one from its own graph.
        """
        err, info = cu.cuGraphExecUpdate(self._exec, cu.CUgraph(graph))
        if err == cu.CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE:
            # cuda.bindings returns no result info with an error: the error's name is the reason
            return info.result.name if info is not None else err.name
        check(op, (err,))
        return None

    def set_kernel_params(
        self, exec_node: int, graph_node: int, param_pointers: int, op: str
    ) -> None:
        """Give a kernel node new arguments for the replays to come, here and in its graph.

        ``param_pointers`` is the address of the kernel's array of parameter pointers; the
        driver copies the values, and replays already enqueued keep the old ones.
        ``graph_node`` is the node in the graph an executable graph would be made from again
        (it takes the arguments too), ``exec_node`` the same node in the graph this one was
        made from (another graph after an update in place). The function, dimensions and
        attributes stay.
        """
        node = cu.CUgraphNode(graph_node)
        params = check(op, cu.cuGraphKernelNodeGetParams(node))
        before = params.kernelParams  # the graph node's own copy of the values it has
        params.kernelParams, params.extra = param_pointers, 0
        in_exec = cu.CUgraphNode(exec_node)
        check(op, cu.cuGraphExecKernelNodeSetParams(self._exec, in_exec, params))
        err = cu.cuGraphKernelNodeSetParams(node, params)[0]
        if err:  # the executable graph goes back to the values its graph still has
            params.kernelParams = before
            back = cu.cuGraphExecKernelNodeSetParams(self._exec, in_exec, params)[0]
            exc = fail(op, err)
            if back:
                exc.add_note(
                    f"tenferro: putting the old arguments back also failed ({result_name(back)}): "
                    "the executable graph has the new ones; capture the graph anew"
                )
            raise exc

    def destroy(self) -> None:
        """Destroy the executable graph (once; later calls do nothing)."""
        if self.handle:
            self.handle = 0
            check("cuGraphExecDestroy", cu.cuGraphExecDestroy(self._exec))
