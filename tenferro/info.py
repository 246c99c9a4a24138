"""What tenferro finds on this machine: versions, the driver, devices, the compile cache.

`collect` gathers it as data and never raises: what it cannot find it says why (no driver, no
NVRTC, a package not installed). `report` writes it as ``python -m tenferro info`` prints it.
"""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

from . import _driver
from .errors import TenferroError
from .module import cache_dir

__all__ = ["collect", "report"]

_PACKAGES = ("tenferro", "numba", "numba-cuda", "cuda-bindings", "cuda-core", "numpy")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cache() -> dict[str, Any]:
    path = cache_dir()
    entries = [p for p in path.glob("*.tfmod") if not p.name.startswith(".")] \
        if path.is_dir() else []  # .tmp-*.tfmod: a write a process did not finish
    return {"path": str(path), "entries": len(entries),
            "bytes": sum(p.stat().st_size for p in entries)}


def collect() -> dict[str, Any]:
    """The facts ``python -m tenferro info`` prints, as a dict of plain values."""
    out: dict[str, Any] = {"python": platform.python_version(),
                           "packages": {p: _version(p) for p in _PACKAGES}}
    try:
        major, minor = _driver.nvrtc_version()
        out["nvrtc"] = f"{major}.{minor}"
    except TenferroError as exc:
        out["nvrtc"] = None
        out["nvrtc_missing"] = str(exc)
    out["include_dirs"] = _driver.cuda_include_dirs()
    try:
        _driver.ensure_init("tenferro info")
        version = _driver.driver_version()
        out["driver"] = f"{version // 1000}.{version % 1000 // 10}"
        out["devices"] = []
        for ordinal in range(_driver.device_count()):
            name, (cc_major, cc_minor), total = _driver.device_summary(ordinal)
            out["devices"].append({"ordinal": ordinal, "name": name,
                                   "arch": f"sm_{cc_major}{cc_minor}", "memory_bytes": total})
    except TenferroError as exc:
        out["driver"] = None
        out["driver_missing"] = str(exc).removeprefix("tenferro info: ")
        out["devices"] = []
    out["cache"] = _cache()
    return out


def _size(nbytes: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError  # pragma: no cover


def report(facts: dict[str, Any] | None = None) -> str:
    """`collect`'s facts as lines of text."""
    f = collect() if facts is None else facts
    lines = [f"python {f['python']}"]
    lines += [f"{name} {version}" for name, version in f["packages"].items()]
    lines.append(f"NVRTC {f['nvrtc']}" if f["nvrtc"] else f"NVRTC: {f['nvrtc_missing']}")
    lines.append("CUDA headers: " + (", ".join(f["include_dirs"]) or "not found (a compile "
                                     "that includes <cuda_fp16.h> and the like will fail)"))
    if f["driver"] is None:
        lines.append(f"driver: {f['driver_missing']}")
    else:
        lines.append(f"driver: CUDA {f['driver']}, {len(f['devices'])} device(s)")
        lines += [f"  device {d['ordinal']}: {d['name']}, {d['arch']}, "
                  f"{_size(d['memory_bytes'])}" for d in f["devices"]]
    c = f["cache"]
    lines.append(f"compile cache: {c['path']}, {c['entries']} entries, {_size(c['bytes'])}")
    return "\n".join(lines)
