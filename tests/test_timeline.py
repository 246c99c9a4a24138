"""The launch timeline (tenferro.timeline): its bookkeeping through a stand-in session and
driver on the CPU, and on a GPU the launches of each path timed in a block."""

import numpy as np
import pytest
from _sources import AXPY, N
from _sources import raw_and_numba_axpy as _kernels

import tenferro as tf
from tenferro import timeline as timeline_part
from tenferro.session import state_of


class StandIn:
    """What a Timeline uses of a session."""

    def __init__(self, capturing=False):
        self.stream = 0x5EED
        self.active_timeline = None
        self.fast_path_ok = True
        self.capturing = capturing
        self.faulted = False
        self.synchronized = 0
        self.used = []

    def check_use(self, op):
        self.used.append(op)

    def refuse_in_capture(self, op, why):
        if self.capturing:
            raise tf.RuntimeStateError(f"{op}: not allowed during s.capture(): {why}")

    def set_timeline(self, timeline):
        self.active_timeline = timeline
        self.fast_path_ok = timeline is None

    def synchronize(self, op):
        self.synchronized += 1


@pytest.fixture
def events(monkeypatch):
    """A driver stand-in: events numbered from 1, each record remembered, 1.5 ms apart."""
    log = {"created": [], "recorded": [], "destroyed": [], "timing": []}

    def create(timing=False):
        log["timing"].append(timing)
        log["created"].append(len(log["created"]) + 1)
        return log["created"][-1]

    def record(event, stream, op):
        log["recorded"].append((event, stream, op))

    def elapsed(start, end, op):
        assert op == "session.timeline"
        return 1.5 * (end - start)

    d = timeline_part._driver
    monkeypatch.setattr(d, "event_create", create)
    monkeypatch.setattr(d, "event_record", record)
    monkeypatch.setattr(d, "event_destroy", log["destroyed"].append)
    monkeypatch.setattr(d, "event_elapsed_ms", elapsed)
    return log


def _launch(t, name, config, op="session.launch"):
    t.before_launch(op)
    t.after_launch(name, config, op)


def test_each_launch_in_the_block_is_timed_between_its_own_two_events(events):
    s = StandIn()
    cfg = tf.LaunchConfig((3, 2), (128, 2), shared_mem_bytes=512)
    with timeline_part.timeline(s) as t:
        assert s.active_timeline is t and s.fast_path_ok is False
        assert s.used == ["session.timeline"]
        _launch(t, "axpy", cfg)
        _launch(t, "_ZN3ops8add_biasEPfPKfii", tf.LaunchConfig(1, 32), "bound_launch")
        _launch(t, "graph of 3 node(s)", None, "graph.launch")
        assert t.launches == [] and s.synchronized == 0  # nothing read before the block ends
    assert s.active_timeline is None and s.fast_path_ok is True and s.synchronized == 1
    assert events["recorded"] == [
        (1, 0x5EED, "session.launch"),
        (2, 0x5EED, "session.launch"),
        (3, 0x5EED, "bound_launch"),
        (4, 0x5EED, "bound_launch"),
        (5, 0x5EED, "graph.launch"),
        (6, 0x5EED, "graph.launch"),
    ]
    assert all(events["timing"])
    assert t.launches == [
        timeline_part.TimedLaunch("axpy", (3, 2, 1), (128, 2, 1), 512, 1500.0),
        timeline_part.TimedLaunch("ops::add_bias", (1, 1, 1), (32, 1, 1), 0, 1500.0),
        timeline_part.TimedLaunch("graph of 3 node(s)", None, None, None, 1500.0),
    ]
    assert sorted(events["destroyed"]) == [1, 2, 3, 4, 5, 6]
    assert t.total_microseconds == 4500.0
    assert t.by_kernel() == {
        "axpy": [1500.0],
        "ops::add_bias": [1500.0],
        "graph of 3 node(s)": [1500.0],
    }


def test_a_block_without_launches_waits_for_nothing(events):
    s = StandIn()
    with timeline_part.timeline(s) as t:
        pass
    assert (t.launches, s.synchronized, events["created"]) == ([], 0, [])
    assert repr(t) == "Timeline(0 launch(es), 0.0 µs)"


