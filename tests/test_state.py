"""SessionState: the guards every operation starts with, the fault that stops a session, and
the one enqueue routine every launch kind ends in (stand-ins for the driver's launcher)."""

import threading

import pytest
from _stand_ins import refusal_in_another_thread

import tenferro as tf
from tenferro._state import SessionState


class _Ordering:
    """A StreamOrdering that records its flushes; ``pending`` as a launch finds it."""

    def __init__(self, pending=()):
        self.pending, self.flushed = list(pending), []

    def flush(self, op):
        self.flushed.append(op)
        self.pending = []


class _Timeline:
    def __init__(self, events):
        self.events = events

    def before_launch(self, op):
        self.events.append(("before", op))

    def after_launch(self, name, config, op):
        self.events.append(("after", name, config, op))


def _open_state(pending=()):
    """A state as `open` leaves it, with no driver: this thread's, open, on stream 0x5."""
    st = SessionState(None, 0, None, None)
    st.is_open, st.thread, st.stream, st.fast_path_ok = True, threading.get_ident(), 0x5, True
    st.ordering = _Ordering(pending)
    return st


def test_enqueue_flushes_times_launches_names_counts_and_holds_in_that_order():
    events = []
    st = _open_state(pending=[0x51])
    st.set_timeline(_Timeline(events))
    assert st.fast_path_ok is False  # a timeline keeps launches on the checked path

    def launch(target):
        events.append(("launch", target, list(st.ordering.flushed), len(st.liveness.held)))
        return 0

    st.enqueue("session.launch", "axpy", "cfg", launch, 0xABC, ["spans"])
    assert events == [
        ("before", "session.launch"),
        ("launch", 0xABC, ["session.launch"], 0),  # flushed first, held after
        ("after", "axpy", "cfg", "session.launch"),
    ]
    assert list(st.recent_launches) == ["axpy"] and st.launch_count == 1
    assert st.liveness.held == [["spans"]]


def test_a_captured_launch_is_held_for_the_graph_and_not_counted():
    st = _open_state()
    saved = st.liveness.begin_capture()
    st.enqueue("graph.launch", "k", None, lambda target: None, "op", "owner")  # None: success
    assert st.launch_count == 0 and list(st.recent_launches) == ["k"]
    assert st.liveness.end_capture(saved) == ["owner"]


@pytest.mark.parametrize(
    "code, cls, name",
    [
        (1, tf.BackendError, "CUDA_ERROR_INVALID_VALUE"),
        (700, tf.KernelFault, "CUDA_ERROR_ILLEGAL_ADDRESS"),
    ],
)
def test_a_refused_launch_raises_the_drivers_result_and_records_nothing(code, cls, name):
    events = []
    st = _open_state()
    st.set_timeline(_Timeline(events))
    with pytest.raises(cls, match=rf"^bound_launch: .*{name}") as got:
        st.enqueue("bound_launch", "k", None, lambda target: code, 0x1, "owner")
    assert got.value.result_name == name and got.value.result_code == code
    assert events == [("before", "bound_launch")]  # not timed, named, counted nor held
    assert list(st.recent_launches) == [] and st.launch_count == 0 and st.liveness.held == []


def test_the_fast_variant_flushes_launches_names_and_counts_and_holds_nothing():
    st = _open_state(pending=[0x51])
    seen = []
    st.enqueue_fast(
        "session.launch",
        "k",
        lambda address: seen.append((address, list(st.ordering.flushed))) or 0,
        0x77,
    )
    assert seen == [(0x77, ["session.launch"])]
    assert list(st.recent_launches) == ["k"] and st.launch_count == 1 and st.liveness.held == []
    with pytest.raises(tf.BackendError, match=r"^session\.launch: .*CUDA_ERROR_INVALID_VALUE"):
        st.enqueue_fast("session.launch", "k", lambda address: 1, 0x77)
    assert list(st.recent_launches) == ["k"] and st.launch_count == 1


def test_the_last_eight_launches_are_named():
    st = _open_state()
    for i in range(9):
        st.enqueue_fast("session.launch", f"k{i}", lambda address: 0, 0)
    assert list(st.recent_launches) == [f"k{i}" for i in range(1, 9)] and st.launch_count == 9


def test_the_first_fault_stops_the_session_naming_the_last_launches_once():
    st = _open_state()
    st.enqueue_fast("session.launch", "axpy", lambda address: 0, 0)
    seen = tf.KernelFault(
        "session.synchronize: CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_ILLEGAL_ADDRESS", 700
    )
    raised = st.record_fault(seen)
    assert str(raised) == (
        "session.synchronize: CUDA_ERROR_ILLEGAL_ADDRESS; last launches: ['axpy']"
    )
    assert raised.launches == ("axpy",) and raised.result_code == 700
    assert st.faulted and st.fast_path_ok is False
    again = tf.KernelFault("session.launch: CUDA_ERROR_ILLEGAL_ADDRESS")
    assert st.record_fault(again) is again  # reported once; later refusals pass as they are
    with pytest.raises(
        tf.KernelFault,
        match=r"^session\.upload: an earlier kernel fault made "
        r"this session unusable",
    ) as refused:
        st.check_use("session.upload")
    assert refused.value.launches == ("axpy",)
    st.check_use("session.synchronize", faulted_ok=True)  # a synchronize may report it again


