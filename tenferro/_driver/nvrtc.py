"""NVRTC: CUDA C compiled to PTX or CUBIN, NVRTC's version, and the CUDA headers it includes.

None of it needs a driver or a GPU. ``cuda.bindings.nvrtc`` is imported on first use, so a
process that never compiles never loads NVRTC; a missing NVRTC is a `RuntimeStateError` naming
the extra that brings it, a failing NVRTC call a `BackendError` naming the call, and a compile
that fails returns its log rather than raising.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import BackendError, RuntimeStateError

__all__ = ["cuda_include_dirs", "nvrtc_compile", "nvrtc_version"]

_NVRTC_MISSING = (
    "NVRTC could not be loaded ({exc}); it comes with the cu13 or cu12 extra: "
    "pip install 'tenferro[cu13]' (CUDA 13 drivers) or 'tenferro[cu12]'"
)


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library in use; `RuntimeStateError` when it is missing."""
    from cuda.bindings import nvrtc

    try:
        res = nvrtc.nvrtcVersion()
    except Exception as exc:  # cuda.pathfinder's DynamicLibNotFoundError, or an OSError
        raise RuntimeStateError(f"compile_cuda: {_NVRTC_MISSING.format(exc=exc)}") from None
    if res[0]:
        raise BackendError(f"nvrtcVersion: NVRTC returned {res[0].name}", res[0].name)
    return int(res[1]), int(res[2])


def nvrtc_compile(
    source: bytes,
    name: bytes,
    options: list[bytes],
    name_expressions: list[bytes],
    want_cubin: bool,
) -> tuple[bool, str, bytes, bytes | None, dict[str, str]]:
    """Compile CUDA C with NVRTC: (ok, log, ptx, cubin or None, {expression: lowered name})."""
    from cuda.bindings import nvrtc

    def chk(op: str, res: tuple) -> Any:
        if res[0]:
            raise BackendError(f"{op}: NVRTC returned {res[0].name}", res[0].name)
        return res[1] if len(res) == 2 else None

    prog = chk("nvrtcCreateProgram", nvrtc.nvrtcCreateProgram(source, name, 0, [], []))
    try:
        for e in name_expressions:
            chk("nvrtcAddNameExpression", nvrtc.nvrtcAddNameExpression(prog, e))
        res = nvrtc.nvrtcCompileProgram(prog, len(options), options)
        size = chk("nvrtcGetProgramLogSize", nvrtc.nvrtcGetProgramLogSize(prog))
        # Fresh, writable buffers: NVRTC writes into them. (``b" " * 1`` is the interpreter's
        # shared constant itself, and writing a NUL into it corrupts every later b" ".)
        log = bytearray(size)
        chk("nvrtcGetProgramLog", nvrtc.nvrtcGetProgramLog(prog, log))
        log_s = bytes(log).rstrip(b"\0 ").decode(errors="replace")
        if res[0]:
            return False, log_s, b"", None, {}
        size = chk("nvrtcGetPTXSize", nvrtc.nvrtcGetPTXSize(prog))
        ptx = bytearray(size)
        chk("nvrtcGetPTX", nvrtc.nvrtcGetPTX(prog, ptx))
        cubin = None
        if want_cubin:
            size = chk("nvrtcGetCUBINSize", nvrtc.nvrtcGetCUBINSize(prog))
            cubin_buf = bytearray(size)
            chk("nvrtcGetCUBIN", nvrtc.nvrtcGetCUBIN(prog, cubin_buf))
            cubin = bytes(cubin_buf)
        lowered = {}
        for e in name_expressions:
            low = chk("nvrtcGetLoweredName", nvrtc.nvrtcGetLoweredName(prog, e))
            lowered[e.decode()] = low.decode() if isinstance(low, bytes) else str(low)
        return True, log_s, bytes(ptx).rstrip(b"\0"), cubin, lowered
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def cuda_include_dirs() -> list[str]:
    """The CUDA toolkit header directories for NVRTC (none found: an empty list).

    The toolkit's own (cuda_fp16.h, ...) and, where present, CCCL's: CUDA 13's
    ``<cooperative_groups.h>`` and ``<cuda/std/...>`` include from it.
    """
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except ImportError:
        find_nvidia_header_directory = None
    found = _header_dir(find_nvidia_header_directory, "cudart")
    if not found:
        for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            if base and os.path.isfile(os.path.join(base, "include", "cuda_fp16.h")):
                found = os.path.join(base, "include")
                break
    if not found:
        return []
    dirs = [str(found)]
    cccl = _header_dir(find_nvidia_header_directory, "cccl")
    if not cccl and os.path.isdir(os.path.join(str(found), "cccl")):
        cccl = os.path.join(str(found), "cccl")
    if cccl and str(cccl) not in dirs:
        dirs.append(str(cccl))
    return dirs


def _header_dir(find: Any, name: str) -> str | None:
    """cuda.pathfinder's directory for ``name``'s headers, or None where it finds none."""
    if find is None:
        return None
    try:
        return find(name)
    except Exception:  # pathfinder refuses names it does not know in older releases
        return None