def test_a_launch_that_failed_leaves_its_start_event_to_the_next_one(events):
    s = StandIn()
    with timeline_part.timeline(s) as t:
        t.before_launch("session.launch")  # the launch itself then raised: no after_launch
        _launch(t, "axpy", tf.LaunchConfig(1, 32))
    assert events["created"] == [1, 2] and [e for e, _, _ in events["recorded"]] == [1, 1, 2]
    assert [x.microseconds for x in t.launches] == [1500.0]
    assert sorted(events["destroyed"]) == [1, 2]


def test_a_start_event_left_over_is_freed_at_the_end(events):
    s = StandIn()
    with timeline_part.timeline(s):
        t = s.active_timeline
        t.before_launch("session.launch")
    assert events["destroyed"] == [1]


def test_launches_past_max_launches_run_untimed_and_are_counted(events):
    s = StandIn()
    with timeline_part.timeline(s, max_launches=2) as t:
        for _ in range(5):
            _launch(t, "axpy", tf.LaunchConfig(1, 32))
    assert len(t.launches) == 2 and t.untimed == 3
    assert len(events["created"]) == 4 and len(events["recorded"]) == 4
    assert repr(t).splitlines()[0] == (
        "Timeline(2 launch(es), 3000.0 µs; 3 more past max_launches=2 not timed)"
    )


def test_max_launches_of_one_times_one_launch():
    s = StandIn()
    assert timeline_part.timeline(s, max_launches=1).max_launches == 1


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, None])
def test_max_launches_refusals_name_the_call_and_the_value(bad):
    s = StandIn()
    with pytest.raises(
        tf.ValidationError, match=rf"^session\.timeline: max_launches={bad!r} must be an int >= 1$"
    ):
        timeline_part.timeline(s, max_launches=bad)
    assert s.active_timeline is None and s.used == []


def test_the_users_exception_passes_unmasked_and_nothing_is_waited_for(events):
    s = StandIn()
    with pytest.raises(KeyError, match="mine"), timeline_part.timeline(s) as t:
        _launch(t, "axpy", tf.LaunchConfig(1, 32))
        raise KeyError("mine")
    assert s.synchronized == 0 and t.launches == [] and sorted(events["destroyed"]) == [1, 2]
    assert s.active_timeline is None and s.fast_path_ok is True


def test_after_a_fault_handled_in_the_block_the_end_raises_nothing_more(events):
    s = StandIn()
    with timeline_part.timeline(s) as t:
        _launch(t, "axpy", tf.LaunchConfig(1, 32))
        s.faulted = True  # a later call saw the fault; the user handled its KernelFault
    assert (s.synchronized, t.launches, sorted(events["destroyed"])) == (0, [], [1, 2])


def test_a_failed_end_record_frees_its_event_and_raises(events, monkeypatch):
    s = StandIn()

    def refuse(event, stream, op):
        if event == 2:
            raise tf.KernelFault(f"{op}: cuEventRecord failed")
        events["recorded"].append((event, stream, op))

    monkeypatch.setattr(timeline_part._driver, "event_record", refuse)
    with (
        pytest.raises(tf.KernelFault, match=r"^session\.launch: cuEventRecord"),
        timeline_part.timeline(s) as t,
    ):
        _launch(t, "axpy", tf.LaunchConfig(1, 32))
    assert sorted(events["destroyed"]) == [1, 2]


def test_a_second_timeline_on_the_session_or_a_reentry_is_refused(events):
    s = StandIn()
    with timeline_part.timeline(s) as t:
        with pytest.raises(
            tf.RuntimeStateError,
            match=r"^session\.timeline: a timeline is already open on this "
            r"session$",
        ):
            timeline_part.timeline(s).__enter__()
        assert s.active_timeline is t
    with pytest.raises(
        tf.RuntimeStateError, match=r"^session\.timeline: a timeline is entered once$"
    ):
        t.__enter__()
    assert s.active_timeline is None and s.fast_path_ok is True


def test_a_timeline_is_refused_during_a_capture():
    s = StandIn(capturing=True)
    with pytest.raises(
        tf.RuntimeStateError,
        match=r"^session\.timeline: not allowed during "
        r"s\.capture\(\): timing events",
    ):
        timeline_part.timeline(s).__enter__()
    assert s.active_timeline is None and s.fast_path_ok is True


