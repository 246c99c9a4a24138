"""Span import: a Tensor, a span or a foreign device array as a checked span of a session.

`import_span` is what ``s.tensor``, ``s.tensor_mut``, ``s.from_dlpack`` and the memory
operations call. A foreign producer is read by `read_foreign` (DLPack first, CAI otherwise),
checked for device memory of the session's device, ordered before the session's stream with an
event (none where the driver orders the two streams already), then held to the rules every
span follows: dtype, compact strides unless allowed, whole elements, the address space, no zero
stride for writing, alignment.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from . import dtypes
from .errors import KernelFault, ValidationError, wrong_device
from .interop.foreign import check_memory, read_foreign
from .interop.producers import (
    compact_span,
    direct_reader,
    fast_span,
    fast_spans,
    kept,
    kept_compact,
    readers,
)
from .interop.streams import LEGACY, order_after
from .spans import ADDRESS_END as _ADDRESS_END
from .spans import DeviceBytes, Span, TensorMut, TensorRef
from .tensor import Tensor

__all__ = ["forget_fast_paths", "from_dlpack", "import_span", "tensor", "tensor_mut"]

_get_ident = threading.get_ident
_UNSEEN: Any = object()  # a class no reader was decided for yet


def import_span(
    st: Any,
    x: Any,
    cls: type,
    dtype: Any,
    allow_strided: bool,
    op: str,
    dlpack: bool = False,
    defer: bool = False,
) -> Any:
    """A checked span of the session ``st`` over ``x``: a Tensor, a span, or a foreign array.

    Every refusal the design makes for spans is made here, naming ``op``. A foreign producer's
    stream is ordered before the session's with an event: at once, or with ``defer`` (spans
    made for launches) before the session's next kernel (`StreamOrdering`). ``dlpack`` takes a
    producer through DLPack even where it also has a CUDA Array Interface.
    """
    if not st.fast_path_ok or _get_ident() != st.thread:
        st.check_use(op)  # closed, another thread or faulted: refused (a capture is let by)
    kind = x.__class__
    if kind is Tensor and x.state is st and dtype is None and cls is not DeviceBytes:
        # The session's own Tensor: compact, aligned by its allocation, writable, in range.
        return x.span(cls)
    reader = None if dlpack else readers.get(kind, _UNSEEN)
    if reader is _UNSEEN:
        reader = direct_reader(kind)
    direct = None if reader is None else reader(x, st.device, op)
    if direct is not None:  # torch: its own attributes, no DLPack capsule
        ptr, shape, strides, t, stream, nbytes = direct
        if stream not in st.ordering.in_order_with:
            _producer_stream(st, stream, defer, op)
        if (
            nbytes >= 0
            and dtype is None
            and cls is not DeviceBytes
            and not ptr % t.alignment
            and ptr + nbytes <= _ADDRESS_END
        ):
            return kept_compact(st, cls, ptr, shape, strides, t, nbytes, x)
        owner, readonly, marked = x, False, False
    elif isinstance(x, Tensor):
        if x.state is not st:
            _adopt_tensor(st, x, op)
        ptr, shape, strides, t, owner = x.ptr, x.shape, x.strides, x.scalar_type, x
        readonly = marked = False
    elif isinstance(x, Span):
        if x.state is not st:
            raise ValidationError(f"{op}: x is a {type(x).__name__} of another session")
        ptr, shape, strides, t, owner = x.ptr, x.shape, x.strides, x.scalar_type, x.owner
        readonly = not x.writable
        marked = x.producer_readonly
        if type(x) is DeviceBytes and cls is TensorMut:
            cls = DeviceBytes  # a workspace stays untyped where a writable span is asked
        if st.ordering.pending and not defer:  # a memory operation is about to use it
            _flush(st, op)
    else:
        f = read_foreign(x, st.stream, st.device, st.liveness.capturing, op, dlpack_only=dlpack)
        check_memory(f, st.device, op)
        ptr, shape, strides, t, owner, readonly = (
            f.ptr,
            f.shape,
            f.strides,
            f.scalar_type,
            f.owner,
            f.readonly,
        )
        marked = readonly
        if f.stream is not None and f.stream not in st.ordering.in_order_with:
            _producer_stream(st, f.stream, defer, op)
    if readonly and cls is not TensorRef:
        raise ValidationError(
            f"{op}: x is read-only (its producer says so); use s.tensor(x) to read it"
        )
    if dtype is not None:
        want = dtypes.as_scalar_type(dtype, op)
        if want is not t:
            raise ValidationError(f"{op}: dtype={want.name} was asked but x is {t.name}")
    span = cls(ptr, shape, strides, t, st.device, owner, st, marked)
    if not span.is_c_contiguous:
        if not allow_strided:
            raise ValidationError(
                f"{op}: x has non-compact strides={strides} (bytes) for shape={shape}; "
                "pass allow_strided=True for a kernel that takes strides, or copy it"
            )
        if any(d > 1 and st % t.itemsize for d, st in zip(shape, strides, strict=True)):
            raise ValidationError(
                f"{op}: x has strides={strides} (bytes) that are not multiples of its "
                f"{t.itemsize}-byte {t.name} elements; a kernel would read misplaced data"
            )
        if span.lo < 0 or span.hi > _ADDRESS_END:
            raise ValidationError(
                f"{op}: x's strides={strides} (bytes) for shape={shape} from 0x{ptr:x} "
                "reach outside the address space; the producer described it wrongly"
            )
        if cls is not TensorRef and any(
            d > 1 and st == 0 for d, st in zip(shape, strides, strict=True)
        ):
            raise ValidationError(
                f"{op}: x has a zero stride (a broadcast view); writes "
                f"through it would race (strides={strides})"
            )
    elif span.hi > _ADDRESS_END:
        raise ValidationError(
            f"{op}: x's {span.nbytes} bytes from 0x{ptr:x} reach outside "
            "the address space; the producer described it wrongly"
        )
    if span.nbytes and ptr % t.alignment:
        raise ValidationError(
            f"{op}: x's data pointer 0x{ptr:x} is not aligned to the "
            f"{t.alignment} bytes its {t.name} elements need"
        )
    return span


def _order_after(st: Any, stream: int, op: str) -> None:
    """Order the session's stream after ``stream``'s work so far, without blocking the host."""
    try:
        order_after(st.stream, stream, st.import_event, op)
    except KernelFault as exc:
        raise st.record_fault(exc) from None


def _producer_stream(st: Any, stream: int, defer: bool, op: str) -> None:
    """Order the session's stream after a producer's: now, or before its next kernel."""
    st.refuse_in_capture(
        op, "ordering after the producer's stream needs an event; make the span before the capture"
    )
    if defer:
        st.ordering.defer(stream)
    else:
        _order_after(st, stream, op)


def _flush(st: Any, op: str) -> None:
    """Order the session's stream after the producers of spans made for launches."""
    try:
        st.ordering.flush(op)
    except KernelFault as exc:
        raise st.record_fault(exc) from None


