"""Profiler ranges (tenferro.profiling): what reaches nvtx through a stand-in of it, the real
package where installed, nothing without it, every refusal; on a GPU, launches inside one."""

import numpy as np
import pytest
from _sources import AXPY, N

import tenferro as tf
from tenferro import profiling


class _Session:
    """What a range uses of a session."""

    def __init__(self, refuse=None):
        self.refuse, self.used = refuse, []

    def check_use(self, op):
        if self.refuse:
            raise tf.RuntimeStateError(f"{op}: {self.refuse}")
        self.used.append(op)


class _Nvtx:
    """A stand-in of the nvtx package: what was pushed and popped, in order."""

    def __init__(self):
        self.calls = []
        self.colors = self

    def push_range(self, message, color, domain):
        self.calls.append(("push", message, color, domain))

    def pop_range(self, domain):
        self.calls.append(("pop", domain))

    def color_to_hex(self, name):
        if name not in ("green", "blue"):
            raise TypeError(f"Invalid color {name}")
        return {"green": 0x008000, "blue": 0x0000FF}[name]


@pytest.fixture
def nvtx(monkeypatch):
    fake = _Nvtx()
    monkeypatch.setattr(profiling, "_nvtx", fake)
    return fake


def test_a_range_is_pushed_on_entry_and_popped_on_exit_in_the_tenferro_domain(nvtx):
    s = _Session()
    with profiling.named_range(s, "forward", 0x76B900) as outer:
        assert nvtx.calls == [("push", "forward", 0x76B900, "tenferro")]
        with profiling.named_range(s, "layer 1", "green"):
            pass
    assert nvtx.calls[1:] == [
        ("push", "layer 1", 0x008000, "tenferro"),
        ("pop", "tenferro"),
        ("pop", "tenferro"),
    ]
    assert s.used == ["session.range", "session.range"] and repr(outer) == "Range('forward')"


def test_the_users_exception_passes_and_the_range_is_closed(nvtx):
    with pytest.raises(KeyError, match="mine"), profiling.named_range(_Session(), "step"):
        raise KeyError("mine")
    assert nvtx.calls == [("push", "step", None, "tenferro"), ("pop", "tenferro")]


def test_without_nvtx_a_range_is_checked_and_records_nothing(monkeypatch):
    monkeypatch.setattr(profiling, "_nvtx", profiling._MISSING)
    s = _Session()
    with profiling.named_range(s, "step", "any name at all") as r:
        assert r.color is None
    assert s.used == ["session.range"]
    with pytest.raises(tf.ValidationError, match=r"^session\.range: color=0x1000000 must"):
        profiling.named_range(s, "step", 0x1000000)


@pytest.mark.parametrize(
    ("color", "value"), [(0, 0), (0xFFFFFF, 0xFFFFFF), (None, None), ("blue", 0x0000FF)]
)
def test_colors_accepted_up_to_24_bits_and_by_name(nvtx, color, value):
    assert profiling.named_range(_Session(), "r", color).color == value


@pytest.mark.parametrize(
    ("color", "msg"),
    [
        (0x1000000, r"color=0x1000000 must be 0xRRGGBB \(0 to 0xffffff\)"),
        (-1, r"color=-1 must be 0xRRGGBB"),
        (True, r"color must be a name or 0xRRGGBB, got bool"),
        (1.5, r"color must be a name or 0xRRGGBB, got float"),
        (
            "nocolor",
            r"color='nocolor' is not a color nvtx knows \(green, blue, yellow, purple, "
            r"cyan, red, \.\.\.; or 0xRRGGBB\)$",
        ),
    ],
)
def test_color_refusals_name_the_call_and_the_value(nvtx, color, msg):
    with pytest.raises(tf.ValidationError, match=r"^session\.range: " + msg):
        profiling.named_range(_Session(), "r", color)
    assert nvtx.calls == []


@pytest.mark.parametrize("name", ["", None, 5, b"step"])
def test_a_name_must_be_a_non_empty_str(nvtx, name):
    with pytest.raises(
        tf.ValidationError,
        match=rf"^session\.range: name must be a non-empty str, got "
        rf"{repr(name).replace('(', '[(]')}$",
    ):
        profiling.named_range(_Session(), name)
    assert nvtx.calls == []


def test_a_range_of_a_session_that_refuses_use_pushes_nothing(nvtx):
    r = profiling.named_range(_Session(refuse="the session is closed"), "step")
    with pytest.raises(tf.RuntimeStateError, match=r"^session\.range: the session is closed$"):
        r.__enter__()
    assert nvtx.calls == []


def test_a_range_is_entered_once(nvtx):
    r = profiling.named_range(_Session(), "step")
    with r:
        pass
    with pytest.raises(
        tf.ValidationError, match=r"^session\.range: the range 'step' is entered once$"
    ):
        r.__enter__()
    assert [c[0] for c in nvtx.calls] == ["push", "pop"]


def test_the_real_nvtx_package_takes_the_ranges(monkeypatch):
    real = pytest.importorskip("nvtx", reason="the profile extra (nvtx) is not installed")
    monkeypatch.setattr(profiling, "_nvtx", None)  # looked for afresh
    with (
        profiling.named_range(_Session(), "outer", "green"),
        profiling.named_range(_Session(), "inner", 0x123456),
    ):
        assert profiling._nvtx_module() is real
    assert profiling.named_range(_Session(), "r", "red").color == 0xFF0000


@pytest.mark.gpu
def test_launches_inside_a_range_run_as_anywhere(session, rng):
    axpy = session.compile(AXPY).function("axpy")
    x0, y0 = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    x, y = session.upload(x0), session.upload(y0)
    with session.range("axpy twice", "green"):
        for _ in range(2):
            session.launch(
                axpy,
                tf.LaunchConfig.flat(N),
                [session.tensor_mut(y), session.tensor(x), tf.f32(0.5), tf.u32(N)],
            )
    np.testing.assert_allclose(
        session.download(y), y0 + x0.astype(np.float64), rtol=1e-6, atol=1e-6
    )
