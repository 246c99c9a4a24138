"""Graph capture and replay (tenferro.graph), on a GPU."""

import gc
import re
import types
import typing
import weakref

import numpy as np
import pytest
from _sources import AXPY, N
from _sources import raw_and_numba_axpy as _kernels

import tenferro as tf
from tenferro._liveness import Liveness
from tenferro.session import state_of


@pytest.mark.gpu
def test_captured_sequence_replays_like_eager(session, rng):
    axpy, nk = _kernels(session)
    x0, y0 = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    cfg = tf.LaunchConfig.flat(N)

    def enqueue(s, y, x, z):
        s.launch(axpy, cfg, [s.tensor_mut(y), s.tensor(x), tf.f32(0.25), tf.u32(N)])
        s.launch(nk, cfg, [s.tensor_mut(z), s.tensor(y), tf.f32(-0.5), N])
        s.copy(x, z)

    ye, xe, ze = session.upload(y0), session.upload(x0), session.upload(y0)
    reps = 7
    for _ in range(reps):
        enqueue(session, ye, xe, ze)
    eager = session.download(ze)

    yg, xg, zg = session.upload(y0), session.upload(x0), session.upload(y0)
    with session.capture() as cap:
        enqueue(session, yg, xg, zg)
    assert cap.graph is not None and cap.graph.node_count == 3
    for _ in range(reps):
        cap.graph.launch()
    np.testing.assert_array_equal(session.download(zg), eager)  # the replay is the same work
    y, x, z = (a.astype(np.float64) for a in (y0, x0, y0))
    for _ in range(reps):  # and both are right, against float64 on the host
        y = 0.25 * x + y
        z = z + -0.5 * y
        x = z.copy()
    np.testing.assert_allclose(eager, z, rtol=1e-5, atol=1e-5 * np.abs(z).max())


