"""tenferro kernels as torch operators (``torch.library.custom_op``), on torch's own stream.

    import tenferro.torch as tft

    @tft.op("mylib::axpy_sin", mutates_args=("y",))
    def axpy_sin(s: tf.Session, y: torch.Tensor, x: torch.Tensor, a: float) -> None:
        s.launch(kernel_of(s), tf.LaunchConfig.flat(y.numel()),
                 [s.tensor_mut(y), s.tensor(x), tf.f32(a), tf.u32(y.numel())])

``axpy_sin(y, x, 2.0)`` is then a torch operator: torch.compile traces it without a graph
break, ``axpy_sin.register_autograd`` gives it a backward, and it runs inside captured CUDA
graphs. The first parameter is filled in on each call: the session of the calling thread on
the tensors' device, working on torch's current stream there, so the launch is ordered with
torch's work and needs no event. Sessions are made per thread, device and stream when first
needed (torch runs backward passes on threads of its own) and kept; `close_sessions` closes
this thread's, and the interpreter's exit the main thread's. Every check of a launch stays.

While torch captures the stream (``torch.cuda.graph``, ``torch.compile(mode=
"reduce-overhead")``) the session records no events, allocates nothing and waits for nothing,
and keeps the owners of the captured launches for as long as it lives; Tensors of the session
dropped in the op meanwhile are freed at its first call after the capture, or when it closes.

torch is optional: ``import tenferro`` never imports it, and this module says so when it is
missing.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

try:
    import torch
except ImportError as _exc:  # pragma: no cover - the message is what a user without torch sees
    raise ImportError(
        "tenferro.torch needs PyTorch (pip install torch); the rest of tenferro works without it"
    ) from _exc

from . import _driver, scope
from .errors import ValidationError
from .graph import captured_elsewhere
from .interop.producers import torch_current_stream
from .session import Session, state_of

__all__ = ["close_sessions", "op", "session_for"]

_current_stream = torch_current_stream(torch)


def session_for(device: int | None = None) -> Session:
    """This thread's session on ``device`` (torch's current one if None) and torch's stream.

    Made at the first call for that device and stream on this thread, then kept open (until
    `close_sessions` or the interpreter's exit).

    Args:
        device: The CUDA device ordinal, or None for torch's current device.

    Returns:
        The open `Session` working on torch's current stream of ``device``.

    Raises:
        RuntimeStateError: No CUDA driver or GPU, or no device ``device``.
    """
    if device is None:
        device = torch.cuda.current_device()
    stream = _current_stream(device)
    key = (__name__, threading.get_ident(), device, stream)
    s = scope.kept(key)
    if s is None:
        s = Session(device, stream=stream)
        s.__enter__()
        scope.keep_open(s, key, innermost=False)  # tf.from_dlpack keeps the user's session
    return s


def close_sessions() -> None:
    """Close the sessions this thread's operator calls made (each synchronizes first)."""
    scope.close_kept(lambda key: isinstance(key, tuple) and key[0] == __name__)


def _device_of(args: tuple, kwargs: dict) -> int | None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor) and a.is_cuda:
            return a.get_device()
    return None


def _plain(a: Any) -> Any:
    # An input of an op with a backward still says requires_grad inside the op; its memory is
    # what the kernel reads, so the span is made of it without the autograd wrapper.
    return a.detach() if isinstance(a, torch.Tensor) and a.requires_grad else a


def _call(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    s = session_for(_device_of(args, kwargs))
    args = tuple(map(_plain, args))
    kwargs = {k: _plain(v) for k, v in kwargs.items()}
    st = state_of(s)
    if _driver.stream_is_capturing(st.stream, "tenferro.torch.op"):
        with captured_elsewhere(st):
            return fn(s, *args, **kwargs)
    if st.liveness.deferred_frees:  # Tensors dropped while torch captured: the stream records
        st.liveness.free_deferred()
    return fn(s, *args, **kwargs)


def op(
    name: str,
    *,
    mutates_args: str | Sequence[str],
    device_types: str | Sequence[str] = "cuda",
    schema: str | None = None,
) -> Callable[[Callable[..., Any]], Any]:
    """Make a function that launches tenferro kernels a torch operator (a decorator).

    ``name`` is ``"namespace::name"``; ``mutates_args`` the parameters the kernels write (or
    ``"unknown"``), as ``torch.library.custom_op`` takes them. The function's first parameter
    is the session (filled in per call); the rest, with their type annotations, are the
    operator's. An operator that returns None gets a fake implementation that does nothing,
    so torch.compile traces it; one that returns tensors needs ``.register_fake``.

    Args:
        name: The operator's name, ``"namespace::name"``.
        mutates_args: The parameters the kernels write, or ``"unknown"``.
        device_types: The device types the operator runs on, as ``custom_op`` takes them.
        schema: The operator's schema, or None to infer it from the annotations.

    Returns:
        A decorator; applied to the function, it returns the operator
            (``torch.library.custom_op``'s), called without the session.

    Raises:
        ValidationError: ``name`` is not ``"namespace::name"``; when decorating, the object
            is not callable or does not take the session as its first positional
            parameter. torch's own errors from ``custom_op`` propagate.
    """
    opname = "tenferro.torch.op"
    if not isinstance(name, str) or "::" not in name:
        raise ValidationError(f"{opname}: {name=} must be 'namespace::name'")

    def register(fn: Callable[..., Any]) -> Any:
        if not callable(fn):
            raise ValidationError(f"{opname}: expected a function, got {type(fn).__name__}")
        sig = inspect.signature(fn, eval_str=True)
        params = list(sig.parameters.values())
        if not params or params[0].kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            raise ValidationError(
                f"{opname}: {fn.__name__} must take the session as its first parameter"
            )

        def impl(*args: Any, **kwargs: Any) -> Any:
            return _call(fn, args, kwargs)

        impl.__name__, impl.__qualname__ = fn.__name__, fn.__qualname__
        impl.__module__, impl.__doc__ = fn.__module__, fn.__doc__
        impl.__signature__ = sig.replace(parameters=params[1:])  # type: ignore[attr-defined]
        custom = torch.library.custom_op(
            name, impl, mutates_args=mutates_args, device_types=device_types, schema=schema
        )
        if sig.return_annotation in (None, type(None)):
            custom.register_fake(_returns_nothing)
        return custom

    return register


def _returns_nothing(*args: Any, **kwargs: Any) -> None:
    """The fake implementation of an operator that only writes its arguments."""
