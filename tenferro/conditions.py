"""`GraphCondition`: the value a kernel sets to choose a conditional graph node's branch.

``cap.condition(default=...)`` makes one inside ``with s.capture() as cap:``; it is passed to a
kernel as an argument where the kernel takes a ``cudaGraphConditionalHandle``, and the kernel
calls ``cudaGraphSetConditional(handle, value)``. ``cap.capture_if(condition)`` and
``cap.capture_while(condition)`` make the node it drives. At every replay the condition starts
at its default.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GraphCondition"]


class GraphCondition:
    """A condition of a graph being captured; an argument only inside its capture's block.

    ``default`` is its value at the start of every replay (1: a while loop's body runs at
    least once, an if's body runs unless a kernel sets 0). It drives one conditional node.
    """

    __slots__ = ("capture", "default", "drives", "handle", "made_in", "state")
    state: Any
    capture: Any
    handle: int
    default: int
    drives: str | None
    made_in: int

    def __init__(self, state: Any, capture: Any, handle: int, default: int, made_in: int) -> None:
        self.state = state
        self.capture = capture  # the Capture whose block it was made in
        self.handle = handle
        self.default = default
        self.drives = None  # "if" or "while", once it drives a node
        self.made_in = made_in  # the conditional node whose body it was made in; 0: none

    @property
    def session(self) -> Any:
        """The `tenferro.Session` whose capture made this condition."""
        return self.state.session

    def refusal(self, state: Any) -> str | None:
        """Why this condition cannot be an argument now in ``state``'s session, or None."""
        if state is not self.state:
            return "is a GraphCondition of another session"
        if not self.capture.running:
            return (
                "is a GraphCondition of a capture that has ended; a condition is an argument "
                "only inside the capture that made it"
            )
        return None

    def __repr__(self) -> str:
        node = f", drives an {self.drives} node" if self.drives else ""
        return f"GraphCondition(default={self.default}{node})"
