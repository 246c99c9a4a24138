"""Streams and events of the current context, as int handles.

Streams are made, destroyed, synchronized and asked whether they are captured or non-blocking;
events are recorded, queried, waited on (by the host or by another stream) and timed. A kernel
fault that a synchronization reports raises a `KernelFault`.
"""

from __future__ import annotations

from .results import check, cu, fail

__all__ = [
    "context_synchronize",
    "event_create",
    "event_destroy",
    "event_elapsed_ms",
    "event_query",
    "event_record",
    "event_synchronize",
    "stream_context",
    "stream_create",
    "stream_destroy",
    "stream_is_capturing",
    "stream_is_non_blocking",
    "stream_synchronize",
    "stream_wait_event",
]


def stream_create() -> int:
    """A new blocking stream in the current context: ordered with the legacy default stream."""
    flags = cu.CUstream_flags.CU_STREAM_DEFAULT
    return int(check("cuStreamCreate", cu.cuStreamCreate(flags)))


def stream_is_non_blocking(stream: int, op: str) -> bool:
    """True for a stream made non-blocking: the legacy default stream does not wait for it."""
    flags = check(op, cu.cuStreamGetFlags(cu.CUstream(stream)))
    return bool(int(flags) & int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))


def stream_destroy(stream: int) -> None:
    """Destroy a stream made by `stream_create`."""
    check("cuStreamDestroy", cu.cuStreamDestroy(cu.CUstream(stream)))


def stream_context(stream: int) -> int:
    """The context a stream belongs to."""
    return int(check("cuStreamGetCtx", cu.cuStreamGetCtx(cu.CUstream(stream))))


def stream_is_capturing(stream: int, op: str) -> bool:
    """True while another library (or this one) captures ``stream`` into a graph."""
    status = check(op, cu.cuStreamIsCapturing(cu.CUstream(stream)))
    return status != cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def context_synchronize(op: str = "cuCtxSynchronize") -> None:
    """Wait for all work of the current context."""
    check(op, cu.cuCtxSynchronize())


def stream_synchronize(stream: int, op: str) -> None:
    """Block until the stream is idle; a kernel fault raises `KernelFault`."""
    check(op, cu.cuStreamSynchronize(cu.CUstream(stream)))


def event_create(timing: bool = False) -> int:
    """A new event; ``timing`` enables elapsed-time queries (and costs a little)."""
    flags = 0 if timing else cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
    return int(check("cuEventCreate", cu.cuEventCreate(flags)))


def event_destroy(event: int) -> None:
    """Destroy an event."""
    check("cuEventDestroy", cu.cuEventDestroy(cu.CUevent(event)))


def event_record(event: int, stream: int, op: str = "cuEventRecord") -> None:
    """Record ``event`` at the current tail of ``stream``."""
    check(op, cu.cuEventRecord(cu.CUevent(event), cu.CUstream(stream)))


def event_query(event: int, op: str = "cuEventQuery") -> bool:
    """True when the work before the event has completed."""
    err = cu.cuEventQuery(cu.CUevent(event))[0]
    if err == cu.CUresult.CUDA_ERROR_NOT_READY:
        return False
    if err:
        raise fail(op, err)
    return True


def event_synchronize(event: int, op: str = "cuEventSynchronize") -> None:
    """Block until the event has completed."""
    check(op, cu.cuEventSynchronize(cu.CUevent(event)))


def event_elapsed_ms(start: int, end: int, op: str = "event.elapsed_ms") -> float:
    """Milliseconds between two completed, timing-enabled events."""
    return float(check(op, cu.cuEventElapsedTime(cu.CUevent(start), cu.CUevent(end))))


def stream_wait_event(stream: int, event: int, op: str = "cuStreamWaitEvent") -> None:
    """Order later work on ``stream`` after ``event``, without blocking the host."""
    check(op, cu.cuStreamWaitEvent(cu.CUstream(stream), cu.CUevent(event), 0))