def _adopt_tensor(st: Any, x: Tensor, op: str) -> None:
    """Take a Tensor of another session on the same device, ordered after that session."""
    if x.device != st.device:
        raise wrong_device(op, x.device, st.device)
    other = x.state
    if other.is_open and other.stream not in st.ordering.in_order_with:
        # The other session may still be writing it: order after its stream.
        st.refuse_in_capture(op, "a Tensor of another open session needs an event")
        _order_after(st, other.stream, op)


def _span_import(cls: type, op: str) -> Any:
    """``s.tensor`` (``cls`` TensorRef) or ``s.tensor_mut`` (TensorMut): a span for a launch.

    What a launch's argument list calls, once a tensor each, so on the session's fast path the
    session's own Tensor and a compact torch tensor take this one call: a torch tensor's fields
    are read once each, and the span kept for it (`producers.kept`) is given again when they
    are the ones it was made from. Anything else, and a tensor the one call would refuse or
    hand on (grad, host, another device, neg bit, strided, misaligned), goes to `import_span`,
    which reads it again and says why. The producer's stream is ordered before the session's
    next kernel.
    """
    kept_get = kept[cls].get
    # The array class whose one-call path was decided last, and its bindings (`fast_span`).
    fast_kind: type | None = None
    by_dtype: Any = None
    current_stream: Any = None

    def span(st: Any, x: Any, dtype: Any = None, *, allow_strided: bool = False) -> Any:
        nonlocal fast_kind, by_dtype, current_stream
        if dtype is None and st.fast_path_ok and _get_ident() == st.thread:
            kind = x.__class__
            if kind is Tensor:
                if x.state is st:
                    return x.span(cls)
            else:
                if kind is not fast_kind:  # another class than the last: decided once each
                    fast = fast_spans.get(kind, _UNSEEN)
                    if fast is _UNSEEN:
                        fast = fast_span(kind)
                    if fast is not None:
                        fast_kind, (by_dtype, current_stream) = kind, fast
                if kind is fast_kind:
                    try:
                        t = by_dtype.get(x.dtype)
                        ok = (
                            t is not None
                            and not x.requires_grad
                            and x.is_cuda
                            and not x.is_neg()
                            and x.is_contiguous()
                        )
                        if ok:
                            dev = x.get_device()
                            ptr = x.data_ptr()
                            shape = x.shape
                    except Exception:
                        ok = False
                    if ok and dev == st.device:
                        ref = kept_get(id(x))
                        got = None if ref is None else ref()
                        # A kept span holds its tensor, so the id is still x's; what may have
                        # changed in place (set_, resize_, .data) is compared.
                        if (
                            got is None
                            or got.ptr != ptr
                            or got.shape != shape
                            or got.state is not st
                            or got.scalar_type is not t
                        ):
                            got = compact_span(st, cls, x, ptr, shape, t)
                        if got is not None:
                            stream = current_stream(dev) or LEGACY
                            if stream not in st.ordering.in_order_with:
                                st.ordering.defer(stream)
                            return got
        return import_span(st, x, cls, dtype, allow_strided, op, defer=True)

    def forget() -> None:
        nonlocal fast_kind
        fast_kind = None

    _forgets.append(forget)
    return span


