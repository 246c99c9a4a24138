"""Which sessions are open on each thread, and sessions that live outside a ``with`` block.

A session enters and leaves through `entered` and `left`; `innermost` is the one
`tenferro.from_dlpack` uses by default. `open_session` (``tf.Session.open``) opens one that
stays open across notebook cells until `close_session` (``s.close()``) or interpreter exit;
opening again on the same device from the same thread closes the earlier one, so re-running
a cell does not leave sessions behind. `keep_open` and `kept` are the registry behind it, which
tenferro.torch's per-thread sessions share.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from .errors import RuntimeStateError, ValidationError

if TYPE_CHECKING:
    from .session import Session
    from .spans import TensorMut, TensorRef

__all__ = ["close_kept", "close_session", "entered", "from_dlpack", "innermost", "keep_open",
           "kept", "left", "open_session"]

_local = threading.local()  # .stack: this thread's open sessions, innermost last
_kept: dict[Hashable, Any] = {}  # key -> a session kept open outside a with block
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
        for key in [k for k, v in _kept.items() if v is s]:
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
    s = _kept.get(key)  # one dict read: tenferro.torch asks on every operator call
    return s if s is not None and s.is_open else None


def keep_open(s: Any, key: Hashable, *, innermost: bool = True) -> None:
    """Keep the entered session ``s`` under ``key`` until it closes or the interpreter exits.

    ``innermost=False``: not this thread's default session (`tenferro.from_dlpack` keeps
    using the user's own), as for the sessions tenferro.torch makes behind operators.
    """
    global _exit_hook
    if not innermost:
        _leave_stack(s)
    with _lock:
        _kept[key] = s
        if not _exit_hook:
            atexit.register(_close_at_exit)
            _exit_hook = True


def close_kept(match: Callable[[Hashable], bool]) -> None:
    """Close this thread's kept sessions whose key ``match``es; a refusal closes the rest."""
    me = threading.get_ident()
    with _lock:
        sessions = [s for k, s in _kept.items() if match(k) and s.thread == me]
    for s in sessions:
        try:
            close_session(s)
        except Exception:  # a faulted device: the session is closed all the same
            pass


def open_session(cls: type, device: int = 0, stream: Any = None) -> Any:
    """Open a session now and keep it open until ``s.close()`` or the interpreter's exit.

    For notebooks, where a ``with`` block cannot span cells. The session is the same as one
    a ``with`` block opens (bound to this thread; everything it hands out dies with it).
    Opening again on the same device from the same thread first closes the session opened
    before, whose handles then refuse use.
    """
    key = (threading.get_ident(), device)
    earlier = kept(key)
    if earlier is not None:
        close_session(earlier)
    s = cls(device, stream)
    s.__enter__()
    keep_open(s, key)
    return s


def close_session(s: Any) -> None:
    """Synchronize and close ``s`` as leaving its ``with`` block does; a closed one stays so.

    From another thread than the one that opened it: `RuntimeStateError`, and it stays open.
    """
    if not s.is_open:
        return
    if threading.get_ident() != s.thread:
        raise RuntimeStateError("session.close: the session belongs to the thread that opened "
                                "it; close it there")
    s.__exit__(None, None, None)


def _close_at_exit() -> None:
    # Every kept session of the exiting thread; another thread's cannot be closed from here.
    close_kept(lambda key: True)


def from_dlpack(x: Any, *, session: Session | None = None, writable: bool = False,
                dtype: Any = None, allow_strided: bool = False) -> TensorRef | TensorMut:
    """`Session.from_dlpack` of ``session``, by default this thread's innermost open session."""
    from .session import Session  # here, not above: the session module imports this one

    op = "tenferro.from_dlpack"
    if session is None:
        session = innermost()
        if session is None:
            raise RuntimeStateError(f"{op}: no tf.Session is open on this thread; call it inside "
                                    "`with tf.Session(...)` or pass session=")
    elif not isinstance(session, Session):
        raise ValidationError(f"{op}: session must be a tf.Session, got "
                              f"{type(session).__name__}")
    return session.from_dlpack(x, writable=writable, dtype=dtype, allow_strided=allow_strided)
