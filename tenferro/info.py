"""What tenferro finds on this machine, and what a session is doing.

`collect` gathers versions, the driver, devices and the compile cache as data and never raises:
what it cannot find it says why (no driver, no NVRTC, a package not installed). `report` writes
it as ``python -m tenferro info`` prints it. `session_facts` describes a session for its repr
and its notebook display, from any thread, without waiting for the GPU.
"""

from __future__ import annotations

import html
import platform
from typing import Any

from . import _driver
from ._version import __version__
from .compiler import cache_dir
from .errors import TenferroError
from .signature import display_name

__all__ = ["collect", "report", "session_facts", "session_html", "session_repr"]

_PACKAGES = (
    "tenferro",
    "numba",
    "numba-cuda",
    "cuda-bindings",
    "cuda-core",
    "numpy",
    "nvtx",
)  # nvtx: the profile extra, which s.range records through


def _version(package: str) -> str:
    from importlib import metadata  # ~10 ms to import: only when a report is asked for

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _package_dir() -> str:
    import os

    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cache() -> dict[str, Any]:
    path = cache_dir()
    entries = (
        [p for p in path.glob("*.tfmod") if not p.name.startswith(".")] if path.is_dir() else []
    )  # .tmp-*.tfmod: a write a process did not finish
    return {
        "path": str(path),
        "entries": len(entries),
        "bytes": sum(p.stat().st_size for p in entries),
    }


def collect() -> dict[str, Any]:
    """The facts ``python -m tenferro info`` prints, as a dict of plain values."""
    out: dict[str, Any] = {
        "python": platform.python_version(),
        "packages": {p: _version(p) for p in _PACKAGES},
    }
    if out["packages"]["tenferro"] == "not installed":  # run from a checkout on the path
        out["packages"]["tenferro"] = f"{__version__} (not installed: from {_package_dir()})"
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
            out["devices"].append(
                {
                    "ordinal": ordinal,
                    "name": name,
                    "arch": f"sm_{cc_major}{cc_minor}",
                    "memory_bytes": total,
                }
            )
    except TenferroError as exc:
        out["driver"] = None
        out["driver_missing"] = str(exc).removeprefix("tenferro info: ")
        out["devices"] = []
    out["cache"] = _cache()
    return out


def _size(nbytes: int) -> str:
    size = float(nbytes)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{nbytes} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError  # pragma: no cover


def report(facts: dict[str, Any] | None = None) -> str:
    """`collect`'s facts as lines of text."""
    f = collect() if facts is None else facts
    lines = [f"python {f['python']}"]
    lines += [f"{name} {version}" for name, version in f["packages"].items()]
    lines.append(f"NVRTC {f['nvrtc']}" if f["nvrtc"] else f"NVRTC: {f['nvrtc_missing']}")
    lines.append(
        "CUDA headers: "
        + (
            ", ".join(f["include_dirs"])
            or "not found (a compile that includes <cuda_fp16.h> and the like will fail)"
        )
    )
    if f["driver"] is None:
        lines.append(f"driver: {f['driver_missing']}")
    else:
        lines.append(f"driver: CUDA {f['driver']}, {len(f['devices'])} device(s)")
        lines += [
            f"  device {d['ordinal']}: {d['name']}, {d['arch']}, {_size(d['memory_bytes'])}"
            for d in f["devices"]
        ]
    c = f["cache"]
    lines.append(f"compile cache: {c['path']}, {c['entries']} entries, {_size(c['bytes'])}")
    return "\n".join(lines)


def session_facts(st: Any) -> dict[str, Any]:
    """A session's state, device, stream, memory, launches and the last ones, as plain values.

    Never raises and never waits: a fact the driver does not give (no device, a faulted
    context) is left out. ``memory`` is tenferro's pool on the device while the session is open.
    """
    if st.is_open:
        state = "faulted" if st.faulted else "open"
    else:
        state = "closed" if st.thread is not None else "not entered"
    try:
        last = [display_name(n) for n in st.recent_launches]
    except RuntimeError:  # appended to by the session's thread while this one read it
        last = []
    out: dict[str, Any] = {
        "device": st.device,
        "state": state,
        "launches": st.launch_count,
        "last_launches": last,
    }
    try:
        name, (major, minor), _ = _driver.device_summary(st.device)
        out["name"], out["arch"] = name, f"sm_{major}{minor}"
    except Exception:  # no driver or no such device: the ordinal is all there is to say
        pass
    if st.is_open:
        out["stream"] = st.stream
        try:
            out["memory"] = st.context.pool_stats()
        except Exception:  # a faulted context refuses; the rest still describes the session
            pass
    return out


def _memory(stats: dict[str, int]) -> str:
    return f"{_size(stats['used_bytes'])} used of {_size(stats['reserved_bytes'])} reserved"


def session_repr(st: Any) -> str:
    """``Session(device=0 'NVIDIA H200' sm_90, open, stream, memory, 5 launch(es), last: ...)``."""
    try:
        f = session_facts(st)
    except AttributeError:  # a Session whose __init__ refused its arguments
        return "Session(not made)"
    parts = [
        f"device={f['device']}" + (f" {f['name']!r} {f['arch']}" if "name" in f else ""),
        f["state"],
    ]
    if "stream" in f:
        parts.append(f"stream 0x{f['stream']:x}")
    if "memory" in f:
        parts.append(_memory(f["memory"]))
    if f["launches"]:
        parts.append(f"{f['launches']} launch(es), last: " + ", ".join(f["last_launches"]))
    return f"Session({', '.join(parts)})"


def session_html(st: Any) -> str:
    """The session as a small table, for notebooks."""
    try:
        f = session_facts(st)
    except AttributeError:
        return "<b>tenferro Session</b> (not made)"
    rows = [
        ("device", f"{f['device']}" + (f": {f['name']} ({f['arch']})" if "name" in f else "")),
        ("state", f["state"]),
    ]
    if "stream" in f:
        rows.append(("stream", f"0x{f['stream']:x}"))
    if "memory" in f:
        rows.append(("memory", _memory(f["memory"])))
    rows.append(
        (
            "launches",
            f"{f['launches']}; last: {', '.join(f['last_launches'])}"
            if f["launches"]
            else "none yet",
        )
    )
    cells = "".join(
        f"<tr><th style='text-align:left'>{k}</th><td>{html.escape(v)}</td></tr>" for k, v in rows
    )
    return f"<b>tenferro Session</b><table>{cells}</table>"
