"""``python -m tenferro info``: what it reports, with and without a driver (faked where the
machine has not got one), and that it never needs a GPU."""

import subprocess
import sys

import pytest

from tenferro import _driver, info
from tenferro.errors import RuntimeStateError


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
    _fake_driver(monkeypatch, [("NVIDIA H200", (9, 0), 150_754_820_096),
                               ("NVIDIA A100-SXM4-40GB", (8, 0), 42_505_273_344)])
    lines = info.report().splitlines()
    assert "driver: CUDA 13.0, 2 device(s)" in lines
    assert "  device 0: NVIDIA H200, sm_90, 140.4 GiB" in lines
    assert "  device 1: NVIDIA A100-SXM4-40GB, sm_80, 39.6 GiB" in lines
    assert f"compile cache: {cache}, 2 entries, 3.0 KiB" in lines
    facts = info.collect()
    assert facts["devices"][1] == {"ordinal": 1, "name": "NVIDIA A100-SXM4-40GB", "arch": "sm_80",
                                   "memory_bytes": 42_505_273_344}


def test_report_says_why_there_is_no_driver(monkeypatch, cache):
    def missing(op=""):
        raise RuntimeStateError(f"{op}: no CUDA driver on this machine (libcuda could not be "
                                "loaded: not found)")

    monkeypatch.setattr(_driver, "ensure_init", missing)
    lines = info.report().splitlines()
    assert "driver: no CUDA driver on this machine (libcuda could not be loaded: not found)" \
        in lines
    assert not any(line.startswith("  device") for line in lines)
    assert info.collect()["devices"] == []


def test_report_says_why_there_is_no_nvrtc(monkeypatch, cache):
    def missing():
        raise RuntimeStateError("compile_cuda: NVRTC could not be loaded (gone); it comes with "
                                "the cu13 or cu12 extra")

    monkeypatch.setattr(_driver, "nvrtc_version", missing)
    assert "NVRTC: compile_cuda: NVRTC could not be loaded (gone); it comes with the cu13 or " \
           "cu12 extra" in info.report().splitlines()


def test_a_cache_not_made_yet_is_empty(tmp_path, monkeypatch):
    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path / "never"))
    assert info.collect()["cache"] == {"path": str(tmp_path / "never"), "entries": 0, "bytes": 0}


@pytest.mark.parametrize(("nbytes", "text"), [(0, "0 bytes"), (1023, "1023 bytes"),
                                              (1024, "1.0 KiB"), (1536 * 1024, "1.5 MiB"),
                                              (3 << 40, "3072.0 GiB")])
def test_sizes_read_in_binary_units(nbytes, text):
    assert info._size(nbytes) == text


def test_the_command_runs_on_any_machine_and_names_the_packages(cache):
    r = subprocess.run([sys.executable, "-m", "tenferro", "info"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    for package in ("tenferro", "numba-cuda", "cuda-bindings"):
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
