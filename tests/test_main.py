import subprocess
import sys

import pytest
from conftest import gpu_reason


def test_demo_without_gpu_says_why():
    if gpu_reason() is None:
        pytest.skip("a GPU is present; this checks its absence")
    r = subprocess.run([sys.executable, "-m", "tenferro", "demo"], capture_output=True, text=True)
    assert r.returncode == 2 and "tenferro demo: session: " in r.stderr


@pytest.mark.gpu
def test_demo_runs_and_passes():
    if gpu_reason():
        pytest.skip(gpu_reason())
    r = subprocess.run(
        [sys.executable, "-m", "tenferro", "demo"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "demo: all checks passed" in r.stdout and "refused as it should be" in r.stdout


@pytest.mark.parametrize(
    ("value", "why"),
    [("-1", "-1 is negative; device ordinals start at 0"), ("x", "'x' is not an int")],
)
def test_demo_refuses_a_bad_device_without_a_traceback(value, why):
    r = subprocess.run(
        [sys.executable, "-m", "tenferro", "demo", "--device", value],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and f"argument --device: {why}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_version_is_the_packages_one_place_and_the_installed_metadata():
    import importlib.metadata

    import tenferro as tf
    from tenferro._version import __version__

    done = subprocess.run(
        [sys.executable, "-m", "tenferro", "--version"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout == f"tenferro {tf.__version__}\n"
    assert tf.__version__ == __version__ == importlib.metadata.version("tenferro")
