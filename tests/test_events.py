"""tenferro.events: timing, cross-stream order, and refusals."""

import numpy as np
import pytest
from _sources import AXPY

import tenferro as tf


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
    # A second session (own stream) waits on the first one's event without a host block.
    with tf.Session() as s2:
        session.launch(
            fn,
            tf.LaunchConfig.flat(n),
            [session.tensor_mut(y), session.tensor(x), 4.0, n, 20_000_000],
        )
        done = session.record_event(timing=False)
        s2.wait(done)
        out = s2.download(y)  # s2's stream is ordered after the first session's launch
    np.testing.assert_array_equal(out, 4.0 * session.download(x))
