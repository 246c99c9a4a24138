"""cuda.bindings' driver module, and its results turned into tenferro's errors.

`cu` is ``cuda.bindings.driver``, or None where it could not be imported (`IMPORT_ERROR` says
why, and `ensure_init` raises it). `check` raises for a failing result and returns its values;
`fail` makes the exception for one: a `KernelFault` where the result means a kernel poisoned the
context (the work is lost, the session must stop), else a `BackendError` naming the operation
and the CUresult. Every other module of the package checks its driver calls through these, so
nothing above the package sees a CUresult.
"""

from __future__ import annotations

from typing import Any

from ..errors import BackendError, KernelFault

__all__ = ["IMPORT_ERROR", "check", "cu", "fail", "raise_launch_error", "result_name"]

try:  # cuda-bindings is a dependency, but a broken install must still say so clearly.
    from cuda.bindings import driver as cu
except Exception as exc:  # pragma: no cover - depends on the install
    cu = None
    IMPORT_ERROR: Exception | None = exc
else:
    IMPORT_ERROR = None

# Results that mean the context is poisoned by a kernel: the work is lost, the session must stop.
_FAULT_NAMES = frozenset(
    {
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_LAUNCH_TIMEOUT",
        "CUDA_ERROR_ECC_UNCORRECTABLE",
        "CUDA_ERROR_UNKNOWN",
    }
)


def result_name(err: Any) -> str:
    """The CUresult name of ``err`` (``"CUDA_ERROR_INVALID_VALUE"``)."""
    try:
        return cu.CUresult(int(err)).name
    except Exception:  # pragma: no cover - an unknown code
        return f"CUresult({int(err)})"


def fail(op: str, err: Any) -> BackendError:
    """The exception for the failing result ``err`` of ``op``.

    A `KernelFault` where the result means a kernel poisoned the context, a `BackendError`
    naming the CUresult otherwise.
    """
    name = result_name(err)
    if name in _FAULT_NAMES:
        return KernelFault(f"{op}: the device reported {name}", name, int(err))
    return BackendError(f"{op}: the driver returned {name}", name, int(err))


def check(op: str, res: tuple) -> Any:
    """Raise for a failing result; return the single value, the tuple of values, or None."""
    if res[0]:
        raise fail(op, res[0])
    if len(res) == 1:
        return None
    return res[1] if len(res) == 2 else res[1:]


def raise_launch_error(err: Any, op: str) -> None:
    """Raise the exception for a failed launch result."""
    raise fail(op, err)
