"""The owners behind a session's enqueued work, and when they may go.

Every launch, copy or replay hands the objects it touches (spans, Tensors, host arrays, graphs,
bound launches) to `Liveness.hold`. They stay referenced until the stream has passed that
work: every `fence_every` holds, or `fence_bytes` allocated, the list so far goes to a fence
event, and fences the GPU has passed are retired; `release_all` (after a synchronize) drops
everything. During a capture the holds go to the graph instead (`begin_capture` /
`end_capture`), and Tensors dropped meanwhile are freed after it (`defer_free`), as are
Graphs (`defer_release`: a destroy mid-capture invalidates a capture on a blocking stream).
The blocks of small Tensors dropped are kept for the next small allocation (`keep_block` /
`take_block`): work on the stream uses them in stream order, as the pool's own reuse would.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from . import _driver

__all__ = ["SPARE_BLOCK_BYTES", "Liveness", "capture_on_this_thread"]

SPARE_BLOCK_BYTES = 256  # a Tensor of at most this many bytes gets a block of this size
# Blocks kept for reuse; past it a dropped small Tensor is freed. More than a fence's worth
# (FENCE_EVERY launches), so a loop of reductions finds every result block it needs again.
SPARE_BLOCKS_MAX = 512

# The captures running on each thread, innermost last. A capture's mode is thread-local: a
# synchronous free or destroy on its thread, for any session's object, would invalidate it.
_this_thread = threading.local()


def capture_on_this_thread() -> Liveness | None:
    """The `Liveness` of the innermost capture running on this thread, or None."""
    running = getattr(_this_thread, "captures", None)
    return running[-1] if running else None


class Liveness:
    """One session's holds, fences and deferred frees, on one stream.

    ``generation`` changes whenever the current holds list is replaced (a fence, a release, a
    capture): a `BoundLaunch` holds itself once a generation instead of once a launch.
    """

    __slots__ = (
        "allocated",
        "caches",
        "capturing",
        "deferred_frees",
        "deferred_releases",
        "fence_bytes",
        "fence_every",
        "fences",
        "generation",
        "held",
        "retained",
        "spare_blocks",
        "spare_events",
        "stream",
    )
    stream: int
    fence_every: int
    fence_bytes: int
    held: list[Any]  # owners of work enqueued since the last fence
    fences: collections.deque[tuple[int, list[Any]]]  # (event, owners), oldest first
    spare_events: list[int]
    retained: list[Any]
    deferred_frees: list[int]
    deferred_releases: list[Callable[[], None]]
    spare_blocks: list[int]  # SPARE_BLOCK_BYTES each, free for the next Tensor
    caches: list[Any]  # argument caches of Functions and NumbaKernels
    allocated: int  # bytes allocated since the last fence
    capturing: bool
    generation: int

    def __init__(self, stream: int, fence_every: int, fence_bytes: int) -> None:
        self.stream = stream
        self.fence_every = fence_every
        self.fence_bytes = fence_bytes
        self.held = []  # owners of work enqueued since the last fence
        self.fences = collections.deque()  # (event, owners), oldest first
        self.spare_events = []
        self.retained = []
        self.deferred_frees = []
        self.deferred_releases = []
        self.spare_blocks = []  # SPARE_BLOCK_BYTES each, free for the next Tensor
        self.caches = []  # argument caches of Functions and NumbaKernels
        self.allocated = 0  # bytes allocated since the last fence
        self.capturing = False
        self.generation = 0

    def hold(self, obj: Any) -> None:
        """Keep ``obj`` referenced until the stream has passed what was just enqueued."""
        held = self.held
        held.append(obj)
        if len(held) >= self.fence_every:
            self.fence()

    def allocated_bytes(self, nbytes: int) -> None:
        """Count an allocation; past `fence_bytes` a fence lets owners the GPU passed go."""
        self.allocated += nbytes
        if self.allocated >= self.fence_bytes:
            self.allocated = 0
            self.fence()

    def retain(self, obj: Any) -> None:
        """Keep ``obj`` until `close`."""
        self.retained.append(obj)

    def add_cache(self, cache: Any) -> None:
        """Register an object whose ``forget()`` `release_all` and `close` call.

        Parameter blocks (their remembered arguments), a table of Functions looked up.
        """
        self.caches.append(cache)

    def fence(self) -> None:
        """Hand the owners held so far to an event; drop those of fences the GPU has passed."""
        if self.capturing:  # a graph holds its own owners; events cannot be queried mid-capture
            return
        ev = self.spare_events.pop() if self.spare_events else _driver.event_create()
        _driver.event_record(ev, self.stream, "session.launch")
        self.fences.append((ev, self.held))
        self.held = []
        self.generation += 1
        fences = self.fences
        while fences and _driver.event_query(fences[0][0], "session.launch"):
            self.spare_events.append(fences.popleft()[0])

    def release_all(self) -> None:
        """Drop every hold: the stream has been synchronized."""
        self.held = []
        self.generation += 1
        for c in self.caches:
            c.forget()
        while self.fences:
            self.spare_events.append(self.fences.popleft()[0])

    def begin_capture(self) -> list[Any]:
        """Collect holds apart from here on, for a graph; returns the list to restore."""
        saved, self.held = self.held, []
        self.generation += 1
        self.capturing = True
        running = getattr(_this_thread, "captures", None)
        if running is None:
            running = _this_thread.captures = []
        running.append(self)
        return saved

    def end_capture(self, saved: list[Any]) -> list[Any]:
        """Stop collecting for the graph; returns what the captured work touched."""
        owners, self.held = self.held, saved
        self.generation += 1
        self.capturing = False
        running = getattr(_this_thread, "captures", None)
        if running and self in running:
            running.remove(self)
        return owners

    def defer_free(self, ptr: int) -> None:
        """Free ``ptr`` after the capture (a free during it would become a graph node)."""
        self.deferred_frees.append(ptr)

    def defer_release(self, release: Callable[[], None]) -> None:
        """Call ``release`` (a driver object's destroy) after the capture, before its frees."""
        self.deferred_releases.append(release)

    def keep_block(self, ptr: int) -> bool:
        """Keep the dropped small Tensor's block ``ptr`` for reuse; False where it must be freed.

        Only outside a capture (a block reused there would tie the graph to later work).
        """
        if self.capturing or len(self.spare_blocks) >= SPARE_BLOCKS_MAX:
            return False
        self.spare_blocks.append(ptr)
        return True

    def take_block(self) -> int:
        """A kept block for a new small Tensor, or 0 where none is kept."""
        return self.spare_blocks.pop() if self.spare_blocks else 0

    def free_spare_blocks(self) -> None:
        """Free the kept blocks on the stream (`trim_memory`, `close`)."""
        blocks, self.spare_blocks = self.spare_blocks, []
        for ptr in blocks:
            _driver.mem_free_async(ptr, self.stream)

    def free_deferred(self) -> None:
        """Run what `defer_release` kept, then free what `defer_free` kept (capture over)."""
        releases, self.deferred_releases = self.deferred_releases, []
        for release in releases:
            try:
                release()
            except Exception:  # as the finaliser that deferred it: a failed destroy is dropped
                pass
        frees, self.deferred_frees = self.deferred_frees, []
        for ptr in frees:
            _driver.mem_free_async(ptr, self.stream)

    def close(self) -> None:
        """Free what is deferred, drop everything and destroy the fence events (idle stream)."""
        try:
            self.free_deferred()
            self.free_spare_blocks()
        except Exception:  # a context poisoned by a fault refuses; the process must restart
            pass
        self.held = []
        self.generation += 1
        self.retained.clear()
        for c in self.caches:
            c.forget()
        self.caches.clear()
        for ev, _ in self.fences:
            self.spare_events.append(ev)
        self.fences.clear()
        for ev in self.spare_events:
            try:
                _driver.event_destroy(ev)
            except Exception:  # a context poisoned by a fault may refuse; nothing to keep
                pass
        self.spare_events.clear()