@pytest.mark.gpu
def test_a_loop_of_captures_drops_each_graph_during_the_next_capture(session, rng):
    # `with s.capture() as cap:` rebinds cap once the next capture has begun: the last graph
    # goes then, and is destroyed after that capture (a destroy during it invalidates it).
    axpy, _ = _kernels(session)
    x0, y0 = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    x, y = session.upload(x0), session.upload(y0)
    cfg = tf.LaunchConfig.flat(N)
    for a in (0.5, -1.0, 2.0, 0.25):
        with session.capture() as cap:
            session.launch(axpy, cfg, [session.tensor_mut(y), session.tensor(x), tf.f32(a), N])
        cap.graph.launch()
    assert cap.graph.node_count == 1
    want = y0.astype(np.float64) + (0.5 - 1.0 + 2.0 + 0.25) * x0.astype(np.float64)
    np.testing.assert_allclose(session.download(y), want, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_empty_capture_gives_none(session):
    with session.capture() as cap:
        pass
    assert cap.graph is None


@pytest.mark.gpu
def test_raising_body_ends_the_capture_and_the_stream_stays_usable(session, rng):
    axpy, _ = _kernels(session)
    y = session.alloc_zeros(N, np.float32)
    x0 = rng.standard_normal(N).astype(np.float32)
    x = session.upload(x0)
    cfg = tf.LaunchConfig.flat(N)
    with pytest.raises(KeyError, match="user"):
        with session.capture() as cap:
            session.launch(axpy, cfg, [session.tensor_mut(y), session.tensor(x), 1.0, N])
            raise KeyError("user")
    assert cap.graph is None
    session.launch(axpy, cfg, [session.tensor_mut(y), session.tensor(x), 3.0, N])
    np.testing.assert_allclose(session.download(y), 3.0 * x0.astype(np.float64), rtol=1e-6)


@pytest.mark.gpu
def test_graph_holds_its_tensors_after_python_drops_them(session, rng):
    axpy, _ = _kernels(session)
    x0 = rng.standard_normal(N).astype(np.float32)
    out = session.alloc_zeros(N, np.float32)
    x = session.upload(x0)
    gone = weakref.ref(x)
    with session.capture() as cap:
        session.launch(
            axpy, tf.LaunchConfig.flat(N), [session.tensor_mut(out), session.tensor(x), 2.0, N]
        )
    graph = cap.graph
    del x, cap
    gc.collect()
    assert gone() is not None, "the graph must hold the tensors its launches read"
    churn = [session.upload(rng.standard_normal(N).astype(np.float32)) for _ in range(3)]
    for _ in range(4):
        graph.launch()
    np.testing.assert_allclose(session.download(out), 8.0 * x0.astype(np.float64), rtol=1e-6)
    del graph, churn
    session.synchronize()
    gc.collect()
    assert gone() is None, "dropping the graph lets its tensors go"


@pytest.mark.gpu
def test_capture_refusals(session):
    axpy, _ = _kernels(session)
    y = session.alloc_zeros(16, np.float32)
    ym, yr = session.tensor_mut(y), session.tensor(session.alloc_zeros(16, np.float32))
    with session.capture() as cap:
        with pytest.raises(
            tf.RuntimeStateError,
            match=r"session\.alloc_output: not allowed "
            r"during s\.capture\(\)",
        ):
            session.alloc_output(4, np.float32)
        with pytest.raises(tf.RuntimeStateError, match=r"session\.synchronize: not allowed"):
            session.synchronize()
        with pytest.raises(tf.RuntimeStateError, match=r"session\.download: not allowed"):
            session.download(y)
        with pytest.raises(tf.RuntimeStateError, match=r"session\.capture: a capture is already"):
            with session.capture():
                pass
        session.launch(axpy, tf.LaunchConfig.flat(16), [ym, yr, 1.0, 16])
    with pytest.raises(
        tf.ValidationError,
        match=r"^graph\.launch: stream='5' must be None, an int or an object with __cuda_stream__",
    ):
        cap.graph.launch(stream="5")
    cap.graph.launch()
    session.synchronize()


@pytest.mark.gpu
def test_tensor_dropped_during_capture_is_freed_after_it(session, rng):
    axpy, _ = _kernels(session)
    x0 = rng.standard_normal(16).astype(np.float32)
    y, x = session.alloc_zeros(16, np.float32), session.upload(x0)
    scratch = session.alloc_zeros(1 << 20, np.float32)
    with session.capture() as cap:
        session.launch(
            axpy, tf.LaunchConfig.flat(16), [session.tensor_mut(y), session.tensor(x), 1.0, 16]
        )
        del scratch  # must not become a free node of the graph
        assert len(state_of(session).liveness.deferred_frees) == 1
    assert state_of(session).liveness.deferred_frees == []
    assert cap.graph.node_count == 1
    cap.graph.launch()
    cap.graph.launch()
    np.testing.assert_allclose(session.download(y), 2.0 * x0.astype(np.float64), rtol=1e-6)


@pytest.mark.gpu
def test_graph_replay_refused_after_the_session_closes():
    from conftest import gpu_reason

    if gpu_reason():
        pytest.skip(gpu_reason())
    with tf.Session() as s:
        fn = s.compile(AXPY).function("axpy")
        y, x = s.alloc_zeros(8, np.float32), s.alloc_zeros(8, np.float32)
        with s.capture() as cap:
            s.launch(fn, tf.LaunchConfig.flat(8), [s.tensor_mut(y), s.tensor(x), 1.0, 8])
    with pytest.raises(tf.RuntimeStateError, match=r"graph\.launch: the session is closed"):
        cap.graph.launch()


# --- updating a graph in place: Graph.take_update through a stand-in driver ---------------------


class _Exec:
    """A stand-in executable graph: records what it was made from and asked."""

    made: typing.ClassVar[list] = []

    def __init__(self, graph, stream, op):
        if _Exec.fail:
            raise tf.BackendError(f"{op}: the driver returned CUDA_ERROR_OUT_OF_MEMORY")
        self.graph, self.stream, self.op, self.destroyed, self.updates = graph, stream, op, 0, []
        self.params = []
        _Exec.made.append(self)

    def update(self, graph, op):
        self.updates.append((graph, op))
        return self.refuse

    def set_kernel_params(self, exec_node, graph_node, param_pointers, op):
        if self.refuse_params:
            raise tf.BackendError(f"{op}: the driver returned CUDA_ERROR_INVALID_VALUE")
        self.params.append((exec_node, graph_node, param_pointers, op))

    refuse = None
    fail = False
    refuse_params = False

    def destroy(self):
        self.destroyed += 1
        if self.destroy_raises:
            raise tf.BackendError("cuGraphExecDestroy failed")

    destroy_raises = False


class _CapturingSession:
    """What a Graph and a Capture ask of their session: stream 0x5, blocking unless told
    otherwise, and a real Liveness."""

    def __init__(self, in_order_with=frozenset((0x5, 1))):
        import types

        self.stream, self.active_timeline = 0x5, None
        self.liveness = Liveness(0x5, 256, 256 << 20)
        self.ordering = types.SimpleNamespace(pending=[], in_order_with=in_order_with)

    def check_use(self, op):
        pass

    def refresh_fast_path(self):
        pass


@pytest.fixture
def stand_in_graph(monkeypatch):
    """A Graph of graph handle 0x10 over a stand-in driver; the handles destroyed are listed."""
    from tenferro import graph as graph_part

    destroyed = []
    _Exec.made, _Exec.refuse, _Exec.fail, _Exec.destroy_raises = [], None, False, False
    _Exec.refuse_params = False
    monkeypatch.setattr(graph_part._driver, "ExecutableGraph", _Exec)
    monkeypatch.setattr(graph_part._driver, "graph_destroy", destroyed.append)
    g = graph_part.Graph(_CapturingSession(), 0x10, 2, ["old owners"])
    return g, destroyed


def test_a_graph_is_made_on_its_sessions_stream_and_destroyed_once_when_dropped(stand_in_graph):
    from tenferro import graph as graph_part

    session, destroyed = stand_in_graph[0].state, stand_in_graph[1]
    g = graph_part.Graph(session, 0x30, 1, ["owners"])
    its_exec = g._exec
    assert (its_exec.graph, its_exec.stream, its_exec.op) == (0x30, 0x5, "session.capture")
    _Exec.destroy_raises = True  # a finaliser never raises, and the graph still goes
    del g
    assert its_exec.destroyed == 1 and destroyed == [0x30]


def test_a_graph_dropped_during_a_capture_is_destroyed_after_it(stand_in_graph):
    # On a blocking stream a cuGraphExecDestroy during a capture invalidates the capture: a
    # loop of `with s.capture() as cap:` drops the last graph just after the next one began.
    from tenferro import graph as graph_part

    session, destroyed = stand_in_graph[0].state, stand_in_graph[1]
    live = session.liveness
    g = graph_part.Graph(session, 0x30, 1, ["owners"])
    its_exec = g._exec
    saved = live.begin_capture()
    del g
    assert its_exec.destroyed == 0 and destroyed == []
    live.end_capture(saved)
    live.free_deferred()  # what Capture.__exit__ calls once the capture has ended
    assert its_exec.destroyed == 1 and destroyed == [0x30]
    g = graph_part.Graph(session, 0x40, 1, ["owners"])  # outside a capture: at once
    del g
    assert destroyed == [0x30, 0x40] and live.deferred_releases == []


@pytest.mark.parametrize(
    ("in_order_with", "result", "explained"),
    [
        (frozenset((0x5, 1)), "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", True),
        (frozenset((0x5,)), "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", False),  # non-blocking
        (frozenset((0x5, 1)), "CUDA_ERROR_ILLEGAL_STATE", False),
    ],
)
def test_an_invalidated_capture_on_a_blocking_stream_says_why(
    monkeypatch, in_order_with, result, explained
):
    from tenferro import graph as graph_part

    def refuse(stream, op):
        assert stream == 0x5  # the session's
        raise tf.BackendError(f"{op}: the driver returned {result}", result, 901)

    monkeypatch.setattr(graph_part._driver, "capture_begin", lambda stream, op: None)
    monkeypatch.setattr(graph_part._driver, "capture_end", refuse)
    s = _CapturingSession(in_order_with)
    s.liveness.hold("before")  # held before the capture: held again after it
    why = r"_INVALIDATED: the session.s stream is blocking, .*legacy default stream during the "
    why += r"capture.*non-blocking stream"
    with pytest.raises(tf.BackendError) as got:
        with graph_part.capture(s) as cap:
            pass
    assert got.value.result_name == result and got.value.result_code == 901
    assert str(got.value).startswith(f"session.capture: the driver returned {result}")
    assert bool(re.search(why, str(got.value))) is explained
    assert got.value.__cause__ is None and cap.graph is None and not s.liveness.capturing
    assert s.liveness.held == ["before"]
    with pytest.raises(KeyError) as body:  # the body's own exception wins, with a note
        with graph_part.capture(s):
            raise KeyError("body")
    (note,) = body.value.__notes__
    assert note.startswith("tenferro: ending the capture also failed: session.capture: ")
    assert bool(re.search(why, note)) is explained


def test_a_graph_whose_executable_was_refused_leaves_its_handle_to_the_capture(stand_in_graph):
    from tenferro import graph as graph_part

    session, destroyed = stand_in_graph[0].state, stand_in_graph[1]
    _Exec.fail = True
    with pytest.raises(tf.BackendError, match=r"^session\.capture: the driver returned CUDA_"):
        graph_part.Graph(session, 0x30, 1, ["owners"])
    import gc

    gc.collect()  # the half-made Graph is gone: it destroyed nothing the capture still owns
    assert destroyed == []


def test_an_update_takes_the_new_captures_owners_and_holds_the_old(stand_in_graph):
    g, destroyed = stand_in_graph
    first_exec = g._exec
    old_owners = g.owners
    g.take_update(0x20, 2, ["new owners"], "session.capture")
    assert first_exec.updates == [(0x20, "session.capture")] and g._exec is first_exec
    assert g.owners == ["new owners"] and g.node_count == 2 and g._graph == 0x20
    assert g.state.liveness.held == [old_owners]  # replays in flight still use them
    # the executable graph lives on, updated; the graph it was made from stays beside it (its
    # nodes name the executable's), and a second update lets the first update's graph go
    assert destroyed == [] and g._exec_source == 0x10
    g.take_update(0x30, 2, ["newer owners"], "session.capture")
    assert destroyed == [0x20] and (g._graph, g._exec_source) == (0x30, 0x10)
    g.__del__()  # what dropping it runs (the fixture still holds it)
    assert sorted(destroyed) == [0x10, 0x20, 0x30]  # each once


def test_a_refused_update_leaves_the_graph_as_it_was(stand_in_graph):
    g, destroyed = stand_in_graph
    first_exec = g._exec
    _Exec.refuse = "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.capture: update=graph: the new "
        r"capture is not the same work as the graph's, "
        r"so it cannot update it \(CUDA_ERROR_GRAPH_"
        r"EXEC_UPDATE_FAILURE\)",
    ):
        g.take_update(0x20, 2, ["new owners"], "session.capture")  # same count, other kernels
    assert (g.owners, g.node_count, g._graph) == (["old owners"], 2, 0x10)
    assert destroyed == [0x20] and g.state.liveness.held == []
    # A part-updated executable graph is not kept: a new one is made from the old graph.
    assert first_exec.destroyed and g._exec is _Exec.made[-1] and g._exec.graph == 0x10
    assert (g._exec.stream, g._exec.op) == (0x5, "session.capture")  # on the session's stream