def test_use_is_refused_when_closed_and_from_another_thread():
    st = SessionState(None, 0, None, None)
    with pytest.raises(tf.RuntimeStateError, match=r"^session\.copy: the session is closed"):
        st.check_use("session.copy")
    st = _open_state()
    st.check_use("session.copy")  # open, on its thread: let by
    assert refusal_in_another_thread(lambda: st.check_use("session.copy")) == (
        "session.copy: the session belongs to the thread that opened it; open a Session on "
        "this thread instead"
    )


def test_the_fast_path_is_open_only_outside_captures_timelines_and_faults():
    st = _open_state()
    st.refresh_fast_path()
    assert st.fast_path_ok is True
    saved = st.liveness.begin_capture()
    st.refresh_fast_path()
    assert st.fast_path_ok is False
    st.liveness.end_capture(saved)
    st.refresh_fast_path()
    assert st.fast_path_ok is True
    st.set_timeline(object())
    assert st.fast_path_ok is False
    st.set_timeline(None)
    assert st.fast_path_ok is True
    st.is_open = False
    st.refresh_fast_path()
    assert st.fast_path_ok is False
    with pytest.raises(
        tf.RuntimeStateError,
        match=r"^session\.capture: not allowed during "
        r"s\.capture\(\): why",
    ):
        st.liveness.capturing = True
        st.refuse_in_capture("session.capture", "why")


class _Nvtx:
    """The nvtx package's range calls, recorded."""

    def __init__(self, events):
        self.events = events

    def push_range(self, message=None, color=None, domain=None):
        self.events.append(("push", message, domain))

    def pop_range(self, domain=None):
        self.events.append(("pop", domain))


def _opened_with(monkeypatch, value, nvtx):
    """A state opened by `open` (stand-in driver) with TENFERRO_NVTX_LAUNCHES=``value``."""
    from tenferro import _driver, profiling
    from tenferro import _state as state_part

    class _Context:
        def make_current(self):
            return 0

    if value is None:
        monkeypatch.delenv(profiling.LAUNCH_RANGES, raising=False)
    else:
        monkeypatch.setenv(profiling.LAUNCH_RANGES, value)
    monkeypatch.setattr(profiling, "_nvtx", nvtx)
    monkeypatch.setattr(_driver.PrimaryContext, "get", lambda device, op: _Context())
    monkeypatch.setattr(state_part, "open_stream", lambda ext, ctx, op: (0x5, frozenset({0x5})))
    monkeypatch.setattr(_driver, "event_create", lambda *a: 0x9)
    monkeypatch.setattr(_driver, "launcher", lambda: None)
    st = SessionState(None, 0, None, None)
    st.open()
    return st


@pytest.mark.parametrize("value", [None, "", "0"])
def test_without_launch_ranges_launches_keep_the_fast_path_and_push_nothing(monkeypatch, value):
    events = []
    st = _opened_with(monkeypatch, value, _Nvtx(events))
    assert st.launch_ranges is None and st.fast_path_ok is True
    st.enqueue("session.launch", "axpy", "cfg", lambda target: 0, 0xABC, ["spans"])
    assert events == []


def test_launch_ranges_name_each_launch_after_its_kernel_around_the_driver_call(monkeypatch):
    events = []
    st = _opened_with(monkeypatch, "1", _Nvtx(events))
    assert st.fast_path_ok is False  # every launch takes the checked path, which has the ranges
    st.refresh_fast_path()
    assert st.fast_path_ok is False

    def launch(target):
        events.append(("launch", target))
        return 0

    st.enqueue("session.launch", "axpy", "cfg", launch, 0xABC, ["spans"])
    st.enqueue("session.capture", "graph of 2 node(s)", None, launch, 0xDEF, ["graph"])
    assert events == [
        ("push", "axpy", "tenferro"),
        ("launch", 0xABC),
        ("pop", "tenferro"),
        ("push", "graph of 2 node(s)", "tenferro"),
        ("launch", 0xDEF),
        ("pop", "tenferro"),
    ]
    assert list(st.recent_launches) == ["axpy", "graph of 2 node(s)"]


def test_launch_ranges_without_the_nvtx_package_record_nothing_and_keep_the_fast_path(
    monkeypatch,
):
    from tenferro import profiling

    st = _opened_with(monkeypatch, "1", profiling._MISSING)
    assert st.launch_ranges is None and st.fast_path_ok is True


@pytest.mark.parametrize("value", ["2", "yes", "true", " 1"])
def test_another_value_of_the_launch_ranges_variable_is_refused_at_open(monkeypatch, value):
    from tenferro import _driver

    opened = []
    monkeypatch.setattr(_driver.PrimaryContext, "get", lambda device, op: opened.append(op))
    monkeypatch.setenv("TENFERRO_NVTX_LAUNCHES", value)
    st = SessionState(None, 0, None, None)
    with pytest.raises(
        tf.ValidationError,
        match=rf"^session\.__enter__: TENFERRO_NVTX_LAUNCHES={value!r} must be 1 \(a range "
        r"around each launch\) or 0$",
    ):
        st.open()
    assert opened == [] and not st.is_open  # refused before the driver was asked anything
