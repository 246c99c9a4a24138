"""The driver's start, and the devices it sees before any context is made.

`ensure_init` loads libcuda and runs cuInit once a process, or raises a `RuntimeStateError`
saying what is missing (the binding, the driver, a GPU); every entry point that needs the driver
calls it first. `driver_version`, `device_count` and `device_summary` (name, compute capability,
memory) answer without making a context.
"""

from __future__ import annotations

import os
import threading

from ..errors import RuntimeStateError
from .results import IMPORT_ERROR, check, cu, result_name

__all__ = [
    "FORKED_WHY",
    "device_count",
    "device_summary",
    "driver_version",
    "ensure_init",
    "forked_child",
]

_init_lock = threading.Lock()
_initialised = False
_driver_version = 0
# Set in a child forked from a process that had initialised the driver, which it cannot use.
_forked_from_initialised = False
FORKED_WHY = (
    "this process was forked from one that had initialised CUDA, and the driver cannot be "
    "used after a fork; start worker processes with the 'spawn' method "
    "(multiprocessing.get_context('spawn'), torch.multiprocessing.set_start_method('spawn')), "
    "or fork before the parent's first session"
)


def _after_fork_in_child() -> None:
    global _initialised, _forked_from_initialised
    if _initialised:
        _initialised, _forked_from_initialised = False, True


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def forked_child() -> bool:
    """True in a child forked after the driver started: the parent's objects stay unreleased."""
    return _forked_from_initialised


def ensure_init(op: str = "session") -> None:
    """Load libcuda and run cuInit once, or raise `RuntimeStateError` saying why not."""
    global _initialised, _driver_version
    if _initialised:
        return
    with _init_lock:
        if _initialised:
            return
        if _forked_from_initialised:
            raise RuntimeStateError(f"{op}: {FORKED_WHY}")
        if cu is None:
            raise RuntimeStateError(f"{op}: cuda.bindings could not be imported: {IMPORT_ERROR}")
        try:
            res = cu.cuInit(0)
        except Exception as exc:  # libcuda missing: cuda.pathfinder raises its own type
            raise RuntimeStateError(
                f"{op}: no CUDA driver on this machine (libcuda could not be loaded: {exc})"
            ) from None
        if res[0]:
            name = result_name(res[0])
            if name == "CUDA_ERROR_NO_DEVICE":
                raise RuntimeStateError(f"{op}: the CUDA driver found no GPU ({name})")
            raise RuntimeStateError(f"{op}: the CUDA driver failed to initialise ({name})")
        _driver_version = check("cuDriverGetVersion", cu.cuDriverGetVersion())
        _initialised = True


def driver_version() -> int:
    """The driver's CUDA version as an int (13000 for 13.0); 0 when there is no driver."""
    try:
        ensure_init()
    except RuntimeStateError:
        return 0
    return _driver_version


def device_count() -> int:
    """How many devices the driver sees (after CUDA_VISIBLE_DEVICES)."""
    ensure_init()
    return check("cuDeviceGetCount", cu.cuDeviceGetCount())


def device_summary(ordinal: int) -> tuple[str, tuple[int, int], int]:
    """Name, compute capability and total memory in bytes of a device; touches no context."""
    ensure_init("device_summary")
    dev = check("cuDeviceGet", cu.cuDeviceGet(ordinal))
    name = check("cuDeviceGetName", cu.cuDeviceGetName(256, dev)).split(b"\0", 1)[0].decode()
    major, minor = (
        check(
            "cuDeviceGetAttribute",
            cu.cuDeviceGetAttribute(
                getattr(cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_{part}"),
                dev,
            ),
        )
        for part in ("MAJOR", "MINOR")
    )
    total = check("cuDeviceTotalMem", cu.cuDeviceTotalMem(dev))
    return name, (int(major), int(minor)), int(total)