_forgets: list[Callable[[], None]] = []


def forget_fast_paths() -> None:
    """Decide the one-call path's array class again at the next span.

    For after `producers.fast_spans` was cleared (a test standing another module in for torch).
    """
    for forget in _forgets:
        forget()


tensor: Callable[..., TensorRef] = _span_import(TensorRef, "session.tensor")
tensor.__name__ = tensor.__qualname__ = "tensor"
tensor.__doc__ = "A read-only span over a Tensor or a CUDA Array Interface / DLPack device array."
tensor_mut: Callable[..., TensorMut] = _span_import(TensorMut, "session.tensor_mut")
tensor_mut.__name__ = tensor_mut.__qualname__ = "tensor_mut"
tensor_mut.__doc__ = (
    "An exclusive, writable span; refuses producers that marked their array read-only."
)


def from_dlpack(
    st: Any, x: Any, *, writable: bool = False, dtype: Any = None, allow_strided: bool = False
) -> TensorRef | TensorMut:
    """A span over ``x`` taken through DLPack even where x also has a CUDA Array Interface.

    ``x`` is an object with ``__dlpack__`` (asked with this session's stream, so the
    producer orders itself before it) or an unused DLPack capsule (consumed as it is: its
    producer must have finished writing it). ``writable=True`` gives a TensorMut and
    refuses a capsule flagged READ_ONLY.
    """
    cls = TensorMut if writable else TensorRef
    return import_span(st, x, cls, dtype, allow_strided, "session.from_dlpack", dlpack=True)
