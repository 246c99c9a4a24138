"""Which sessions are open on each thread, and sessions that live outside a ``with`` block.

A session enters and leaves through `entered` and `left`; `innermost` is the one
`tenferro.from_dlpack` uses by default. `keep_open` and `kept` are the registry of sessions
kept open outside a ``with`` block (``tf.Session.open``, tenferro.torch's per-thread
sessions) until they close, their thread ends, or the interpreter exits (`close_kept`).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["close_kept", "entered", "innermost", "keep_open", "kept", "left"]

_local = threading.local()  # .stack: this thread's open sessions, innermost last
_kept: dict[Hashable, tuple[Any, int]] = {}  # key -> (a session kept open, its thread)
_lock = threading.Lock()
_exit_hook = False


def entered(s: Any) -> None:
    """Record ``s`` as this thread's innermost open session."""
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(s)


def left(s: Any) -> None:
    """Forget ``s``: it has closed."""
    _leave_stack(s)
    with _lock:
        for key in [k for k, (v, _) in _kept.items() if v is s]:
            del _kept[key]


def _leave_stack(s: Any) -> None:
    stack = getattr(_local, "stack", [])
    if s in stack:
        stack.remove(s)


def innermost() -> Any:
    """This thread's innermost open session, or None."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def kept(key: Hashable) -> Any:
    """The open session `keep_open` registered under ``key``, or None."""
    entry = _kept.get(key)  # one dict read: tenferro.torch asks on every operator call
    return entry[0] if entry is not None and entry[0].is_open else None


def keep_open(s: Any, key: Hashable, *, innermost: bool = True) -> None:
    """Keep ``s``, entered on this thread, under ``key`` until it closes or its thread ends.

    The main thread's kept sessions close at the interpreter's exit.

    ``innermost=False``: not this thread's default session (`tenferro.from_dlpack` keeps
    using the user's own), as for the sessions tenferro.torch makes behind operators.
    """
    global _exit_hook
    if not innermost:
        _leave_stack(s)
    if threading.current_thread() is not threading.main_thread() and not hasattr(_local, "end"):
        _local.end = _ThreadEnd()
    with _lock:
        _kept[key] = (s, threading.get_ident())
        if not _exit_hook:
            atexit.register(_close_at_exit)
            _exit_hook = True


def close_kept(match: Callable[[Hashable], bool]) -> None:
    """Close this thread's kept sessions whose key ``match``es; a refusal closes the rest."""
    me = threading.get_ident()
    with _lock:
        sessions = [s for k, (s, thread) in _kept.items() if match(k) and thread == me]
    for s in sessions:
        try:
            s.close()
        except Exception:  # a faulted device: the session is closed all the same
            pass


class _ThreadEnd:
    """Dropped with the local storage of a thread that kept sessions open, as the thread ends.

    The ending thread, which alone may close them, closes its kept sessions then.
    """

    __slots__ = ("thread",)

    def __init__(self) -> None:
        self.thread = threading.get_ident()

    def __del__(self) -> None:
        if threading.get_ident() == self.thread:  # else a leak until exit, never a refusal
            _close_at_exit()


def _close_at_exit() -> None:
    # Every kept session of the exiting thread; another thread's cannot be closed from here.
    close_kept(lambda key: True)
