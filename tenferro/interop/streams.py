"""Streams across libraries: the one rule for stream values, the one way to order streams.

A stream value is read the same way everywhere (``Session(stream=...)``, a CAI v3 ``stream``,
the ``stream`` argument of ``Tensor.__dlpack__``):

- ``1`` is the legacy default stream and ``2`` the per-thread default stream (the driver's
  ``CU_STREAM_LEGACY`` and ``CU_STREAM_PER_THREAD`` handles); any larger int is a stream handle.
- ``0`` inside a protocol (a CAI v3 ``stream``, ``__dlpack__(stream=0)``) is refused: those
  standards call it ambiguous. Given as a driver handle (``Session(stream=0)``, what torch's
  default stream reports as ``cuda_stream``) it is the NULL stream, the legacy default: ``1``.
- ``None`` and ``-1`` mean what the caller's protocol says (no stream of its own, "do not
  synchronize"); `stream_value` refuses them unless the caller allows them.
- an object with ``__cuda_stream__`` (protocol version 0) stands for its handle, where the
  caller accepts objects.
"""

from __future__ import annotations

from typing import Any

from .. import _driver
from ..dtypes import is_int as _is_int
from ..errors import ValidationError
from ..spans import ADDRESS_END as _HANDLE_END

__all__ = [
    "LEGACY",
    "PER_THREAD",
    "StreamOrdering",
    "check_context",
    "open_stream",
    "order_after",
    "ordered_with",
    "stream_value",
]

LEGACY, PER_THREAD = 1, 2


def stream_value(
    value: Any,
    what: str,
    op: str,
    *,
    objects: bool = False,
    no_sync: bool = False,
    handle: bool = False,
) -> int | None:
    """``value`` as a driver stream handle by the rule above.

    A refusal is a `ValidationError` naming ``op`` and ``what`` (the argument's name).
    ``objects``: accept an object with ``__cuda_stream__``. ``no_sync``: accept ``-1`` and
    return None for it. ``handle``: the value is a driver handle, where 0 is the NULL stream
    (returned as `LEGACY`). ``None`` is returned as None.
    """
    if value is None:
        return None
    if objects and hasattr(value, "__cuda_stream__"):
        try:
            got = value.__cuda_stream__()
        except Exception as exc:
            raise ValidationError(f"{op}: {what}.__cuda_stream__() raised {exc!r}") from exc
        if not (
            isinstance(got, tuple)
            and len(got) == 2
            and _is_int(got[0])
            and got[0] == 0
            and _is_int(got[1])
            and 0 <= got[1] < _HANDLE_END
        ):
            raise ValidationError(
                f"{op}: {what}.__cuda_stream__() returned {got!r}; expected "
                "(0, handle): protocol version 0 and a stream handle >= 0"
            )
        value = got[1]
    if not _is_int(value):
        kinds = "None, an int" + (" or an object with __cuda_stream__" if objects else "")
        raise ValidationError(f"{op}: {what}={value!r} must be {kinds}")
    value = int(value)
    if value == -1 and no_sync:
        return None
    if value == 0 and handle:
        return LEGACY
    if value == 0:
        raise ValidationError(
            f"{op}: {what}=0 is ambiguous (the legacy or the per-thread "
            "default stream?); pass 1 for the legacy default stream or 2 for "
            "the per-thread one"
        )
    if not 0 < value < _HANDLE_END:
        raise ValidationError(f"{op}: {what}={value} is not a stream handle")
    return value


def order_after(waiter: int, producer: int, event: int, op: str) -> None:
    """Make ``waiter`` wait for the work enqueued on ``producer`` so far, host unblocked.

    ``event`` is recorded on ``producer``; it may be reused once the wait is enqueued.
    """
    _driver.wait_for_stream(waiter, producer, event, op)


def ordered_with(stream: int, op: str) -> frozenset[int]:
    """The streams whose earlier work the driver orders before ``stream``'s, and ours before theirs.

    ``stream`` itself, and the legacy default stream where ``stream`` is blocking (made without
    CU_STREAM_NON_BLOCKING, as the per-thread default stream is): the driver makes each wait
    for the other's earlier work. Ordering with these needs no event.
    """
    if stream in (LEGACY, PER_THREAD) or not _driver.stream_is_non_blocking(stream, op):
        return frozenset((stream, LEGACY))
    return frozenset((stream,))


def open_stream(external: int | None, context: Any, op: str) -> tuple[int, frozenset[int]]:
    """A session's stream and the streams ordered with it (`ordered_with`).

    ``external=None`` makes a new blocking stream; a given handle must belong to ``context``
    (1 and 2, the default streams, always do).
    """
    if external is None:
        stream = _driver.stream_create()
        return stream, frozenset((stream, LEGACY))
    check_context(external, context, "stream", op)
    return external, ordered_with(external, op)


def check_context(stream: int, context: Any, what: str, op: str) -> None:
    """Refuse a stream handle of another context than ``context`` (the defaults are anyone's)."""
    if stream > PER_THREAD and (ctx := _driver.stream_context(stream)) != context.handle:
        raise ValidationError(
            f"{op}: {what}=0x{stream:x} belongs to another context "
            f"(0x{ctx:x}), not device {context.ordinal}'s primary context"
        )


class StreamOrdering:
    """The producer streams a session must wait for before it next enqueues a kernel.

    An import records the producer's stream here instead of ordering at once, so the spans of
    one launch cost one event record and wait per producer stream, not one per tensor; every
    enqueue path calls `flush` when `pending` is not empty. Waiting at the enqueue rather than
    at the import also waits for what the producer enqueued in between: more, never less.
    A stream in `in_order_with` (`ordered_with`) needs no event: the imports never defer it.
    """

    __slots__ = ("event", "in_order_with", "pending", "stream")
    stream: int
    event: int
    in_order_with: frozenset[int]  # streams the driver orders with ours: no event
    pending: list[int]

    def __init__(self, stream: int, event: int, in_order_with: frozenset[int]) -> None:
        self.stream = stream
        self.event = event
        self.in_order_with = in_order_with  # streams the driver orders with ours: no event
        self.pending = []

    def defer(self, producer: int) -> None:
        """Order the session's stream after ``producer`` before its next enqueue."""
        if producer not in self.pending:
            self.pending.append(producer)

    def flush(self, op: str) -> None:
        """Make the session's stream wait for every pending producer stream (host unblocked)."""
        pending, self.pending = self.pending, []
        for producer in pending:
            order_after(self.stream, producer, self.event, op)
