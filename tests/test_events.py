"""tenferro.events: timing, cross-stream order, and refusals."""

import numpy as np
import pytest
from _sources import AXPY

import tenferro as tf
from tenferro._state import SessionState


@pytest.mark.gpu
def test_events_time_work_and_order_streams(session, rng):
    fn = session.compile(AXPY).function("slow_scale")
    n = 1024
    x = session.upload(rng.standard_normal(n))
    y = session.alloc_output((n,), np.float64)
    start = session.record_event()
    session.launch(
        fn, tf.LaunchConfig.flat(n), [session.tensor_mut(y), session.tensor(x), 1.0, n, 20_000_000]
    )
    end = session.record_event()
    # elapsed_ms never waits: the kernel spins for milliseconds, so end is still pending.
    assert not end.query()
    with pytest.raises(
        tf.RuntimeStateError, match=r"event\.elapsed_ms: the end event has not completed"
    ):
        start.elapsed_ms(end)
    assert not end.query()  # the refusal did not wait either
    end.synchronize()
    ms = start.elapsed_ms(end)
    assert 1.0 < ms < 1000.0
    assert end.query()
    with pytest.raises(tf.ValidationError, match=r"event\.elapsed_ms: both events need timing"):
        start.elapsed_ms(session.record_event(timing=False))
    with pytest.raises(tf.ValidationError, match=r"session\.wait: event must be an Event"):
        session.wait("now")
    # A second session (own stream) waits on the first one's event without a host block. Its
    # span of y and its first launch come first, so the import's own ordering is spent: the
    # wait alone orders the copy after the slow write.
    with tf.Session() as s2:
        fn2 = s2.compile(AXPY).function("slow_scale")
        out = s2.upload(np.full(n, np.nan))
        copy_y = [s2.tensor_mut(out), s2.tensor(y), 1.0, n, 0]
        s2.launch(fn2, tf.LaunchConfig.flat(n), copy_y)
        s2.synchronize()
        session.launch(
            fn,
            tf.LaunchConfig.flat(n),
            [session.tensor_mut(y), session.tensor(x), 4.0, n, 20_000_000],
        )
        done = session.record_event(timing=False)
        s2.wait(done)
        s2.launch(fn2, tf.LaunchConfig.flat(n), copy_y)  # the same span objects: no new import
        got = s2.download(out)
    np.testing.assert_array_equal(got, 4.0 * session.download(x))


class _EventState:
    """An event's session state: open and not forked, unless told; its fork check is the
    session state's own."""

    check_not_forked = SessionState.check_not_forked

    def __init__(self, is_open=True, forked=False):
        self.is_open, self.forked, self.faults = is_open, forked, []

    def record_fault(self, exc):
        self.faults.append(exc)
        return exc


def _event(state, handle=0x9, timing=True):
    ev = object.__new__(tf.Event)
    ev.state, ev.handle, ev.timing = state, handle, timing
    return ev


@pytest.mark.parametrize(
    ("state", "why"),
    [
        (
            _EventState(forked=True),
            "the event's session was opened before this process was forked from its parent: "
            "this process was forked from one that had initialised CUDA",
        ),
        (_EventState(is_open=False), "the event's session is closed"),
    ],
    ids=["forked", "closed"],
)
def test_an_event_of_a_forked_or_closed_session_refuses_use_and_asks_the_driver_nothing(
    monkeypatch, state, why
):
    from tenferro import _driver

    asked = []
    for name in ("event_query", "event_synchronize", "event_elapsed_ms", "event_destroy"):
        monkeypatch.setattr(_driver, name, lambda *a, name=name: asked.append(name))
    ev, end = _event(state), _event(_EventState())
    for op, call in (
        ("event.query", ev.query),
        ("event.synchronize", ev.synchronize),
        ("event.elapsed_ms", lambda: ev.elapsed_ms(end)),
    ):
        with pytest.raises(tf.RuntimeStateError, match="^" + op.replace(".", r"\.") + ": " + why):
            call()
    assert asked == [] and state.faults == []
    ev.handle = end.handle = 0  # nothing for the finalisers to destroy
