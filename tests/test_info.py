"""``python -m tenferro info``: what it reports, with and without a driver (faked where the
machine has not got one), and that it never needs a GPU."""

import subprocess
import sys

import pytest

from tenferro import _driver, info
from tenferro.errors import RuntimeStateError
from tenferro.session import state_of


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    d.mkdir()
    (d / "a.tfmod").write_bytes(b"x" * 1000)
    (d / "b.tfmod").write_bytes(b"y" * 2072)
    (d / ".tmp-c.tfmod").write_bytes(b"z" * 5)  # a write that did not finish: not an entry
    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(d))
    return d


def _fake_driver(monkeypatch, devices):
    monkeypatch.setattr(_driver, "ensure_init", lambda op="": None)
    monkeypatch.setattr(_driver, "driver_version", lambda: 13000)
    monkeypatch.setattr(_driver, "device_count", lambda: len(devices))
    monkeypatch.setattr(_driver, "device_summary", lambda i: devices[i])


def test_report_lists_the_driver_and_each_device(monkeypatch, cache):
    _fake_driver(
        monkeypatch,
        [
            ("NVIDIA H200", (9, 0), 150_754_820_096),
            ("NVIDIA A100-SXM4-40GB", (8, 0), 42_505_273_344),
        ],
    )
    lines = info.report().splitlines()
    assert "driver: CUDA 13.0, 2 device(s)" in lines
    assert "  device 0: NVIDIA H200, sm_90, 140.4 GiB" in lines
    assert "  device 1: NVIDIA A100-SXM4-40GB, sm_80, 39.6 GiB" in lines
    assert f"compile cache: {cache}, 2 entries, 3.0 KiB" in lines
    facts = info.collect()
    assert facts["devices"][1] == {
        "ordinal": 1,
        "name": "NVIDIA A100-SXM4-40GB",
        "arch": "sm_80",
        "memory_bytes": 42_505_273_344,
    }


def test_report_is_the_facts_it_is_given_line_by_line():
    facts = {
        "python": "3.12.1",
        "packages": {"tenferro": "0.1", "numba": "0.62"},
        "nvrtc": "13.0",
        "nvrtc_missing": None,
        "include_dirs": ["/a/include", "/b"],
        "driver": "12.4",
        "devices": [{"ordinal": 0, "name": "GPU", "arch": "sm_90", "memory_bytes": 1 << 30}],
        "cache": {"path": "/c", "entries": 0, "bytes": 0},
    }
    assert info.report(facts).splitlines() == [
        "python 3.12.1",
        "tenferro 0.1",
        "numba 0.62",
        "NVRTC 13.0",
        "CUDA headers: /a/include, /b",
        "driver: CUDA 12.4, 1 device(s)",
        "  device 0: GPU, sm_90, 1.0 GiB",
        "compile cache: /c, 0 entries, 0 bytes",
    ]
    facts["include_dirs"] = []
    assert (
        "CUDA headers: not found (a compile that includes <cuda_fp16.h> and the like will "
        "fail)" in info.report(facts).splitlines()
    )


def test_the_driver_version_reads_as_major_and_minor(monkeypatch, cache):
    _fake_driver(monkeypatch, [])
    monkeypatch.setattr(_driver, "driver_version", lambda: 12040)
    assert info.collect()["driver"] == "12.4"


def test_report_says_why_there_is_no_driver(monkeypatch, cache):
    def missing(op=""):
        raise RuntimeStateError(
            f"{op}: no CUDA driver on this machine (libcuda could not be loaded: not found)"
        )

    monkeypatch.setattr(_driver, "ensure_init", missing)
    lines = info.report().splitlines()
    assert (
        "driver: no CUDA driver on this machine (libcuda could not be loaded: not found)" in lines
    )
    assert not any(line.startswith("  device") for line in lines)
    assert info.collect()["devices"] == []