def test_a_graph_whose_executable_cannot_be_made_again_after_a_refused_update(stand_in_graph):
    # The driver refuses the update, then the executable graph of the old graph: the new
    # capture is destroyed all the same, replay is refused, and the old graph goes with it.
    g, destroyed = stand_in_graph
    first_exec = g._exec
    _Exec.refuse, _Exec.fail = "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", True
    with pytest.raises(
        tf.BackendError,
        match=r"^session\.capture: the driver returned "
        r"CUDA_ERROR_OUT_OF_MEMORY",
    ):
        g.take_update(0x20, 2, ["new owners"], "session.capture")
    assert first_exec.destroyed == 1 and g._exec is None and destroyed == [0x20]
    session = g.state
    with pytest.raises(
        tf.RuntimeStateError,
        match=r"^graph\.launch: the graph cannot replay: "
        r"making its executable graph again after "
        r"a refused update failed",
    ):
        g.launch()
    assert session.liveness.held == [] and destroyed == [0x20]
    g.__del__()  # what dropping it runs (the fixture still holds it)
    assert destroyed == [0x20, 0x10] and first_exec.destroyed == 1


def test_an_update_capture_makes_a_graph_that_could_not_replay_replayable(stand_in_graph):
    g, destroyed = stand_in_graph
    _Exec.refuse, _Exec.fail = "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", True
    with pytest.raises(tf.BackendError):
        g.take_update(0x20, 2, ["new owners"], "session.capture")
    assert g._exec is None
    _Exec.refuse, _Exec.fail = None, False
    g.take_update(0x30, 2, ["newer owners"], "session.capture")
    assert g._exec is _Exec.made[-1] and g._exec.graph == 0x30
    assert (g.owners, g.node_count, g._graph) == (["newer owners"], 2, 0x30)
    assert destroyed == [0x20, 0x10]  # the refused capture, then the graph it replaced
    assert g.state.liveness.held == [["old owners"]]


def test_an_update_capture_that_cannot_be_made_executable_is_destroyed(stand_in_graph):
    g, destroyed = stand_in_graph
    _Exec.refuse, _Exec.fail = "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", True
    with pytest.raises(tf.BackendError):
        g.take_update(0x20, 2, ["new owners"], "session.capture")
    _Exec.refuse = None  # still failing to make an executable graph
    with pytest.raises(tf.BackendError, match=r"^session\.capture: the driver returned CUDA_"):
        g.take_update(0x30, 2, ["newer owners"], "session.capture")
    assert g._exec is None and destroyed == [0x20, 0x30]
    assert (g.owners, g.node_count, g._graph) == (["old owners"], 2, 0x10)


@pytest.mark.parametrize("count", [1, 3])
def test_an_update_of_another_node_count_is_refused_before_the_driver(stand_in_graph, count):
    g, destroyed = stand_in_graph
    first_exec = g._exec
    with pytest.raises(
        tf.ValidationError,
        match=rf"^session\.capture: update=graph: the new "
        rf"capture is not the same work .* \(it has "
        rf"{count} node\(s\), the graph 2\)",
    ):
        g.take_update(0x20, count, ["new owners"], "session.capture")
    assert first_exec.updates == [] and not first_exec.destroyed and g._exec is first_exec
    assert (g.owners, g.node_count, g._graph) == (["old owners"], 2, 0x10)
    assert destroyed == [0x20] and g.state.liveness.held == []


@pytest.mark.parametrize("bad", [5, "graph", object()])
def test_update_must_be_a_graph_of_the_session(bad):
    with pytest.raises(
        tf.ValidationError,
        match=rf"^session\.capture: update must be a Graph of "
        rf"this session, got {type(bad).__name__}",
    ):
        tf.graph.capture(object(), update=bad)


def test_update_refuses_a_graph_of_another_session(stand_in_graph):
    g, _ = stand_in_graph
    with pytest.raises(
        tf.ValidationError,
        match=r"update must be a Graph of this session, got "
        r"Graph",
    ):
        tf.graph.capture(object(), update=g)
    cap = tf.graph.capture(g.state, update=g)
    assert cap.update is g and cap.graph is None  # until its block ends


# --- updating a graph in place, on the GPU -------------------------------------------------------


@pytest.mark.gpu
def test_a_graph_updated_with_other_buffers_replays_on_them(session, rng):
    axpy, _ = _kernels(session)
    cfg = tf.LaunchConfig.flat(N)
    x1_0, x2_0 = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
    y1_0, y2_0 = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
    x1, y1, x2, y2 = (session.upload(a) for a in (x1_0, y1_0, x2_0, y2_0))
    with session.capture() as cap:
        session.launch(axpy, cfg, [session.tensor_mut(y1), session.tensor(x1), 2.0, N])
    graph = cap.graph
    graph.launch()
    first = session.download(y1)
    np.testing.assert_allclose(first, 2.0 * x1_0.astype(np.float64) + y1_0, rtol=1e-6)
    gone = weakref.ref(x1)
    with session.capture(update=graph) as cap2:
        session.launch(axpy, cfg, [session.tensor_mut(y2), session.tensor(x2), -3.0, N])
    assert cap2.graph is graph and graph.node_count == 1
    graph.launch()
    graph.launch()
    np.testing.assert_allclose(
        session.download(y2), -6.0 * x2_0.astype(np.float64) + y2_0, rtol=1e-5, atol=1e-5
    )
    np.testing.assert_array_equal(session.download(y1), first)  # the old buffers: untouched
    del x1
    session.synchronize()
    gc.collect()
    assert gone() is None, "an updated graph lets its old owners go once the stream passed"


@pytest.mark.gpu
def test_a_graph_update_with_other_work_is_refused_and_the_graph_unchanged(session, rng):
    axpy, _ = _kernels(session)
    cfg = tf.LaunchConfig.flat(N)
    x0, y0 = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    x, y, other = session.upload(x0), session.upload(y0), session.upload(y0)
    with session.capture() as cap:
        session.launch(axpy, cfg, [session.tensor_mut(y), session.tensor(x), 1.0, N])
    graph = cap.graph
    owners = graph.owners
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.capture: update=graph: the new "
        r"capture is not the same work .*\(it has 2 "
        r"node\(s\), the graph 1\)",
    ):
        with session.capture(update=graph):
            session.launch(axpy, cfg, [session.tensor_mut(other), session.tensor(x), 1.0, N])
            session.launch(axpy, cfg, [session.tensor_mut(other), session.tensor(x), 1.0, N])
    assert graph.owners is owners and graph.node_count == 1
    graph.launch()
    np.testing.assert_allclose(session.download(y), x0.astype(np.float64) + y0, rtol=1e-6)
    np.testing.assert_array_equal(session.download(other), y0)  # never ran


