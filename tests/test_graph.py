"""Graph capture and replay (tenferro.graph), on a GPU."""

import gc
import weakref

import numpy as np
import pytest
from _sources import AXPY, N
from _sources import raw_and_numba_axpy as _kernels

import tenferro as tf


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
        session.launch(axpy, tf.LaunchConfig.flat(N),
                       [session.tensor_mut(out), session.tensor(x), 2.0, N])
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
        with pytest.raises(tf.RuntimeStateError, match=r"session\.alloc_output: not allowed "
                                                       r"during s\.capture\(\)"):
            session.alloc_output(4, np.float32)
        with pytest.raises(tf.RuntimeStateError, match=r"session\.synchronize: not allowed"):
            session.synchronize()
        with pytest.raises(tf.RuntimeStateError, match=r"session\.download: not allowed"):
            session.download(y)
        with pytest.raises(tf.RuntimeStateError, match=r"session\.capture: a capture is already"):
            with session.capture():
                pass
        session.launch(axpy, tf.LaunchConfig.flat(16), [ym, yr, 1.0, 16])
    with pytest.raises(tf.ValidationError, match=r"graph\.launch: stream=5 is refused"):
        cap.graph.launch(stream=5)
    cap.graph.launch()
    session.synchronize()


@pytest.mark.gpu
def test_tensor_dropped_during_capture_is_freed_after_it(session, rng):
    axpy, _ = _kernels(session)
    x0 = rng.standard_normal(16).astype(np.float32)
    y, x = session.alloc_zeros(16, np.float32), session.upload(x0)
    scratch = session.alloc_zeros(1 << 20, np.float32)
    with session.capture() as cap:
        session.launch(axpy, tf.LaunchConfig.flat(16),
                       [session.tensor_mut(y), session.tensor(x), 1.0, 16])
        del scratch  # must not become a free node of the graph
        assert len(session.liveness.deferred_frees) == 1
    assert session.liveness.deferred_frees == []
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
