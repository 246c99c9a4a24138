"""`Event`: a point in a session's stream, for timing (`elapsed_ms`) and cross-stream order."""

from __future__ import annotations

from typing import Any

from . import _driver
from .errors import KernelFault, RuntimeStateError, ValidationError

__all__ = ["Event"]


class Event:
    """A recorded point of a session's stream (``s.record_event()``).

    Usable while its session is open; ``s.wait(event)`` orders a session's stream after it.
    """

    __slots__ = ("__weakref__", "handle", "state", "timing")
    handle: int
    state: Any
    timing: bool

    @property
    def session(self) -> Any:
        """The `tenferro.Session` this event belongs to."""
        return self.state.session

    def __init__(self, state: Any, timing: bool) -> None:
        self.state = state
        self.timing = timing
        self.handle = 0
        self.handle = _driver.event_create(timing)

    def __del__(self) -> None:
        h, self.handle = getattr(self, "handle", 0), 0
        if h:
            try:
                if not _driver.forked_child():  # a forked child's events are the parent's
                    _driver.event_destroy(h)
            except Exception:  # never raise from a finaliser (at exit, _driver may be gone)
                pass

    def check_open(self, op: str) -> None:
        """Refuse use (naming ``op``) once the event's session has closed, or after a fork."""
        self.state.check_not_forked(op, "the event's session")
        if not self.state.is_open:
            raise RuntimeStateError(f"{op}: the event's session is closed")

    def query(self) -> bool:
        """True when the work recorded before the event has finished; never blocks.

        Returns:
            True once the GPU has passed the event, False while work before it runs.

        Raises:
            RuntimeStateError: The event's session is closed.
            BackendError: The driver refused the query.
            KernelFault: A kernel faulted before the event; the session is stopped.
        """
        self.check_open("event.query")
        try:
            return _driver.event_query(self.handle, "event.query")
        except KernelFault as exc:
            raise self.state.record_fault(exc) from None

    def synchronize(self) -> None:
        """Block the host until the event has completed.

        Raises:
            RuntimeStateError: The event's session is closed.
            BackendError: The driver refused the wait.
            KernelFault: A kernel faulted before the event; the session is stopped.
        """
        self.check_open("event.synchronize")
        try:
            _driver.event_synchronize(self.handle, "event.synchronize")
        except KernelFault as exc:
            raise self.state.record_fault(exc) from None

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds of GPU time from this event to ``end``; both must have completed.

        Both events need ``timing=True`` (the default of ``s.record_event``). An event the GPU
        has not reached yet is a `RuntimeStateError`, not a hidden host wait: call
        ``end.synchronize()`` (or ``s.synchronize()``) first.

        Args:
            end: The later `Event`, recorded with ``timing=True``.

        Returns:
            The GPU time between the two events, in milliseconds (about 0.5 us resolution).

        Raises:
            ValidationError: ``end`` is not an Event, or either event lacks ``timing=True``.
            RuntimeStateError: Either event's session is closed, or either event has not
                completed.
            BackendError: The driver refused the query or the timing.
            KernelFault: A kernel faulted before the events; the session is stopped.
        """
        op = "event.elapsed_ms"
        self.check_open(op)
        if not isinstance(end, Event):
            raise ValidationError(f"{op}: end must be an Event, got {type(end).__name__}")
        end.check_open(op)
        if not (self.timing and end.timing):
            raise ValidationError(
                f"{op}: both events need timing=True "
                f"(start.timing={self.timing}, end.timing={end.timing})"
            )
        try:
            for name, ev in (("start", self), ("end", end)):
                if not _driver.event_query(ev.handle, op):
                    raise RuntimeStateError(
                        f"{op}: the {name} event has not completed; call end.synchronize() "
                        "or s.synchronize() first (elapsed_ms never waits)"
                    )
            return _driver.event_elapsed_ms(self.handle, end.handle, op)
        except KernelFault as exc:
            raise self.state.record_fault(exc) from None

    def __repr__(self) -> str:
        return f"Event(0x{self.handle:x}, timing={self.timing})"


def record_event(st: Any, timing: bool = True) -> Event:
    """Record an event at the current tail of the session's stream."""
    op = "session.record_event"
    st.check_use(op)
    st.refuse_in_capture(op, "events are not captured")
    ev = Event(st, timing)
    _driver.event_record(ev.handle, st.stream, op)
    return ev


def wait_event(st: Any, event: Event) -> None:
    """Order later work on this session's stream after ``event`` (no host block)."""
    op = "session.wait"
    st.check_use(op)
    st.refuse_in_capture(op, "events are not captured")
    if not isinstance(event, Event):
        raise ValidationError(f"{op}: event must be an Event, got {type(event).__name__}")
    event.check_open(op)
    _driver.stream_wait_event(st.stream, event.handle, op)