# --- a replay on another stream: ordered both ways through a stand-in driver --------------------


class _ReplayingState:
    """A session's state as a replay asks it: stream 0x5 of context 0xC0, its import event 0x9,
    a pending producer stream, and an enqueue that calls the launch and records the holds."""

    def __init__(self, calls):
        import types

        self.calls, self.stream, self.import_event = calls, 0x5, 0x9
        self.context = types.SimpleNamespace(handle=0xC0, ordinal=0)
        self.liveness = Liveness(0x5, 256, 256 << 20)
        self.ordering = types.SimpleNamespace(pending=[0x44], flush=self._flush)
        self.fast_path_ok, self.thread = False, None  # a timeline or a capture: the general path

    def _flush(self, op):
        self.calls.append(("flush", tuple(self.ordering.pending), op))
        self.ordering.pending = []

    def check_use(self, op):
        pass

    def enqueue(self, op, name, config, launch, target, holds):
        self.calls.append(("enqueue", name, holds))
        launch(target)

    def enqueue_fast(self, op, name, launch, target):
        self.calls.append(("enqueue_fast", name))
        launch(target)


class _ReplayingExec(_Exec):
    def launch(self, op):
        self.calls.append(("replay", "own stream", op))

    def launch_on(self, stream, op):
        self.calls.append(("replay", hex(stream), op))


@pytest.fixture
def replaying(monkeypatch):
    from tenferro import graph as graph_part
    from tenferro.interop import streams

    calls = []
    _ReplayingExec.calls = calls
    _Exec.made, _Exec.refuse, _Exec.fail, _Exec.destroy_raises = [], None, False, False
    _Exec.refuse_params = False
    monkeypatch.setattr(graph_part._driver, "ExecutableGraph", _ReplayingExec)
    monkeypatch.setattr(graph_part._driver, "graph_destroy", lambda g: None)
    monkeypatch.setattr(
        graph_part,
        "order_after",
        lambda waiter, producer, event, op: calls.append(
            ("order", hex(waiter), hex(producer), event)
        ),
    )
    monkeypatch.setattr(streams._driver, "stream_context", lambda h: {0x77: 0xC0, 0x88: 0xD0}[h])
    g = graph_part.Graph(_ReplayingState(calls), 0x10, 2, ["owners"])
    yield g, calls
    calls.clear()  # it names g: no cycle left for a later collection to find
    g.__del__()  # destroyed through the stand-ins, while they stand in


class _TorchStream:
    def __cuda_stream__(self):
        return (0, 0x77)


@pytest.mark.parametrize("stream", [0x77, _TorchStream()], ids=["handle", "__cuda_stream__"])
def test_a_replay_on_another_stream_waits_for_the_session_and_the_session_for_it(replaying, stream):
    g, calls = replaying
    g.launch(stream=stream)
    assert calls == [
        ("flush", (0x44,), "graph.launch"),  # the producers before everything the fork covers
        ("order", "0x77", "0x5", 0x9),  # the replay after the session's work
        ("enqueue", "graph of 2 node(s)", g),  # held until the session's stream passes it
        ("replay", "0x77", "graph.launch"),
        ("order", "0x5", "0x77", 0x9),  # the session's stream after the replay
    ]


@pytest.mark.parametrize("stream", [None, 0x5])
def test_a_replay_on_the_sessions_own_stream_needs_no_order(replaying, stream):
    g, calls = replaying
    g.launch(stream=stream)
    assert calls == [
        ("enqueue", "graph of 2 node(s)", g),
        ("replay", "own stream", "graph.launch"),
    ]


def test_a_replay_in_the_steady_state_takes_the_fast_enqueue_and_holds_the_graph(replaying):
    import threading

    g, calls = replaying
    st = g.state
    st.fast_path_ok, st.thread = True, threading.get_ident()
    g.launch()
    assert calls == [
        ("enqueue_fast", "graph of 2 node(s)"),
        ("replay", "own stream", "graph.launch"),
    ]
    assert st.liveness.held == [g]  # the graph and its owners live until the stream passes
    calls.clear()
    g.launch(stream=0x5)  # a stream given, even the session's own: the general path
    assert calls[0] == ("enqueue", "graph of 2 node(s)", g)
    calls.clear()
    st.thread = -1  # another thread: the general path (whose check_use refuses it)
    g.launch()
    assert calls[0] == ("enqueue", "graph of 2 node(s)", g)


@pytest.mark.parametrize("stream", [0, 1])  # a driver handle 0 is the NULL (legacy) stream
def test_a_replay_on_the_legacy_default_stream_is_ordered_both_ways(replaying, stream):
    g, calls = replaying
    g.launch(stream=stream)
    assert [c for c in calls if c[0] in ("order", "replay")] == [
        ("order", "0x1", "0x5", 0x9),
        ("replay", "0x1", "graph.launch"),
        ("order", "0x5", "0x1", 0x9),
    ]


@pytest.mark.parametrize(
    ("stream", "msg"),
    [
        (0x88, r"stream=0x88 belongs to another context \(0xd0\), not device 0's primary context"),
        ("x", r"stream='x' must be None, an int or an object with __cuda_stream__"),
        (-3, r"stream=-3 is not a stream handle"),
    ],
)
def test_a_replay_on_a_stream_it_cannot_run_on_is_refused_and_nothing_enqueued(
    replaying, stream, msg
):
    g, calls = replaying
    with pytest.raises(tf.ValidationError, match=r"^graph\.launch: " + msg):
        g.launch(stream=stream)
    assert calls == []


@pytest.mark.gpu
def test_a_graph_replayed_on_another_sessions_stream_is_ordered_with_its_own(session, rng):
    # slow_scale spins before it writes: a download on the session's stream right after the
    # replay sees its result only if the session's stream was ordered after the other stream.
    from _sources import AXPY

    fn = session.compile(AXPY).function("slow_scale")
    n = 4096
    x0 = rng.standard_normal(n)
    x, y = session.upload(x0), session.upload(np.full(n, np.nan))
    with session.capture() as cap:
        session.launch(
            fn,
            tf.LaunchConfig.flat(n),
            [session.tensor_mut(y), session.tensor(x), 3.0, n, 20_000_000],
        )
    with tf.Session(session.device) as other:
        cap.graph.launch(stream=other.stream)
        np.testing.assert_array_equal(session.download(y), 3.0 * x0)
        with pytest.raises(tf.ValidationError, match=r"^graph\.launch: stream=Session\("):
            cap.graph.launch(stream=other)  # a Session is not a stream; its .stream is


# --- new arguments for a graph's kernels: GraphKernel through a stand-in driver ------------------


class _Block:
    """A stand-in packed block: one byte an argument, each argument an int below 256."""

    address = 0xB10C

    def __init__(self):
        self.bytes = b""

    def snapshot(self):
        return self.bytes

    def restore(self, saved):
        self.bytes = saved

    def replace(self, args, index, arg, state, op):
        if not 0 <= index < len(args) or not 0 <= arg < 256:
            raise tf.ValidationError(f"{op}: args[{index}] refused")
        self.bytes = self.bytes[:index] + bytes([arg]) + self.bytes[index + 1 :]
        return [*args[:index], arg, *args[index + 1 :]], []

    def pack(self, args, state, op):
        self.bytes = bytes(args)
        return []


class _Fn:
    name = "scale"

    def __init__(self):
        self.blocks = []
        self.param_block = self

    def fresh(self):
        self.blocks.append(_Block())
        return self.blocks[-1]


