"""The one rule for stream values (tenferro.interop.streams), on every side of each boundary."""

import numpy as np
import pytest

import tenferro as tf
from tenferro.interop import stream_value


class _Obj:
    def __init__(self, ret):
        self.ret = ret

    def __cuda_stream__(self):
        return self.ret


@pytest.mark.parametrize(
    ("value", "kw", "want"),
    [
        (1, {}, 1),
        (2, {}, 2),
        (3, {}, 3),
        (np.int64(0x1000), {}, 0x1000),
        ((1 << 64) - 1, {}, (1 << 64) - 1),
        (None, {}, None),
        (-1, {"no_sync": True}, None),
        (_Obj((0, 0x20)), {"objects": True}, 0x20),
        (_Obj((0, 1)), {"objects": True}, 1),
    ],
)
def test_values_accepted(value, kw, want):
    assert stream_value(value, "stream", "op", **kw) == want


@pytest.mark.parametrize(
    ("value", "kw", "msg"),
    [
        (0, {}, r"stream=0 is ambiguous .*pass 1 for the legacy default stream or 2"),
        (-1, {}, r"stream=-1 is not a stream handle"),
        (-2, {"no_sync": True}, r"stream=-2 is not a stream handle"),
        (1 << 64, {}, r"stream=18446744073709551616 is not a stream handle"),
        (True, {}, r"stream=True must be None, an int$"),
        ("1", {}, r"stream='1' must be None, an int$"),
        (_Obj((0, 0x20)), {}, r"stream=<.*_Obj.*> must be None, an int$"),
        (_Obj((0, 0x20)), {"no_sync": True}, r"stream=<.*_Obj.*> must be None, an int$"),
        (_Obj((1, 0x20)), {"objects": True}, r"stream\.__cuda_stream__\(\) returned \(1, 32\)"),
        (_Obj((0, 0)), {"objects": True}, r"stream=0 is ambiguous"),
    ],
)
def test_values_refused(value, kw, msg):
    with pytest.raises(tf.ValidationError, match=r"^op: " + msg):
        stream_value(value, "stream", "op", **kw)


def test_a_driver_handle_of_0_is_the_legacy_default_stream():
    # torch's default stream reports cuda_stream == 0: the driver's NULL stream, not ambiguous.
    assert stream_value(0, "stream", "op", handle=True) == 1
    assert stream_value(_Obj((0, 0)), "stream", "op", objects=True, handle=True) == 1


def test_session_follows_the_rule():
    assert tf.Session(stream=0).is_open is False  # the NULL stream: accepted
    with pytest.raises(tf.ValidationError, match=r"^Session: stream=-1 is not a stream handle"):
        tf.Session(stream=-1)
    assert tf.Session(stream=1).is_open is False  # the legacy default stream is accepted


class _Context:
    handle, ordinal = 0xC0, 3


def test_open_stream_makes_one_or_checks_the_given_ones_context(monkeypatch):
    from tenferro import _driver
    from tenferro.interop.streams import open_stream

    asked, flags_asked = [], []
    monkeypatch.setattr(_driver, "stream_create", lambda: 0x5000)
    monkeypatch.setattr(
        _driver, "stream_context", lambda h: asked.append(h) or (0xC0 if h == 0x100 else 0xD0)
    )
    monkeypatch.setattr(
        _driver, "stream_is_non_blocking", lambda h, op: flags_asked.append((h, op)) or True
    )
    # The session's own stream is made blocking: ordered with the legacy default stream.
    assert open_stream(None, _Context, "Session") == (0x5000, {0x5000, 1})
    assert open_stream(1, _Context, "Session") == (1, {1})  # the default streams: any context's
    assert open_stream(2, _Context, "Session") == (2, {2, 1})
    assert asked == [] and flags_asked == []
    assert open_stream(0x100, _Context, "Session") == (0x100, {0x100})  # a non-blocking one
    assert flags_asked == [(0x100, "Session")]
    with pytest.raises(
        tf.ValidationError,
        match=r"^Session: stream=0x200 belongs to another context \(0xd0\), "
        r"not device 3's primary context",
    ):
        open_stream(0x200, _Context, "Session")
    assert asked == [0x100, 0x200] and len(flags_asked) == 1


def test_ordered_with_takes_the_legacy_stream_only_for_blocking_streams(monkeypatch):
    # The driver orders a blocking stream (and the per-thread default stream) with the legacy
    # default stream both ways; a non-blocking stream with nothing but itself.
    from tenferro import _driver
    from tenferro.interop.streams import LEGACY, PER_THREAD, ordered_with

    flags_asked = []
    monkeypatch.setattr(
        _driver, "stream_is_non_blocking", lambda h, op: flags_asked.append((h, op)) or h == 0x200
    )
    assert ordered_with(LEGACY, "op") == {LEGACY}
    assert ordered_with(PER_THREAD, "op") == {PER_THREAD, LEGACY}
    assert flags_asked == []  # the default streams' handles are known: no driver call
    assert ordered_with(0x100, "op") == {0x100, LEGACY}
    assert ordered_with(0x200, "op") == {0x200}
    assert flags_asked == [(0x100, "op"), (0x200, "op")]

    def refuse(h, op):
        raise tf.BackendError(f"{op}: the driver returned CUDA_ERROR_INVALID_HANDLE")

    monkeypatch.setattr(_driver, "stream_is_non_blocking", refuse)
    with pytest.raises(tf.BackendError, match=r"^Session: the driver returned CUDA_ERROR_INV"):
        ordered_with(0x300, "Session")


def test_stream_ordering_waits_once_per_producer_stream_at_the_flush(monkeypatch):
    from tenferro import _driver
    from tenferro.interop.streams import StreamOrdering

    waits = []
    monkeypatch.setattr(
        _driver,
        "wait_for_stream",
        lambda waiter, producer, event, op: waits.append((waiter, producer, event, op)),
    )
    order = StreamOrdering(0x50, 0xE0, frozenset((0x50,)))
    assert order.in_order_with == {0x50}
    order.flush("session.launch")
    assert waits == [] and order.pending == []  # nothing pending: no driver call
    for producer in (0x70, 0x71, 0x70, 1):
        order.defer(producer)
    assert order.pending == [0x70, 0x71, 1] and waits == []  # deferred, not yet ordered
    order.flush("session.launch")
    assert waits == [
        (0x50, 0x70, 0xE0, "session.launch"),
        (0x50, 0x71, 0xE0, "session.launch"),
        (0x50, 1, 0xE0, "session.launch"),
    ]
    assert order.pending == []
    order.flush("session.launch")
    assert len(waits) == 3  # flushed once


def test_a_refused_stream_value_says_which_kinds_are_taken():
    with pytest.raises(
        tf.ValidationError,
        match=r"^op: stream='1' must be None, an int or an "
        r"object with __cuda_stream__$",
    ):
        stream_value("1", "stream", "op", objects=True)
