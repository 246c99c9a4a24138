"""`ResourceCache`: a session's bounded, typed, thread-safe store of things made once."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from .errors import ValidationError

__all__ = ["ResourceCache", "resource"]


class ResourceCache:
    """Key -> value, each made once by its ``init``; the least recently used go past ``limit``."""

    def __init__(self, limit: int = 256) -> None:
        if not isinstance(limit, int) or limit < 1:
            raise ValidationError(f"ResourceCache: {limit=} must be an int >= 1")
        self.limit = limit
        self._items: collections.OrderedDict[Any, tuple[type | None, Any]] = (
            collections.OrderedDict()
        )
        self._lock = threading.RLock()  # init may ask for another resource

    def get(self, key: Any, make: Callable[[], Any], kind: type | None, op: str) -> Any:
        """The value under ``key``, made by ``make()`` on first use."""
        try:
            hash(key)
        except TypeError:
            raise ValidationError(f"{op}: key={key!r} must be hashable") from None
        if kind is not None and not isinstance(kind, type):
            raise ValidationError(f"{op}: kind={kind!r} must be a type or None")
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                made_kind, value = hit
                if kind is not None and made_kind is not None and kind is not made_kind:
                    raise ValidationError(
                        f"{op}: key={key!r} holds a {made_kind.__name__}, "
                        f"asked as kind={kind.__name__}"
                    )
                self._items.move_to_end(key)
                return value
            value = make()
            if kind is not None and not isinstance(value, kind):
                raise ValidationError(
                    f"{op}: init for key={key!r} returned "
                    f"{type(value).__name__}, expected {kind.__name__}"
                )
            self._items[key] = (kind, value)
            while len(self._items) > self.limit:
                self._items.popitem(last=False)
            return value

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        """Drop every value."""
        with self._lock:
            self._items.clear()


def resource(st: Any, key: Any, init: Callable[[Any], Any], kind: type | None = None) -> Any:
    """The value cached under ``key`` for this session, made by ``init(session)`` once.

    ``kind``, when given, is the type the value must have; asking for a key with another
    kind than the one it was made with is a `ValidationError`. The cache is bounded
    (least recently used entries go first) and dies with the session.
    """
    st.check_use("session.resource")
    return st.resources.get(key, lambda: init(st.session), kind, "session.resource")
