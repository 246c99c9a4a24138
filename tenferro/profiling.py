"""Profiler ranges: ``with s.range("forward"):`` names a stretch of the program in Nsight Systems.

Ranges go through NVIDIA's ``nvtx`` package (the ``profile`` extra), in the "tenferro" domain,
on the session's thread; the kernels inside appear under them with their own names. Without
the package a range is checked the same way and records nothing, so code that names its
ranges runs unchanged where it is not installed.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from .errors import ValidationError

__all__ = ["DOMAIN", "LAUNCH_RANGES", "LaunchRanges", "Range", "launch_ranges", "named_range"]

# The environment variable that puts a range named after its kernel around every launch.
LAUNCH_RANGES = "TENFERRO_NVTX_LAUNCHES"

DOMAIN = "tenferro"
_MISSING = object()
_nvtx: Any = None  # the nvtx module once looked for, or _MISSING


def _nvtx_module() -> Any:
    """The ``nvtx`` module, or None where it is not installed (looked for once)."""
    global _nvtx
    if _nvtx is None:
        try:
            import nvtx
        except ImportError:
            nvtx = _MISSING
        _nvtx = nvtx
    return None if _nvtx is _MISSING else _nvtx


def _color(color: Any, op: str) -> int | None:
    """``color`` as 0xRRGGBB: None, an int of 24 bits, or a name nvtx knows."""
    if color is None:
        return None
    if isinstance(color, int) and not isinstance(color, bool):
        if not 0 <= color <= 0xFFFFFF:
            raise ValidationError(
                f"{op}: color=0x{color:x} must be 0xRRGGBB (0 to 0xffffff)"
                if color >= 0
                else f"{op}: {color=} must be 0xRRGGBB"
            )
        return color
    if not isinstance(color, str):
        raise ValidationError(f"{op}: color must be a name or 0xRRGGBB, got {type(color).__name__}")
    nvtx = _nvtx_module()
    if nvtx is None:
        return None  # nothing records it: any name will do
    try:
        return int(nvtx.colors.color_to_hex(color))
    except (TypeError, ValueError, KeyError):
        raise ValidationError(
            f"{op}: {color=} is not a color nvtx knows (green, blue, "
            "yellow, purple, cyan, red, ...; or 0xRRGGBB)"
        ) from None


class Range:
    """The context manager ``s.range(name)`` returns; entered once."""

    __slots__ = ("color", "entered", "name", "state")
    state: Any
    name: str
    color: int | None
    entered: bool

    @property
    def session(self) -> Any:
        """The `tenferro.Session` this range belongs to."""
        return self.state.session

    def __init__(self, state: Any, name: str, color: Any = None) -> None:
        op = "session.range"
        if not isinstance(name, str) or not name:
            raise ValidationError(f"{op}: name must be a non-empty str, got {name!r}")
        self.state = state
        self.name = name
        self.color = _color(color, op)
        self.entered = False

    def __enter__(self) -> Range:
        op = "session.range"
        self.state.check_use(op)
        if self.entered:
            raise ValidationError(f"{op}: the range {self.name!r} is entered once")
        self.entered = True
        nvtx = _nvtx_module()
        if nvtx is not None:
            nvtx.push_range(message=self.name, color=self.color, domain=DOMAIN)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        nvtx = _nvtx_module()
        if nvtx is not None:
            nvtx.pop_range(domain=DOMAIN)

    def __repr__(self) -> str:
        return f"Range({self.name!r})"


def named_range(st: Any, name: str, color: Any = None) -> Range:
    """``with s.range("step 3"):``: a range named ``name`` in the profiler (NVTX), or nothing.

    ``color`` is None (nvtx's default), 0xRRGGBB, or a color name nvtx knows. Needs the
    ``nvtx`` package to record anything (``pip install "tenferro[profile]"``).
    """
    return Range(st, name, color)


class LaunchRanges:
    """``push(kernel_name)`` and ``pop()`` of a range around one launch, in tenferro's domain."""

    __slots__ = ("pop", "push")

    def __init__(self, nvtx: Any) -> None:
        self.push = functools.partial(nvtx.push_range, domain=DOMAIN)
        self.pop = functools.partial(nvtx.pop_range, domain=DOMAIN)


def launch_ranges(op: str) -> LaunchRanges | None:
    """The per-launch ranges ``TENFERRO_NVTX_LAUNCHES=1`` asks for, or None (unset or ``0``).

    A session reads it as it opens; while on, its launches take the checked path, so the
    launch costs nothing more when it is off. Without the ``nvtx`` package nothing records.

    Raises:
        ValidationError: The variable has another value than ``0`` or ``1``.
    """
    value = os.environ.get(LAUNCH_RANGES, "")
    if value in ("", "0"):
        return None
    if value != "1":
        raise ValidationError(
            f"{op}: {LAUNCH_RANGES}={value!r} must be 1 (a range around each launch) or 0"
        )
    nvtx = _nvtx_module()
    return None if nvtx is None else LaunchRanges(nvtx)
