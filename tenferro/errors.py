"""The exception hierarchy: every tenferro failure is a `TenferroError`.

Messages name the operation (``"session.launch"``), the argument and what was expected.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "CompileError",
    "KernelFault",
    "RuntimeStateError",
    "TenferroError",
    "ValidationError",
    "negated_view",
    "wrong_device",
]


class TenferroError(Exception):
    """Base of every error tenferro raises."""


class ValidationError(TenferroError, ValueError):
    """An argument was refused before anything reached the driver."""


class RuntimeStateError(TenferroError, RuntimeError):
    """The object is in the wrong state: closed session, wrong thread, no GPU or driver."""


class BackendError(TenferroError, RuntimeError):
    """The CUDA driver refused a call; ``result_name`` is the CUresult name."""

    def __init__(self, message: str, result_name: str = "", result_code: int = 0) -> None:
        super().__init__(message)
        self.result_name = result_name
        self.result_code = result_code


class CompileError(TenferroError):
    """NVRTC (or the numba compiler) refused a source; ``log`` is the compiler's log."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(f"{message}\n{log}" if log else message)
        self.log = log


class KernelFault(BackendError):
    """A kernel faulted asynchronously (illegal address, trap); the session is now unusable.

    ``launches`` names the most recent launches enqueued before the fault was seen.
    """

    def __init__(
        self,
        message: str,
        result_name: str = "",
        result_code: int = 0,
        launches: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message, result_name, result_code)
        self.launches = launches


def wrong_device(op: str, device: int, session_device: int) -> ValidationError:
    """The refusal of an array on ``device`` by a session on ``session_device``."""
    return ValidationError(
        f"{op}: x lives on device {device}, this session is on device {session_device}"
    )


def negated_view(op: str) -> ValidationError:
    """The refusal of a torch view with the neg bit set, whose memory lacks the values' sign."""
    return ValidationError(
        f"{op}: x is a negated view (torch's neg bit, as x.conj().imag "
        "makes): its memory holds the values without their sign; pass "
        "x.resolve_neg()"
    )