def test_report_says_why_there_is_no_nvrtc(monkeypatch, cache):
    def missing():
        raise RuntimeStateError(
            "compile_cuda: NVRTC could not be loaded (gone); it comes with the cu13 or cu12 extra"
        )

    monkeypatch.setattr(_driver, "nvrtc_version", missing)
    assert (
        "NVRTC: compile_cuda: NVRTC could not be loaded (gone); it comes with the cu13 or "
        "cu12 extra" in info.report().splitlines()
    )


def test_a_cache_not_made_yet_is_empty(tmp_path, monkeypatch):
    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path / "never"))
    assert info.collect()["cache"] == {"path": str(tmp_path / "never"), "entries": 0, "bytes": 0}


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [
        (0, "0 bytes"),
        (1023, "1023 bytes"),
        (1024, "1.0 KiB"),
        (1536 * 1024, "1.5 MiB"),
        (3 << 40, "3072.0 GiB"),
    ],
)
def test_sizes_read_in_binary_units(nbytes, text):
    assert info._size(nbytes) == text


def test_the_command_runs_on_any_machine_and_names_the_packages(cache):
    r = subprocess.run(
        [sys.executable, "-m", "tenferro", "info"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    for package in ("tenferro", "numba-cuda", "cuda-bindings", "nvtx"):
        assert any(line.startswith(f"{package} ") for line in out), out
    assert any(line.startswith("NVRTC ") for line in out)
    assert any(line.startswith("driver: ") for line in out)
    assert f"compile cache: {cache}, 2 entries, 3.0 KiB" in out


@pytest.mark.gpu
def test_the_report_names_the_sessions_device(session):
    facts = info.collect()
    d = facts["devices"][0]
    major, minor = session.context.compute_capability
    assert d["name"] == session.context.name and d["arch"] == f"sm_{major}{minor}"
    assert d["memory_bytes"] > 0 and facts["driver"] is not None


# --- a session's repr and notebook display, from its state, without a device ------------------


class _Context:
    def __init__(self, stats):
        self.stats = stats

    def pool_stats(self):
        if self.stats is None:
            raise _driver_fault()
        return self.stats


def _driver_fault():
    from tenferro.errors import KernelFault

    return KernelFault("cuMemPoolGetAttribute: CUDA_ERROR_ILLEGAL_ADDRESS")


def _session(open_=True, faulted=False, entered=True, stats=None, launches=()):
    """A tf.Session object in a given state, made without a device."""
    import tenferro as tf
    from tenferro.session import state_of

    s = tf.Session(device=1)
    st = state_of(s)
    st.recent_launches.extend(launches)
    st.launch_count = {2: 12}.get(len(launches), len(launches))  # more than the last few kept
    st.faulted = faulted
    if entered:
        st.thread = 1
    if open_:
        st.stream, st.context, st.is_open = 0x5ABC, _Context(stats), True
    return s


def test_an_open_session_names_its_device_stream_memory_and_last_launches(monkeypatch):
    _fake_driver(monkeypatch, [None, ("NVIDIA H200", (9, 0), 150_754_820_096)])
    s = _session(
        stats={
            "used_bytes": 3 << 20,
            "reserved_bytes": 32 << 20,
            "used_bytes_high": 0,
            "reserved_bytes_high": 0,
        },
        launches=["axpy", "_ZN3ops8add_biasEPfPKfii"],
    )
    assert repr(s) == (
        "Session(device=1 'NVIDIA H200' sm_90, open, stream 0x5abc, 3.0 MiB used "
        "of 32.0 MiB reserved, 12 launch(es), last: axpy, ops::add_bias)"
    )
    page = s._repr_html_()
    rows = [
        ("device", "1: NVIDIA H200 (sm_90)"),
        ("state", "open"),
        ("stream", "0x5abc"),
        ("memory", "3.0 MiB used of 32.0 MiB reserved"),
        ("launches", "12; last: axpy, ops::add_bias"),
    ]
    table = "".join(f"<tr><th style='text-align:left'>{k}</th><td>{v}</td></tr>" for k, v in rows)
    assert table in page  # each row named, in this order, nothing between them


def test_a_session_says_what_state_it_is_in_and_leaves_out_what_the_driver_refuses(monkeypatch):
    def no_device(i):
        raise RuntimeStateError("device_summary: no CUDA driver on this machine")

    monkeypatch.setattr(_driver, "device_summary", no_device)
    assert repr(_session(open_=False, entered=False)) == "Session(device=1, not entered)"
    assert repr(_session(open_=False)) == "Session(device=1, closed)"
    faulted = _session(faulted=True, stats=None, launches=["k"])
    assert repr(faulted) == "Session(device=1, faulted, stream 0x5abc, 1 launch(es), last: k)"
    assert "<td>none yet</td>" in _session(open_=False)._repr_html_()
    assert "<th style='text-align:left'>device</th><td>1</td>" in faulted._repr_html_()
    assert info.session_facts(state_of(faulted)) == {
        "device": 1,
        "state": "faulted",
        "launches": 1,
        "last_launches": ["k"],
        "stream": 0x5ABC,
    }


def test_a_never_opened_session_reads_as_such_on_this_machine():
    import tenferro as tf

    assert repr(tf.Session(device=0)).startswith("Session(device=0")
    assert repr(tf.Session(device=0)).endswith(", not entered)")


@pytest.mark.gpu
def test_a_real_session_reads_as_its_device_memory_and_launches(session):
    import numpy as np

    import tenferro as tf

    name, (major, minor), _ = _driver.device_summary(session.device)
    y = session.upload(np.linspace(-1.0, 1.0, 4096, dtype=np.float32))
    fill = session.compile(
        'extern "C" __global__ void twice(float* y, unsigned n) '
        "{ unsigned i = threadIdx.x; if (i < n) y[i] *= 2.0f; }"
    )
    session.launch(
        fill.function("twice"), tf.LaunchConfig(1, 256), [session.tensor_mut(y), tf.u32(256)]
    )
    text = repr(session)
    assert text.startswith(
        f"Session(device={session.device} {name!r} sm_{major}{minor}, open, "
        f"stream 0x{session.stream:x}, "
    )
    assert " used of " in text and " MiB reserved, " in text  # a pool holds whole MiBs
    assert text.endswith("1 launch(es), last: twice)")
    assert info.session_facts(state_of(session))["memory"]["used_bytes"] >= 4096 * 4
    twice, ym, cfg = fill.function("twice"), session.tensor_mut(y), tf.LaunchConfig(1, 256)
    same = [ym, tf.u32(256)]
    session.launch(twice, cfg, same)  # the checked path (a new argument list)
    session.launch(twice, cfg, same)  # the fast path (the same list again)
    bound = session.bind(twice, cfg, [ym, tf.u32(256)])
    bound()
    with session.capture() as cap:
        session.launch(twice, cfg, [ym, tf.u32(256)])  # captured: not launched
    cap.graph.launch()
    assert info.session_facts(state_of(session))["launches"] == 5  # every path; no capture
    # Five runs of the kernel (the captured launch ran once, as the graph): y doubled 5 times.
    np.testing.assert_array_equal(
        session.download(y),
        np.linspace(-1.0, 1.0, 4096, dtype=np.float32)
        * np.where(np.arange(4096) < 256, 32, 1).astype(np.float32),
    )


def test_a_session_whose_arguments_were_refused_still_reads():
    import tenferro as tf

    half = object.__new__(tf.Session)  # what a traceback may show after __init__ refused
    assert repr(half) == "Session(not made)"
    assert half._repr_html_() == "<b>tenferro Session</b> (not made)"


def test_tenferro_run_from_a_checkout_is_named_with_its_version_and_folder(monkeypatch, cache):
    import tenferro

    real = info._version
    monkeypatch.setattr(info, "_version", lambda p: "not installed" if p == "tenferro" else real(p))
    said = info.collect()["packages"]["tenferro"]
    assert said.startswith(f"{tenferro.__version__} (not installed: from ")
    assert said.endswith(")") and "not installed" in said
    monkeypatch.setattr(info, "_version", lambda p: "9.9" if p == "tenferro" else real(p))
    assert info.collect()["packages"]["tenferro"] == "9.9"  # installed: its own version