def _graph_with_kernel(stand_in_graph):
    from tenferro import graph as graph_part

    state = stand_in_graph[0].state
    fn = _Fn()
    g = graph_part.Graph(state, 0x30, 2, ["owners"], [(0x77, fn, "cfg", b"\x01\x02", (1, 2), [])])
    return g, fn


def test_a_graph_kernel_starts_from_the_bytes_captured_and_hands_its_block_to_the_node(
    stand_in_graph,
):
    g, fn = _graph_with_kernel(stand_in_graph)
    (kernel,) = g.kernels
    assert (kernel.fn, kernel.config, kernel.args, kernel.name) == (fn, "cfg", [1, 2], "scale")
    assert fn.blocks == []  # made at the first change
    kernel.update(1, 9)
    (block,) = fn.blocks
    assert block.bytes == b"\x01\x09" and kernel.args == [1, 9]
    assert g._exec.params == [(0x77, 0x77, 0xB10C, "graph_kernel.update")]
    kernel.set_args([3, 4])
    assert block.bytes == b"\x03\x04" and kernel.args == [3, 4]
    assert g._exec.params[-1] == (0x77, 0x77, 0xB10C, "graph_kernel.set_args")


def test_a_change_the_driver_refuses_leaves_the_kernel_as_it_was(stand_in_graph):
    g, fn = _graph_with_kernel(stand_in_graph)
    (kernel,) = g.kernels
    kernel.update(0, 5)
    _Exec.refuse_params = True
    for change in (lambda: kernel.update(1, 7), lambda: kernel.set_args([8, 8])):
        with pytest.raises(tf.BackendError, match=r"^graph_kernel\.(update|set_args): the driver"):
            change()
        assert fn.blocks[0].bytes == b"\x05\x02" and kernel.args == [5, 2]
    _Exec.refuse_params = False
    with pytest.raises(tf.ValidationError, match=r"^graph_kernel\.update: args\[1\] refused"):
        kernel.update(1, 256)  # refused by the block: the driver is not asked
    assert len(g._exec.params) == 1 and kernel.args == [5, 2]


def test_a_graph_kernel_refuses_changes_during_a_capture_and_when_its_graph_cannot_replay(
    stand_in_graph,
):
    g, _ = _graph_with_kernel(stand_in_graph)
    (kernel,) = g.kernels
    live = g.state.liveness
    saved = live.begin_capture()
    with pytest.raises(tf.RuntimeStateError, match=r"^graph_kernel\.update: not during a capture"):
        kernel.update(0, 1)
    live.end_capture(saved)
    g._exec = None  # what a refused update whose new executable also failed leaves
    with pytest.raises(tf.RuntimeStateError, match=r"^graph_kernel\.set_args: the graph cannot"):
        kernel.set_args([1, 1])
    assert kernel.args == [1, 2]


def test_an_update_capture_retires_the_old_kernels_and_holds_them(stand_in_graph):
    g, fn = _graph_with_kernel(stand_in_graph)
    (old,) = g.kernels
    g.take_update(0x40, 2, ["new"], "session.capture", [(0x88, fn, "cfg", b"\x07", (7,), [])])
    (new,) = g.kernels
    assert new is not old and new.args == [7]
    assert g.state.liveness.held[-1] == (old,)  # replays in flight may read what it was given
    with pytest.raises(tf.RuntimeStateError, match=r"'scale' was updated by a new capture since"):
        old.update(0, 1)
    new.update(0, 3)  # the node of the graph the executable graph was made from, and its own
    assert g._exec.params == [(0x77, 0x88, 0xB10C, "graph_kernel.update")]


def test_a_kernel_of_a_graph_that_is_gone_refuses_changes(stand_in_graph):
    g, _ = _graph_with_kernel(stand_in_graph)
    (kernel,) = g.kernels
    del g
    gc.collect()
    with pytest.raises(
        tf.RuntimeStateError, match=r"^graph_kernel\.update: the graph of 'scale' is gone"
    ):
        kernel.update(0, 1)


def test_a_capture_records_the_kernels_it_launched_for_its_graph(monkeypatch):
    from tenferro import graph as graph_part
    from tenferro._state import SessionState

    nodes = iter([0x51, 0, 0x52])  # 0: the work was not one node; it is no GraphKernel
    monkeypatch.setattr(graph_part._driver, "capture_begin", lambda stream, op: None)
    monkeypatch.setattr(graph_part._driver, "capture_end", lambda stream, op: 0x60)
    monkeypatch.setattr(graph_part._driver, "graph_node_count", lambda graph: 3)
    monkeypatch.setattr(graph_part._driver, "ExecutableGraph", _Exec)
    monkeypatch.setattr(graph_part._driver, "capture_last_node", lambda stream, op: next(nodes))
    s = _CapturingSession()
    s.capture_kernels = None
    s.note_captured_kernel = types.MethodType(SessionState.note_captured_kernel, s)
    fn, block = _Fn(), _Block()
    with graph_part.capture(s) as cap:
        for arg in (1, 2, 3):
            block.bytes = bytes([arg])
            s.note_captured_kernel("session.launch", fn, "cfg", block, [arg], [])
    assert s.capture_kernels is None
    assert [(k._node, k.args) for k in cap.graph.kernels] == [(0x51, [1]), (0x52, [3])]
    cap.graph.kernels[1].update(0, 9)
    assert fn.blocks[0].bytes == b"\x09"  # from the bytes captured with it, 3, then changed


# --- new arguments for a graph's kernels at replay -----------------------------------------------


