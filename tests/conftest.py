import collections
import os

import numpy as np
import pytest

import tenferro as tf
from tenferro import _driver


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    # Each test compiles into its own cache so hit/miss behaviour is observable and isolated.
    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path / "cache"))
    yield


@pytest.fixture
def rng():
    """Fresh random inputs each run; a failing test's output names the seed to repeat it with."""
    env = os.environ.get("TENFERRO_TEST_SEED")
    seed = int(env) if env else int.from_bytes(os.urandom(8), "little")
    print(f"rng seed {seed}: repeat with TENFERRO_TEST_SEED={seed}")
    return np.random.default_rng(seed)


# compute-sanitizer keeps the memory a pool frees, and the pool counts it as used, so byte
# counts that must come back to a baseline cannot be checked under it (memory errors still are).
UNDER_SANITIZER = "NV_SANITIZER_INJECTION_PORT_BASE" in os.environ


def pool_bytes_used(device):
    """Bytes tenferro's pool on ``device`` hands out, once garbage and queued frees are done."""
    import gc

    gc.collect()
    with tf.Session(device) as s:
        _driver.context_synchronize()
        return s.memory_stats()["used_bytes"]


def gpu_reason():
    """Why GPU tests cannot run here, or None when they can."""
    try:
        _driver.ensure_init()
        if _driver.device_count() == 0:
            return "the CUDA driver sees no GPU"
    except tf.RuntimeStateError as exc:
        return str(exc)
    return None


@pytest.fixture
def device():
    """The one way GPU tests get a device: its ordinal (0), or a skip with the reason."""
    reason = gpu_reason()
    if reason:
        pytest.skip(f"needs a GPU: {reason}")
    return 0


@pytest.fixture
def session(device):
    """An open Session on the test device, closed after the test."""
    with tf.Session(device=device) as s:
        yield s


class CAI:
    """A hand-made __cuda_array_interface__ producer over any memory, for exact control."""

    def __init__(
        self,
        ptr,
        shape,
        typestr,
        strides=None,
        readonly=False,
        version=3,
        stream=None,
        mask=None,
        keep=None,
    ):
        self.keep = keep
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (ptr, readonly),
            "strides": strides,
            "version": version,
            "stream": stream,
            "mask": mask,
        }


@pytest.fixture
def cai():
    return CAI


def pytest_terminal_summary(terminalreporter):
    """Each reason tests were skipped for, once, with how many (not a line a test)."""
    reasons = collections.Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.section("skipped, by reason")
        for reason, count in reasons.most_common():
            terminalreporter.write_line(f"{count:5d}  {reason}")


@pytest.fixture
def fresh_fast_calls(monkeypatch):
    """The process's fast-call state as at its start, with a small HOT_CALLS and a stand-in
    driver: launches are recorded, not made."""
    from tenferro._driver import fast_launch

    sent = []
    monkeypatch.setattr(fast_launch, "_launch_kernel", lambda *a: sent.append(a) or (0,))
    for name, value in (
        ("_fast_launch", None),
        ("_fast_wait", None),
        ("_calls", 0),
        ("_build_thread", None),
        ("HOT_CALLS", 3),
    ):
        monkeypatch.setattr(fast_launch, name, value)
    return sent
