"""Launches: the checks a launch makes once per function and config, and `BoundLaunch`.

A `BoundLaunch` does every check and the packing once, in ``s.bind``; calling it is the
driver call and the liveness bookkeeping, nothing else.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import _driver
from .errors import KernelFault, ValidationError
from .launch_config import LaunchConfig, check_launch
from .module import Function
from .numba_kernels import NumbaKernel
from .signature import display_name
from .spans import Span

if TYPE_CHECKING:
    from .args import ParamBlockBase

__all__ = [
    "BoundLaunch",
    "bind",
    "build_fast_launcher",
    "checked_function",
    "launch",
    "launch_checked",
]

_get_ident = threading.get_ident
_is = operator.is_


def build_fast_launcher(wait: bool = True) -> bool:
    """Build the compiled launcher now, instead of after the process's 4096th launch.

    Launches start on the Python bindings' ``cuLaunchKernel`` and switch to numba ``@njit``
    calls into libcuda (about a microsecond less a launch) once a background thread has compiled
    them, which starts when the process has made 4096 launches and stream waits. Call this
    before timing launches (a benchmark, a notebook) or at a server's start, so that no
    measurement straddles the switch. It changes how the driver is called, never what a
    launch checks. ``TENFERRO_FAST_LAUNCH=0`` turns the compiled launcher off.

    Args:
        wait: Return once the build is done (seconds, the first time in a process: numba's
            CPU compiler starts); False starts it in the background and returns at once.

    Returns:
        True when launches now go through the compiled launcher; False with
        ``TENFERRO_FAST_LAUNCH=0``, without numba, where libcuda cannot be opened by name,
        or (``wait=False``) while the build is still running.

    Raises:
        ValidationError: ``wait`` is not a bool.
    """
    if type(wait) is not bool:
        raise ValidationError(f"build_fast_launcher: {wait=} must be True or False")
    return _driver.build_fast_calls(wait=wait)


def checked_function(
    st: Any, fn: Any, config: Any, args: list[Any] | tuple[Any, ...], op: str
) -> Function:
    """The Function to launch, with the session, fn, config and args checked."""
    st.check_use(op)
    if not isinstance(args, (list, tuple)):
        raise ValidationError(
            f"{op}: args must be a list or tuple of kernel arguments, got {type(args).__name__}"
        )
    if type(fn) is not Function:
        if type(fn) is not NumbaKernel:
            raise ValidationError(
                f"{op}: fn must be a Function of this session, got {type(fn).__name__}"
            )
        if fn.state is not st:
            raise ValidationError(f"{op}: fn is a NumbaKernel of another session")
        fn = fn.function_for(args, op)
    if fn.state is not st:
        raise ValidationError(f"{op}: fn is a Function of another session")
    if type(config) is not LaunchConfig:  # before the set lookup: a list would not hash
        raise ValidationError(f"{op}: config must be a LaunchConfig, got {type(config).__name__}")
    if config not in fn.checked_configs:
        check_launch(config, fn, op)
        fn.checked_configs.add(config)
    if fn.record_config is not config:
        fn.use_config(config, st.stream)
    return fn


def launch(st: Any, fn: Any, config: Any, args: list[Any] | tuple[Any, ...]) -> None:
    """``s.launch``: check and enqueue one launch on the session's stream; only enqueues.

    Every check of the design runs, but nothing is checked twice: a Function remembers its
    last config, and arguments that are the very objects of its previous launch are already
    checked and packed (and held until replaced, then until the stream passes). Anything new
    (a function, a config, a capture, a timeline, another thread) takes `launch_checked`.
    """
    try:
        if fn.__class__ is NumbaKernel and fn.state is st:  # its Function, if compiled
            fn = fn.known_function(args) or fn
        if (
            fn.__class__ is not Function
            or fn.state is not st
            or config is not fn.last_config
            or not st.fast_path_ok
            or _get_ident() != st.thread
        ):
            launch_checked(st, fn, config, args)
            return
        param_block = fn.param_block
        prev = param_block.last_args  # empty after a synchronize: all is checked again
        if not prev or len(args) != len(prev) or not all(map(_is, args, prev)):
            if not isinstance(args, (list, tuple)):
                raise TypeError  # named below, with the refusal of len() of a non-sequence
            replaced = param_block.last_spans
            param_block.pack_new(args, st, "session.launch")
            # The previous launch may still be running: hold what it used, unless the block
            # kept those very spans (new scalars alone), which it still references.
            if replaced and replaced is not param_block.last_spans:
                st.liveness.hold(replaced)
        st.enqueue_fast("session.launch", fn.name, st.launcher, fn.record_address)
    except KernelFault as exc:  # no cost unless raised: a fence query or the launch saw it
        raise st.record_fault(exc) from None
    except TypeError:  # no cost unless raised: args that are not a list or tuple
        if not isinstance(args, (list, tuple)):
            raise ValidationError(
                f"session.launch: args must be a list or tuple of kernel "
                f"arguments, got {type(args).__name__}"
            ) from None
        raise


def launch_checked(st: Any, fn: Any, config: Any, args: list[Any] | tuple[Any, ...]) -> None:
    """`launch` when anything is new: a function, a config, a capture, another thread."""
    op = "session.launch"
    fn = checked_function(st, fn, config, args, op)
    param_block = fn.param_block
    replaced = param_block.last_spans
    spans = param_block.pack(args, st, op)
    if replaced and replaced is not spans:  # the previous launch may still be reading them
        st.liveness.hold(replaced)
    launcher = _driver.launcher(True) if config.extended else st.launcher
    # spans held always: during a capture the graph takes its owners from the holds
    st.enqueue(op, fn.name, config, launcher, fn.record_address, spans)
    if st.capture_kernels is not None:
        st.note_captured_kernel(op, fn, config, param_block, args, spans)


def bind(st: Any, fn: Any, config: Any, args: list[Any] | tuple[Any, ...]) -> BoundLaunch:
    """``s.bind``: every check and the packing of a launch, once; a NumbaKernel specializes."""
    op = "session.bind"
    fn = checked_function(st, fn, config, args, op)
    return BoundLaunch(st, fn, config, args, op)


class BoundLaunch:
    """One kernel, one config, one argument list: checked and packed once by ``s.bind``.

    ``bound()`` enqueues it on the session's stream; ``bound.update(i, arg)`` re-checks and
    repacks argument ``i`` alone. Holds its spans (and so their owners) while it exists, and
    the session holds it until the stream has passed each launch. Refuses use from another
    thread, after the session closed, and after a kernel fault.
    """

    __slots__ = (
        "__weakref__",
        "_held_generation",
        "_launch",
        "_name",
        "_param_block",
        "_record",
        "_record_address",
        "args",
        "config",
        "fn",
        "spans",
        "state",
    )
    state: Any
    fn: Function
    config: LaunchConfig
    _param_block: ParamBlockBase
    args: list[Any]
    spans: list[Span]
    _record: Any
    _record_address: int
    _name: str
    _launch: Callable[[int], int]
    _held_generation: int

    @property
    def session(self) -> Any:
        """The `tenferro.Session` this bound launch belongs to."""
        return self.state.session

    def __init__(
        self, state: Any, fn: Any, config: LaunchConfig, args: list[Any] | tuple[Any, ...], op: str
    ) -> None:
        self.state = state
        self.fn = fn
        self.config = config
        self._param_block = fn.param_block.fresh()
        self.args = list(args)
        self.spans = self._param_block.pack(self.args, state, op)
        self._record = _driver.launch_record(
            fn.handle,
            config.dims,
            state.stream,
            self._param_block.address,
            config.launch_attributes,
        )
        self._record_address = self._record.address
        self._name = fn.name
        self._launch = _driver.launcher(config.extended)
        self._held_generation = -1  # the session's holds generation this launch is held in

    def __call__(self) -> None:
        """Enqueue the launch on the session's stream.

        Only enqueues; the bound launch (and its spans) is held until the stream has passed
        it. Inside ``s.capture()`` it is captured, inside ``s.timeline()`` timed.

        Raises:
            RuntimeStateError: The session is closed or used from another thread.
            BackendError: The driver refused the launch.
            KernelFault: A kernel fault (seen by this launch or earlier) has stopped the
                session.
        """
        st = self.state
        op = "bound_launch"
        try:
            if not st.fast_path_ok or _get_ident() != st.thread:
                st.check_use(op)
                # held at every call: during a capture the graph takes its owners from them
                st.enqueue(op, self._name, self.config, self._launch, self._record_address, self)
                if st.capture_kernels is not None:
                    st.note_captured_kernel(
                        op, self.fn, self.config, self._param_block, self.args, self.spans
                    )
                return
            st.enqueue_fast(op, self._name, self._launch, self._record_address)
            live = st.liveness
            if self._held_generation != live.generation:  # once per holds list, not per call
                self._held_generation = live.generation  # before: a fence in hold moves it on
                live.hold(self)
                self._launch = _driver.launcher(self.config.extended)  # @njit once built
        except KernelFault as exc:  # the launch or a fence query saw a fault
            raise st.record_fault(exc) from None

    def update(self, index: int, arg: Any) -> None:
        """Replace argument ``index``; only that slot is checked (and overlaps against the rest).

        A refused update changes nothing: the packed bytes, ``args`` and ``spans`` stay those of
        the launch as it was bound. The spans replaced stay held by the session until the
        stream has passed the launches that used them.

        Args:
            index: The argument's position, from 0 to ``len(args) - 1``.
            arg: The new argument, checked against that parameter as `Session.launch` checks
                it.

        Raises:
            ValidationError: ``index`` is out of range, or ``arg`` is refused for that
                parameter or overlaps another span where one of them is writable.
            RuntimeStateError: The session is closed or used from another thread.
            KernelFault: A kernel fault has stopped the session.
        """
        op = "bound_launch.update"
        st = self.state
        st.check_use(op)
        args, spans = self._param_block.replace(self.args, index, arg, st, op)
        st.liveness.hold(self.spans)  # a launch already enqueued may still read the old ones
        self.args, self.spans = args, spans

    def __repr__(self) -> str:
        return f"BoundLaunch({display_name(self.fn.name)}, {self.config})"
