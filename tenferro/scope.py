"""Which sessions are open on each thread, and sessions that live outside a ``with`` block.

A session enters and leaves through `entered` and `left`; `innermost` is the one
`tenferro.from_dlpack` uses by default. `open_session` (``tf.Session.open``) opens one that
stays open across notebook cells until `close_session` (``s.close()``) or interpreter exit;
opening again on the same device from the same thread closes the earlier one, so re-running
a cell does not leave sessions behind.
"""

from __future__ import annotations

import atexit
import threading
from typing import TYPE_CHECKING, Any

from .errors import RuntimeStateError, ValidationError

if TYPE_CHECKING:
    from .session import Session
    from .spans import TensorMut, TensorRef

__all__ = ["close_session", "entered", "from_dlpack", "innermost", "left", "open_session"]

_local = threading.local()  # .stack: this thread's open sessions, innermost last
_opened: dict[tuple[int, int], Any] = {}  # (thread, device) -> the session open_session made
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
    stack = getattr(_local, "stack", [])
    if s in stack:
        stack.remove(s)
    with _lock:
        for key in [k for k, v in _opened.items() if v is s]:
            del _opened[key]


def innermost() -> Any:
    """This thread's innermost open session, or None."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def open_session(cls: type, device: int = 0, stream: Any = None) -> Any:
    """Open a session now and keep it open until ``s.close()`` or the interpreter's exit.

    For notebooks, where a ``with`` block cannot span cells. The session is the same as one
    a ``with`` block opens (bound to this thread; everything it hands out dies with it).
    Opening again on the same device from the same thread first closes the session opened
    before, whose handles then refuse use.
    """
    global _exit_hook
    key = (threading.get_ident(), device)
    with _lock:
        earlier = _opened.get(key)
    if earlier is not None:
        close_session(earlier)
    s = cls(device, stream)
    s.__enter__()
    with _lock:
        _opened[key] = s
        if not _exit_hook:
            atexit.register(_close_at_exit)
            _exit_hook = True
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
    with _lock:
        sessions = list(_opened.values())
    for s in sessions:
        try:
            close_session(s)
        except Exception:  # another thread's, or a faulted device: the process ends anyway
            pass


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
