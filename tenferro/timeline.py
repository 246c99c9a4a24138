"""`Timeline`: ``with s.timeline() as t:`` times every launch of the block on the GPU.

Each launch in the block (``s.launch``, a bound launch, a graph replay, the ready kernels) is
enqueued between two timing events of the session's stream. Leaving the block waits for the
stream, reads the events and frees them; then ``t.launches`` holds one `TimedLaunch` each, in
order, and ``t`` shows itself as a table and a bar plot in a notebook. While a timeline is open
every launch takes the checked path, so outside one the launch paths pay nothing for it.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from . import _driver
from .errors import RuntimeStateError, ValidationError
from .signature import display_name

__all__ = ["TimedLaunch", "Timeline", "timeline"]

MAX_LAUNCHES = 100_000  # the default bound on launches timed by one timeline (2 events each)


@dataclass(frozen=True)
class TimedLaunch:
    """One launch of a timeline: what ran and its GPU time in microseconds.

    A graph replay has ``kernel`` "graph of N node(s)" and no grid, block or shared memory.
    """

    kernel: str
    grid: tuple[int, int, int] | None
    block: tuple[int, int, int] | None
    shared_mem_bytes: int | None
    microseconds: float


class Timeline:
    """The context manager ``s.timeline()`` returns; see the module's docstring."""

    @property
    def session(self) -> Any:
        """The `tenferro.Session` this timeline belongs to."""
        return self.state.session

    def __init__(self, state: Any, max_launches: int = MAX_LAUNCHES) -> None:
        if not isinstance(max_launches, int) or isinstance(max_launches, bool) or max_launches < 1:
            raise ValidationError(f"session.timeline: {max_launches=} must be an int >= 1")
        self.state = state
        self.max_launches = max_launches
        self.launches: list[TimedLaunch] = []
        self.untimed: int = 0  # launches past max_launches, enqueued but not timed
        self._pending: list[tuple[int, int, str, Any]] = []  # (start, end, kernel, config)
        self._start = 0  # the start event of the launch being enqueued
        self._phase = "new"

    def __enter__(self) -> Timeline:
        st = self.state
        op = "session.timeline"
        st.check_use(op)
        st.refuse_in_capture(op, "timing events are not captured")
        if self._phase != "new":
            raise RuntimeStateError(f"{op}: a timeline is entered once")
        if st.active_timeline is not None:
            raise RuntimeStateError(f"{op}: a timeline is already open on this session")
        self._phase = "open"
        st.set_timeline(self)  # every launch takes the checked path, which times it
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        st = self.state
        st.set_timeline(None)
        self._phase = "closed"
        pending, self._pending = self._pending, []
        try:
            if exc is None and pending and not st.faulted:  # a fault was reported once already
                st.synchronize("session.synchronize")  # events are read once passed
                self.launches = [
                    TimedLaunch(
                        display_name(kernel),
                        *_config_fields(config),
                        _driver.event_elapsed_ms(start, end, "session.timeline") * 1e3,
                    )
                    for start, end, kernel, config in pending
                ]
        finally:
            self._free(pending)

    def _free(self, pending: list[tuple[int, int, str, Any]]) -> None:
        events = [e for start, end, _, _ in pending for e in (start, end)]
        if self._start:
            events.append(self._start)
            self._start = 0
        for event in events:
            try:
                _driver.event_destroy(event)  # a pending event is freed once the GPU passes it
            except Exception:  # what is left to free is freed all the same
                pass

    # --- called by the launch paths while the timeline is open ---------------------------

    def before_launch(self, op: str) -> None:
        """Record the start event of the launch about to be enqueued."""
        if len(self._pending) >= self.max_launches:
            return
        if not self._start:
            self._start = _driver.event_create(True)
        _driver.event_record(self._start, self.state.stream, op)

    def after_launch(self, kernel: str, config: Any, op: str) -> None:
        """Record the end event of the launch just enqueued (``config`` None for a graph)."""
        if len(self._pending) >= self.max_launches:
            self.untimed += 1
            return
        end = _driver.event_create(True)
        try:
            _driver.event_record(end, self.state.stream, op)
        except BaseException:
            _driver.event_destroy(end)
            raise
        self._pending.append((self._start, end, kernel, config))
        self._start = 0

    # --- what it shows ---------------------------------------------------------------------

    @property
    def total_microseconds(self) -> float:
        """The sum of the launches' GPU times."""
        return sum(t.microseconds for t in self.launches)

    def by_kernel(self) -> dict[str, list[float]]:
        """Each kernel's GPU times in microseconds, in launch order.

        Returns:
            Kernel name -> the GPU time of each of its launches in the block, in
                microseconds; empty until the block has ended. A graph replay is named
                ``"graph of N node(s)"``.
        """
        out: dict[str, list[float]] = {}
        for t in self.launches:
            out.setdefault(t.kernel, []).append(t.microseconds)
        return out

    def _note(self) -> str:
        if self._phase != "closed":
            return "the figures come when the block ends"
        note = f"{len(self.launches)} launch(es), {self.total_microseconds:.1f} µs"
        if self.untimed:
            note += f"; {self.untimed} more past max_launches={self.max_launches} not timed"
        return note

    def __repr__(self) -> str:
        lines = [f"Timeline({self._note()})"]
        for t in self.launches:
            lines.append(
                f"  {t.kernel:<24} {_dims(t.grid):>14} {_dims(t.block):>12} "
                f"{_shared(t.shared_mem_bytes):>8} {t.microseconds:10.2f} µs"
            )
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """A table (kernel, grid, block, shared memory, µs) and a bar of each launch's time."""
        longest = max((t.microseconds for t in self.launches), default=0.0) or 1.0
        rows = "".join(
            f"<tr><td><code>{html.escape(t.kernel)}</code></td><td>{_dims(t.grid)}</td>"
            f"<td>{_dims(t.block)}</td><td>{_shared(t.shared_mem_bytes)}</td>"
            f"<td style='text-align:right'>{t.microseconds:.2f}</td><td>"
            f"<svg width='160' height='10'><rect width='{160 * t.microseconds / longest:.1f}' "
            f"height='10' fill='#4c72b0'/></svg></td></tr>"
            for t in self.launches
        )
        return (
            f"<b>Timeline</b>: {html.escape(self._note())}<table><tr><th>kernel</th>"
            f"<th>grid</th><th>block</th><th>shared memory</th><th>µs</th><th></th></tr>"
            f"{rows}</table>"
        )


def _config_fields(config: Any) -> tuple[Any, Any, Any]:
    if config is None:
        return None, None, None
    return config.grid, config.block, config.shared_mem_bytes


def _dims(d: tuple[int, int, int] | None) -> str:
    return "-" if d is None else "x".join(map(str, d))


def _shared(n: int | None) -> str:
    return "-" if n is None else f"{n} B"


def timeline(st: Any, max_launches: int = MAX_LAUNCHES) -> Timeline:
    """``with s.timeline() as t:``: time each launch of the block on the GPU; then ``t``.

    Leaving the block waits for the stream (it is a barrier, as ``s.synchronize()`` is) and
    reads the times: ``t.launches`` (`TimedLaunch` each), ``t.by_kernel()``, and in a notebook
    a table with a bar plot. Launches past ``max_launches`` run untimed and are counted in
    ``t.untimed``. Refused during a capture, and a capture is refused inside a timeline.
    """
    return Timeline(st, max_launches)