def test_a_capture_is_refused_inside_a_timeline(events):
    from tenferro.graph import Capture

    class Capturable(StandIn):
        class liveness:  # what Capture reads of the session's liveness
            capturing = False

    s = Capturable()
    with timeline_part.timeline(s):
        with pytest.raises(
            tf.RuntimeStateError,
            match=r"^session\.capture: not inside "
            r"s\.timeline\(\); timing events",
        ):
            Capture(s).__enter__()
        assert s.active_timeline is not None


def test_the_table_shows_each_launch_and_bars_scaled_to_the_longest(events, monkeypatch):
    s = StandIn()
    monkeypatch.setattr(
        timeline_part._driver, "event_elapsed_ms", lambda start, end, op: {2: 0.004, 4: 0.001}[end]
    )
    with timeline_part.timeline(s) as t:
        assert repr(t) == "Timeline(the figures come when the block ends)"
        assert t._repr_html_().startswith(
            "<b>Timeline</b>: the figures come when the block ends<table>"
        )
        _launch(t, "fill<float>", tf.LaunchConfig(4, 256))
        _launch(t, "graph of 2 node(s)", None)
    assert repr(t).splitlines()[1:] == [
        "  fill<float>                       4x1x1      256x1x1      0 B       4.00 µs",
        "  graph of 2 node(s)                    -            -        -       1.00 µs",
    ]
    page = t._repr_html_()
    assert "<code>fill&lt;float&gt;</code>" in page and "2 launch(es), 5.0 µs" in page
    assert "<td>4x1x1</td><td>256x1x1</td><td>0 B</td>" in page
    assert "<rect width='160.0'" in page and "<rect width='40.0'" in page
    assert "</td></tr><tr><td><code>graph" in page  # the rows follow one another


# --- on a GPU: every launch path timed, and launches outside the block not --------------------


@pytest.mark.gpu
def test_every_launch_path_in_the_block_is_timed_and_computes(session, rng):
    axpy, nk = _kernels(session)
    cfg = tf.LaunchConfig.flat(N)
    x0, y0 = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    x, y = session.upload(x0), session.upload(y0)
    args = [session.tensor_mut(y), session.tensor(x), tf.f32(2.0), tf.u32(N)]
    session.launch(axpy, cfg, args)  # before the block: not timed
    with session.capture() as cap:
        session.launch(
            axpy, cfg, [session.tensor_mut(y), session.tensor(x), tf.f32(2.0), tf.u32(N)]
        )
    bound = session.bind(axpy, cfg, args)
    with session.timeline() as t:
        assert state_of(session).fast_path_ok is False
        session.launch(axpy, cfg, args)  # the very objects of the last launch: still timed
        bound()
        cap.graph.launch()
        session.launch(nk, cfg, [session.tensor_mut(y), session.tensor(x), tf.f32(0.5), N])
    assert state_of(session).fast_path_ok is True
    session.launch(axpy, cfg, args)  # after the block: not timed
    expected = y0.astype(np.float64) + (2.0 * 5 + 0.5) * x0.astype(np.float64)
    np.testing.assert_allclose(session.download(y), expected, rtol=1e-5, atol=1e-4)
    assert [(x.kernel, x.grid, x.block) for x in t.launches] == [
        ("axpy", cfg.grid, cfg.block),
        ("axpy", cfg.grid, cfg.block),
        ("graph of 1 node(s)", None, None),
        (t.launches[3].kernel, cfg.grid, cfg.block),
    ]
    assert "scale_add" in t.launches[3].kernel
    assert all(0 < x.microseconds < 1e6 for x in t.launches)
    with session.timeline(), pytest.raises(tf.RuntimeStateError, match=r"^session\.capture: "):
        session.capture().__enter__()
    with session.capture(), pytest.raises(tf.RuntimeStateError, match=r"^session\.timeline: "):
        session.timeline().__enter__()


@pytest.mark.gpu
def test_a_timeline_is_a_table_in_a_notebook(session):
    axpy = session.compile(AXPY).function("axpy")
    y, x = (session.upload(np.linspace(-1, 1, N, dtype=np.float32)) for _ in range(2))
    with session.timeline() as t:
        session.launch(
            axpy,
            tf.LaunchConfig.flat(N),
            [session.tensor_mut(y), session.tensor(x), tf.f32(1.0), tf.u32(N)],
        )
    assert "<code>axpy</code>" in t._repr_html_() and repr(t).startswith("Timeline(1 launch(es)")
