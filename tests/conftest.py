import os

import pytest


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    # Each test compiles into its own cache so hit/miss behaviour is observable and isolated.
    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path / "cache"))
    yield


@pytest.fixture
def rng():
    return __import__("numpy").random.default_rng(int.from_bytes(os.urandom(8), "little"))
