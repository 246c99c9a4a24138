"""A checkout imports its top-level kernels/ as tenferro.kernels, and nothing else of the
repository as tenferro.*: the finder, and what a plain checkout on sys.path imports."""

import os
import pathlib
import subprocess
import sys

from tenferro import _checkout

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _in_checkout(code):
    """Run ``code`` in a fresh interpreter that imports tenferro from the checkout itself."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True, timeout=120
    )


def test_a_checkout_imports_its_kernels_and_no_other_folder_as_tenferro():
    done = _in_checkout(
        "import importlib, pkgutil, tenferro, tenferro.kernels\n"
        "print(tenferro.kernels.__file__)\n"
        "for name in ('benchmarks', 'tests', 'notebooks', 'examples'):\n"
        "    try:\n"
        "        importlib.import_module('tenferro.' + name)\n"
        "        print('imported', name)\n"
        "    except ModuleNotFoundError:\n"
        "        pass\n"
        "print(sorted({m.name.split('.')[1] for m in\n"
        "              pkgutil.walk_packages(tenferro.__path__, 'tenferro.')}))\n"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == str(ROOT / "kernels" / "__init__.py")
    walked = eval(lines[-1])  # the package's own modules, as a list printed by the child
    assert len(lines) == 2 and "benchmarks" not in walked and "tests" not in walked
    assert {"session", "launch", "span_import", "interop", "_driver"} <= set(walked)


def test_the_finder_answers_for_tenferro_kernels_alone(tmp_path):
    (tmp_path / "__init__.py").write_text("")
    finder = _checkout.KernelsFinder(str(tmp_path))
    spec = finder.find_spec("tenferro.kernels")
    assert spec.name == "tenferro.kernels" and spec.origin == str(tmp_path / "__init__.py")
    assert spec.submodule_search_locations == [str(tmp_path)]
    for other in ("tenferro.benchmarks", "tenferro.kernels.maps", "kernels", "tenferro"):
        assert finder.find_spec(other) is None


def _layout(root, installed, checkout):
    """A tenferro package directory under ``root``, with its own kernels/ and one beside it."""
    package = root / "tenferro"
    package.mkdir(parents=True)
    if installed:
        (package / "kernels").mkdir()
        (package / "kernels" / "__init__.py").write_text("")
    if checkout:
        (root / "kernels").mkdir()
        (root / "kernels" / "__init__.py").write_text("")
    return str(package)


def test_a_finder_is_added_for_a_checkout_once_and_never_for_an_installed_package(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(
        sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, _checkout.KernelsFinder)]
    )
    before = list(sys.meta_path)
    _checkout.find_checkout_kernels(_layout(tmp_path / "a", installed=True, checkout=True))
    _checkout.find_checkout_kernels(_layout(tmp_path / "b", installed=False, checkout=False))
    assert sys.meta_path == before  # installed, or no kernels/ beside the package: nothing
    package = _layout(tmp_path / "c", installed=False, checkout=True)
    _checkout.find_checkout_kernels(package)
    _checkout.find_checkout_kernels(package)
    added = [f for f in sys.meta_path if f not in before]
    assert len(added) == 1 and added[0].directory == str(tmp_path / "c" / "kernels")
    assert sys.meta_path[0] is added[0]  # ahead of an editable install's finder for another tree