@pytest.mark.gpu
def test_graph_kernels_take_new_buffers_and_scalars_between_replays(session, rng):
    axpy, nk = _kernels(session)
    cfg = tf.LaunchConfig.flat(N)
    x0, y0, z0, w0 = (rng.standard_normal(N).astype(np.float32) for _ in range(4))
    x, y, z, w = (session.upload(a) for a in (x0, y0, z0, w0))
    with session.capture() as cap:
        session.launch(axpy, cfg, [session.tensor_mut(y), session.tensor(x), tf.f32(0.5), N])
        session.copy(z, y)  # a node, not a kernel
        session.launch(nk, cfg, [session.tensor_mut(w), session.tensor(z), tf.f32(-2.0), N])
    graph = cap.graph
    assert graph.node_count == 3
    first, second = graph.kernels  # the kernels, in the order they were launched
    assert first.fn is axpy and second.fn is not axpy and first.config is cfg
    assert first.name == "axpy" and second.config is cfg
    assert repr(first).startswith("GraphKernel(axpy, LaunchConfig(") and first.session is session
    graph.launch()  # y += x/2; z = y; w -= 2z
    y1 = y0 + 0.5 * x0.astype(np.float64)
    w1 = w0 - 2.0 * y1
    a0, b0 = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    a, b = session.upload(a0), session.upload(b0)
    into_a, three = session.tensor_mut(a), tf.f32(3.0)
    first.update(0, into_a)  # a += x * 3 instead of y
    first.update(2, three)
    second.set_args([session.tensor_mut(b), session.tensor(x), tf.f32(0.25), N])
    graph.launch()  # a += 3x; z = y (y unchanged); b += x/4
    np.testing.assert_allclose(session.download(y), y1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(session.download(w), w1, rtol=1e-5, atol=1e-5)  # untouched now
    np.testing.assert_allclose(session.download(z), y1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(session.download(a), a0 + 3.0 * x0.astype(np.float64), rtol=1e-5)
    np.testing.assert_allclose(session.download(b), b0 + 0.25 * x0.astype(np.float64), rtol=1e-5)
    assert first.args[0] is into_a and first.args[2] is three and len(first.spans) == 2


@pytest.mark.gpu
def test_replays_enqueued_before_a_change_keep_the_old_arguments(session, rng):
    axpy, _ = _kernels(session)
    x0, y0 = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    x, y = session.upload(x0), session.upload(y0)
    with session.capture() as cap:
        session.launch(
            axpy, tf.LaunchConfig.flat(N), [session.tensor_mut(y), session.tensor(x), 1.0, N]
        )
    (kernel,) = cap.graph.kernels
    for a in (1.0, -2.0, 0.5, 4.0):  # no host wait between the replays and the changes
        kernel.update(2, tf.f32(a))
        cap.graph.launch()
    np.testing.assert_allclose(
        session.download(y), y0 + 3.5 * x0.astype(np.float64), rtol=1e-5, atol=1e-5
    )


@pytest.mark.gpu
def test_a_graph_holds_the_spans_its_kernels_were_given(session, rng):
    axpy, _ = _kernels(session)
    cfg = tf.LaunchConfig.flat(N)
    x0, y0 = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    x, y = session.upload(x0), session.upload(y0)
    with session.capture() as cap:
        session.launch(axpy, cfg, [session.tensor_mut(y), session.tensor(x), 2.0, N])
    graph = cap.graph
    (kernel,) = graph.kernels
    x2 = session.upload(x0 * 2)
    kept = weakref.ref(x2)
    kernel.update(1, session.tensor(x2))
    del x2
    gc.collect()
    assert kept() is not None, "the graph holds the span it was given"
    graph.launch()
    np.testing.assert_allclose(
        session.download(y), y0 + 4.0 * x0.astype(np.float64), rtol=1e-5, atol=1e-5
    )
    replaced = weakref.ref(kept())
    kernel.update(1, session.tensor(x))
    session.synchronize()
    gc.collect()
    assert replaced() is None, "a span replaced goes once the stream has passed its replays"


@pytest.mark.gpu
def test_graph_kernel_refusals_name_the_argument_and_change_nothing(session, rng):
    axpy, _ = _kernels(session)
    cfg = tf.LaunchConfig.flat(N)
    x0, y0 = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    x, y = session.upload(x0), session.upload(y0)
    with session.capture() as cap:
        session.launch(axpy, cfg, [session.tensor_mut(y), session.tensor(x), tf.f32(1.0), N])
    graph = cap.graph
    (kernel,) = graph.kernels
    args, spans = list(kernel.args), list(kernel.spans)
    refusals = [
        (lambda: kernel.update(2, tf.f64(5.0)), r"^graph_kernel\.update: args\[2\] 'a' is an f64"),
        (lambda: kernel.update(-1, 1.0), r"^graph_kernel\.update: index=-1 is out of range"),
        (lambda: kernel.update(4, 1.0), r"^graph_kernel\.update: index=4 is out of range for 4"),
        (
            lambda: kernel.update(1, session.tensor(y)),
            r"^graph_kernel\.update: args\[0\] .*overlap",
        ),
        (lambda: kernel.set_args([session.tensor_mut(y)]), r"^graph_kernel\.set_args: .*takes 4"),
        (lambda: kernel.set_args("y"), r"^graph_kernel\.set_args: args must be a list or tuple"),
        (
            lambda: kernel.set_args([session.tensor_mut(y), session.tensor(x), 1.0, -1]),
            r"^graph_kernel\.set_args: args\[3\]",
        ),
    ]
    for refused, message in refusals:
        with pytest.raises(tf.ValidationError, match=message):
            refused()
        assert kernel.args == args and kernel.spans == spans
    kernel.update(3, N)  # the last index accepted
    graph.launch()  # the graph as captured: y += x
    np.testing.assert_allclose(session.download(y), y0 + x0.astype(np.float64), rtol=1e-5)
    with session.capture() as other:
        with pytest.raises(
            tf.RuntimeStateError, match=r"^graph_kernel\.update: not during a capture"
        ):
            kernel.update(2, tf.f32(2.0))
        session.launch(axpy, cfg, [session.tensor_mut(y), session.tensor(x), tf.f32(1.0), N])
    with session.capture(update=graph):
        session.launch(axpy, cfg, [session.tensor_mut(y), session.tensor(x), tf.f32(-1.0), N])
    with pytest.raises(
        tf.RuntimeStateError,
        match=r"^graph_kernel\.update: the graph of 'axpy' was updated by a new capture",
    ):
        kernel.update(2, tf.f32(2.0))
    (fresh,) = graph.kernels
    assert fresh is not kernel and fresh.args[2].data == tf.f32(-1.0).data
    fresh.update(2, tf.f32(3.0))  # a node of the graph updated in place changes as well
    graph.launch()  # y += 3x, after the first replay's y += x
    np.testing.assert_allclose(
        session.download(y), y0 + 4.0 * x0.astype(np.float64), rtol=1e-5, atol=1e-5
    )
    del other, graph, cap  # cap.graph is the graph too
    session.synchronize()  # the session held the graph until the stream passed its replays
    gc.collect()
    with pytest.raises(
        tf.RuntimeStateError, match=r"^graph_kernel\.set_args: the graph of 'axpy' is gone"
    ):
        fresh.set_args([session.tensor_mut(y), session.tensor(x), tf.f32(1.0), N])


@pytest.mark.gpu
def test_a_bound_launch_captured_is_a_graph_kernel(session, rng):
    axpy, _ = _kernels(session)
    cfg = tf.LaunchConfig.flat(N)
    x0, y0 = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    x, y = session.upload(x0), session.upload(y0)
    bound = session.bind(axpy, cfg, [session.tensor_mut(y), session.tensor(x), tf.f32(1.0), N])
    with session.capture() as cap:
        bound()
    (kernel,) = cap.graph.kernels
    kernel.update(2, tf.f32(-4.0))
    bound.update(2, tf.f32(100.0))  # the bound launch's block is its own, and so is the graph's
    cap.graph.launch()
    np.testing.assert_allclose(
        session.download(y), y0 - 4.0 * x0.astype(np.float64), rtol=1e-5, atol=1e-5
    )


@pytest.mark.gpu
def test_graph_kernels_refuse_after_the_session_closes(device):
    with tf.Session(device=device) as s:
        fn = s.compile(AXPY).function("axpy")
        y, x = s.alloc_zeros(8, np.float32), s.alloc_zeros(8, np.float32)
        with s.capture() as cap:
            s.launch(fn, tf.LaunchConfig.flat(8), [s.tensor_mut(y), s.tensor(x), 1.0, 8])
    (kernel,) = cap.graph.kernels
    with pytest.raises(tf.RuntimeStateError, match=r"^graph_kernel\.update: the session is closed"):
        kernel.update(2, tf.f32(2.0))


# --- conditional nodes through a stand-in driver -----------------------------------------------


@pytest.fixture
def conditional_capture(monkeypatch):
    """A running Capture of a stand-in session; the driver calls it makes are listed."""
    from tenferro import graph as graph_part

    calls = []
    monkeypatch.setattr(graph_part._driver, "capture_begin", lambda stream, op: None)
    monkeypatch.setattr(graph_part._driver, "driver_version", lambda: 13000)
    monkeypatch.setattr(
        graph_part._driver,
        "conditional_handle_create",
        lambda stream, ctx, default, op: (
            calls.append(("handle", stream, ctx, default, op)) or 0xC0 + len(calls)
        ),
    )

    def begin(stream, ctx, handle, loop, op):
        calls.append(("begin", stream, ctx, handle, loop, op))
        return 0x60, 0x70 + len(calls)

    def end(stream, graph, node, op):
        calls.append(("end", stream, graph, node, op))
        if end.raises:
            raise tf.BackendError(f"{op}: the driver returned CUDA_ERROR_ILLEGAL_STATE")

    end.raises = False
    monkeypatch.setattr(graph_part._driver, "conditional_begin", begin)
    monkeypatch.setattr(graph_part._driver, "conditional_end", end)
    s = _CapturingSession()
    s.context = types.SimpleNamespace(handle=0xC7)
    s.capture_kernels = None
    cap = graph_part.capture(s).__enter__()
    yield cap, calls, end
    s.liveness.end_capture([])  # this thread knows of no capture after the test


def test_a_conditional_body_is_captured_between_begin_and_end(conditional_capture):
    cap, calls, _ = conditional_capture
    st = cap.state
    again = cap.condition(default=3)
    assert calls == [("handle", 0x5, 0xC7, 3, "capture.condition")] and again.default == 3
    assert st.capture_kernels == []
    with cap.capture_while(again):
        assert calls[-1] == ("begin", 0x5, 0xC7, again.handle, True, "capture.capture_while")
        assert st.capture_kernels is None  # kernels of a body are not listed
        inner = cap.condition(default=0)
        with cap.capture_if(inner):
            assert calls[-1][4] is False
        assert calls[-1][0] == "end"
    assert calls[-1] == ("end", 0x5, 0x60, 0x72, "capture.capture_while")
    assert st.capture_kernels == [] and again.drives == "while" and inner.drives == "if"


def test_a_capture_that_fails_after_a_conditional_body_destroys_the_graph_it_paused(
    conditional_capture, monkeypatch
):
    from tenferro import graph as graph_part

    cap, _, _ = conditional_capture
    destroyed = []
    monkeypatch.setattr(graph_part._driver, "graph_destroy", destroyed.append)

    def invalidated(stream, op):
        raise tf.BackendError(f"{op}: the driver returned CUDA_ERROR_ILLEGAL_STATE")

    monkeypatch.setattr(graph_part._driver, "capture_end", invalidated)
    with cap.capture_if(cap.condition()):
        pass
    with pytest.raises(tf.BackendError, match="CUDA_ERROR_ILLEGAL_STATE"):
        cap.__exit__(None, None, None)
    assert destroyed == [0x60] and cap.graph is None  # the graph the body's begin paused


def test_a_capture_with_a_condition_that_drives_no_node_is_refused_and_its_graph_destroyed(
    conditional_capture, monkeypatch
):
    from tenferro import graph as graph_part

    cap, _, _ = conditional_capture
    destroyed = []
    monkeypatch.setattr(graph_part._driver, "graph_destroy", destroyed.append)
    monkeypatch.setattr(graph_part._driver, "capture_end", lambda stream, op: 0x60)
    cap.condition()
    with cap.capture_while(cap.condition()):
        pass
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.capture: 1 condition\(s\) made with cap\.condition\(\) drive no node; "
        r"the driver cannot make a graph with them",
    ):
        cap.__exit__(None, None, None)
    assert destroyed == [0x60] and cap.graph is None


def test_a_graph_made_anew_after_a_refused_update_names_its_own_nodes_again(stand_in_graph):
    g, fn = _graph_with_kernel(stand_in_graph)
    destroyed = stand_in_graph[1]
    g.take_update(0x40, 2, ["new"], "session.capture", [(0x88, fn, "cfg", b"\x07", (7,), [])])
    (kernel,) = g.kernels
    assert (kernel.exec_node, g._exec_source) == (0x77, 0x30)  # updated in place
    _Exec.refuse = "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"
    with pytest.raises(tf.ValidationError, match=r"not the same work"):
        g.take_update(0x50, 2, ["other"], "session.capture", [])
    assert g._exec.graph == 0x40 and g._exec_source == 0x40  # made anew from its own graph
    assert kernel.exec_node == 0x88 and 0x30 in destroyed and 0x50 in destroyed
    kernel.update(0, 9)
    assert g._exec.params[-1] == (0x88, 0x88, 0xB10C, "graph_kernel.update")


def test_a_body_that_raises_is_ended_and_its_exception_wins(conditional_capture):
    cap, calls, end = conditional_capture
    with pytest.raises(KeyError, match="body") as got:
        with cap.capture_if(cap.condition()):
            raise KeyError("body")
    assert calls[-1][0] == "end" and not hasattr(got.value, "__notes__")
    end.raises = True
    with pytest.raises(KeyError, match="body") as got:
        with cap.capture_while(cap.condition()):
            raise KeyError("body")
    (note,) = got.value.__notes__
    assert note.startswith("tenferro: ending the while body also failed: capture.capture_while: ")
    assert cap.state.capture_kernels == []  # the listing of kernels is back either way


def test_conditional_refusals_make_no_driver_call(conditional_capture, monkeypatch):
    from tenferro import graph as graph_part

    cap, calls, _ = conditional_capture
    outer = cap.condition()
    made = len(calls)
    refusals = [
        (lambda: cap.capture_if(0xC1), r"^capture\.capture_if: condition must be a GraphCondition"),
        (lambda: cap.condition(default=-1), r"^capture\.condition: default=-1 must be an int"),
        (lambda: cap.condition(default=2**32), r"^capture\.condition: default=4294967296 must"),
        (lambda: cap.condition(default=True) and cap.condition(default=None), r"default=None"),
    ]
    for refused, message in refusals:
        with pytest.raises(tf.ValidationError, match=message):
            with refused():
                pass
    assert len(calls) == made + 1  # default=True is an int: 1
    with cap.capture_if(cap.condition()):
        with pytest.raises(
            tf.ValidationError,
            match=r"^capture\.capture_while: condition was made in another conditional body",
        ):
            with cap.capture_while(outer):
                pass
    with cap.capture_if(outer):
        pass
    with pytest.raises(tf.ValidationError, match=r"condition already drives an if node"):
        with cap.capture_if(outer):
            pass
    monkeypatch.setattr(graph_part._driver, "driver_version", lambda: 12030)
    with pytest.raises(
        tf.ValidationError,
        match=r"^capture\.condition: conditional graph nodes need a CUDA 12\.4 "
        r"or later driver; this one is CUDA 12\.3",
    ):
        cap.condition()
    cap.running = False
    with pytest.raises(
        tf.RuntimeStateError, match=r"^capture\.capture_if: only inside the capture"
    ):
        with cap.capture_if(outer):
            pass


# --- conditional nodes: if and while, driven by a condition a kernel sets -----------------------

CONDITIONAL = r"""
// cudaGraphSetConditional as <cuda_device_runtime_api.h> declares it (that header needs the
// toolkit's crt/ headers); the driver provides it when the module loads.
typedef unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ void cudaGraphSetConditional(cudaGraphConditionalHandle h, unsigned int v);
extern "C" __global__ void halve(float* x, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 0.5f;
}
// One thread: another pass while some |x[i]| is above tol; counts the passes.
extern "C" __global__ void above(cudaGraphConditionalHandle again, const float* x, unsigned n,
                                 float tol, unsigned* passes) {
    float most = 0.0f;
    for (unsigned i = 0; i < n; ++i) most = fmaxf(most, fabsf(x[i]));
    passes[0] += 1;
    cudaGraphSetConditional(again, most > tol ? 1u : 0u);
}
extern "C" __global__ void set_if_positive(cudaGraphConditionalHandle cond, const int* flag) {
    cudaGraphSetConditional(cond, flag[0] > 0 ? 1u : 0u);
}
extern "C" __global__ void add_one(float* x, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
"""
COND_N = 1000


@pytest.mark.gpu
def test_a_while_node_iterates_until_a_kernel_sees_convergence(session, rng):
    mod = session.compile(CONDITIONAL)
    halve, above = mod.function("halve"), mod.function("above")
    x0 = rng.uniform(1.0, 300.0, COND_N).astype(np.float32)
    x, passes = session.upload(x0), session.upload(np.zeros(1, np.uint32))
    with session.capture() as cap:
        again = cap.condition(default=1)
        with cap.capture_while(again):
            session.launch(halve, tf.LaunchConfig.flat(COND_N), [session.tensor_mut(x), COND_N])
            session.launch(
                above,
                tf.LaunchConfig(1, 1),
                [again, session.tensor(x), COND_N, tf.f32(0.75), session.tensor_mut(passes)],
            )
    assert cap.graph.kernels == ()  # kernels of a body are not listed
    assert repr(again) == "GraphCondition(default=1, drives an while node)"
    want, n = x0.astype(np.float64), 0
    while True:  # the loop on the host, in float64: halvings are exact
        want, n = want * 0.5, n + 1
        if np.abs(want).max() <= 0.75:
            break
    assert n > 3
    for replay in (1, 2):  # the condition is its default again at each replay
        session.copy(x, session.upload(x0))
        cap.graph.launch()
        np.testing.assert_array_equal(session.download(x), want)
        assert int(session.download(passes)[0]) == n * replay


@pytest.mark.gpu
def test_an_if_node_runs_its_body_only_when_the_kernel_sets_the_condition(session, rng):
    mod = session.compile(CONDITIONAL)
    set_if, add_one = mod.function("set_if_positive"), mod.function("add_one")
    x0 = rng.standard_normal(COND_N).astype(np.float32)
    x, flag = session.upload(x0), session.upload(np.array([1], np.int32))
    with session.capture() as cap:
        when = cap.condition(default=0)
        session.launch(set_if, tf.LaunchConfig(1, 1), [when, session.tensor(flag)])
        with cap.capture_if(when):
            session.launch(add_one, tf.LaunchConfig.flat(COND_N), [session.tensor_mut(x), COND_N])
        session.launch(add_one, tf.LaunchConfig.flat(COND_N), [session.tensor_mut(x), COND_N])
    set_node, after = cap.graph.kernels  # the kernels outside the body, in order
    assert set_node.fn is set_if and after.fn is add_one
    one = np.float32(1)
    cap.graph.launch()  # flag 1: both adds, one after the other in float32
    np.testing.assert_array_equal(session.download(x), (x0 + one) + one)
    session.copy(flag, session.upload(np.array([-3], np.int32)))
    cap.graph.launch()  # flag -3: the add after the node only
    np.testing.assert_array_equal(session.download(x), ((x0 + one) + one) + one)


@pytest.mark.gpu
def test_conditions_are_refused_outside_their_capture_and_where_they_do_not_fit(session):
    mod = session.compile(CONDITIONAL)
    set_if, add_one = mod.function("set_if_positive"), mod.function("add_one")
    flag = session.upload(np.array([1], np.int32))
    x = session.upload(np.zeros(4, np.float32))
    scratch = session.upload(np.zeros(4, np.float32))
    with session.capture() as other:
        foreign = other.condition()
        with other.capture_if(foreign):
            session.launch(add_one, tf.LaunchConfig(1, 4), [session.tensor_mut(x), 4])
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.capture: 1 condition\(s\) made with cap\.condition\(\) drive no node",
    ):
        with session.capture() as unused:
            unused.condition()
            session.launch(add_one, tf.LaunchConfig(1, 4), [session.tensor_mut(x), 4])
    assert unused.graph is None
    with pytest.raises(tf.RuntimeStateError, match=r"^capture\.condition: only inside the capture"):
        other.condition()
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[0\] is a GraphCondition of a capture that has ended",
    ):
        session.launch(set_if, tf.LaunchConfig(1, 1), [foreign, session.tensor(flag)])
    with session.capture() as cap:
        for default in (-1, 2**32, 1.0, "1"):
            with pytest.raises(
                tf.ValidationError,
                match=r"^capture\.condition: default=.* must be an int from 0 to 4294967295",
            ):
                cap.condition(default=default)
        lowest, highest = cap.condition(default=0), cap.condition(default=2**32 - 1)
        assert (lowest.default, highest.default) == (0, 2**32 - 1)
        with cap.capture_if(highest):  # nonzero: its body runs at every replay
            session.launch(add_one, tf.LaunchConfig(1, 4), [session.tensor_mut(scratch), 4])
        with pytest.raises(
            tf.ValidationError,
            match=r"^capture\.capture_if: condition must be a GraphCondition of this capture "
            r"\(cap\.condition\(\)\), got one of another capture",
        ):
            cap.capture_if(foreign).__enter__()
        with pytest.raises(
            tf.ValidationError,
            match=r"^capture\.capture_while: condition must be a GraphCondition of this capture "
            r"\(cap\.condition\(\)\), got int",
        ):
            cap.capture_while(1).__enter__()
        with pytest.raises(
            tf.ValidationError,
            match=r"^session\.launch: args\[0\] 'x' is a GraphCondition \(a 64-bit handle\), "
            r"the kernel takes float\*",
        ):
            session.launch(add_one, tf.LaunchConfig(1, 4), [lowest, 4])
        session.launch(set_if, tf.LaunchConfig(1, 1), [lowest, session.tensor(flag)])
        with cap.capture_if(lowest):
            session.launch(add_one, tf.LaunchConfig(1, 4), [session.tensor_mut(x), 4])
        with pytest.raises(
            tf.ValidationError,
            match=r"^capture\.capture_while: condition already drives an if node",
        ):
            cap.capture_while(lowest).__enter__()
    assert cap.graph.node_count == 3  # the if node on highest, the set kernel, lowest's node
    cap.graph.launch()
    np.testing.assert_array_equal(session.download(x), np.ones(4, np.float32))
    np.testing.assert_array_equal(session.download(scratch), np.ones(4, np.float32))


@pytest.mark.gpu
def test_a_body_that_raises_ends_the_capture_and_the_stream_stays_usable(session):
    mod = session.compile(CONDITIONAL)
    add_one = mod.function("add_one")
    x = session.upload(np.zeros(4, np.float32))
    with pytest.raises(KeyError, match="body"):
        with session.capture() as cap:
            again = cap.condition()
            with cap.capture_while(again):
                session.launch(add_one, tf.LaunchConfig(1, 4), [session.tensor_mut(x), 4])
                raise KeyError("body")
    assert cap.graph is None and not cap.running
    session.launch(add_one, tf.LaunchConfig(1, 4), [session.tensor_mut(x), 4])
    np.testing.assert_array_equal(session.download(x), np.ones(4, np.float32))
