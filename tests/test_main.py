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
    r = subprocess.run([sys.executable, "-m", "tenferro", "demo"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "demo: all checks passed" in r.stdout and "refused as it should be" in r.stdout
