"""Producers read through their own attributes (torch tensors, CuPy arrays), not a protocol.

A DLPack capsule costs tens of microseconds a tensor; a torch tensor's own fields cost about
one, and a CuPy array's CUDA Array Interface builds a dictionary each time. `direct_reader`
names the reader for an array's exact class, or None where the general path (DLPack, then the
CUDA Array Interface) serves. A reader returns what the import needs, or None to hand the
array to the general path, which then says what is wrong with it (host memory,
``requires_grad``, a sparse layout) in the words it always has; what only the reader can see
(torch's neg bit) it refuses itself. torch and CuPy are never imported here: a class is
recognised only once the user has imported its library.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

from .. import dtypes
from ..errors import ValidationError, negated_view, wrong_device
from ..spans import ADDRESS_END, Span, TensorMut, TensorRef, compact_layout, layouts
from .streams import LEGACY

__all__ = [
    "compact_span",
    "direct_reader",
    "fast_span",
    "fast_spans",
    "kept",
    "kept_compact",
    "readers",
    "torch_current_stream",
]

# (ptr, shape, byte strides, scalar type, producer stream, nbytes when C-contiguous or -1).
Direct = tuple[int, tuple[int, ...], tuple[int, ...], dtypes.ScalarType, int, int]
Reader = Callable[[Any, int, str], "Direct | None"]

readers: dict[type, Reader | None] = {}

# Per array class: (torch dtype -> scalar type, device -> torch's current stream) for the
# one-call span of `tenferro.span_import`, or None where `import_span` serves.
TorchFast = tuple[dict[Any, dtypes.ScalarType], Callable[[int], int]]
fast_spans: dict[type, TorchFast | None] = {}


def direct_reader(cls: type) -> Reader | None:
    """The direct reader for arrays of exactly ``cls``, or None (decided once per class).

    `readers` holds every decision made; a caller may look there first.
    """
    if cls in readers:
        return readers[cls]
    reader = None
    torch = sys.modules.get("torch")
    cupy = sys.modules.get("cupy")
    if torch is not None and cls in (torch.Tensor, torch.nn.Parameter):
        reader = _torch_reader(torch)  # a subclass (FakeTensor, DTensor) takes the general path
    elif cupy is not None and cls is cupy.ndarray:
        reader = _cupy_reader(cupy)
    readers[cls] = reader
    return reader


def fast_span(cls: type) -> TorchFast | None:
    """What ``s.tensor(x)`` of an array of exactly ``cls`` needs for its one-call path, or None.

    torch tensors only: torch's dtype table and current-stream query (`TorchFast`), bound
    once. Decided once per class; `fast_spans` holds every decision made.
    """
    if cls in fast_spans:
        return fast_spans[cls]
    fast = None
    torch = sys.modules.get("torch")
    if torch is not None and cls in (torch.Tensor, torch.nn.Parameter):
        fast = (_torch_dtypes(torch), torch_current_stream(torch))
    fast_spans[cls] = fast
    return fast


def torch_current_stream(torch: Any) -> Callable[[int], int]:
    """``f(device) -> handle`` of torch's current stream there (0: torch's default stream)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # 0.2 us, private
    if raw is not None:
        return raw

    def current_stream(dev: int) -> int:  # the public query: 8 us
        return torch.cuda.current_stream(dev).cuda_stream

    return current_stream


def _torch_dtypes(torch: Any) -> dict[Any, dtypes.ScalarType]:
    """The table of torch dtypes to ours (none for complex: a conjugate bit no span carries)."""
    return {
        getattr(torch, name): dtypes.by_name(ours)
        for name, ours in (
            ("bool", "bool"),
            ("int8", "i8"),
            ("int16", "i16"),
            ("int32", "i32"),
            ("int64", "i64"),
            ("uint8", "u8"),
            ("uint16", "u16"),
            ("uint32", "u32"),
            ("uint64", "u64"),
            ("float16", "f16"),
            ("bfloat16", "bf16"),
            ("float32", "f32"),
            ("float64", "f64"),
        )
        if hasattr(torch, name)
    }


def _torch_reader(torch: Any) -> Reader:
    """The reader of torch tensors, its dtype table and stream query bound once."""
    by_dtype = _torch_dtypes(torch)
    current_stream = torch_current_stream(torch)

    def read_torch(x: Any, device: int, op: str) -> Direct | None:
        # Complex types (a conjugate bit), grad, host and other device types: the general path
        # decides. A tensor without strided storage (sparse, nested) raises on the way.
        try:
            t = by_dtype.get(x.dtype)
            if t is None or x.requires_grad or not x.is_cuda:
                return None
            if x.is_neg():
                raise negated_view(op)
            dev = x.get_device()
            size = t.itemsize
            if x.is_contiguous():  # torch.Size hashes and compares as the tuple it is
                layout = layouts.get((x.shape, size)) or compact_layout(x.shape, size)
                shape, strides, nbytes = layout
            else:
                shape = tuple(x.shape)
                strides, nbytes = tuple([st * size for st in x.stride()]), -1
            ptr = x.data_ptr()
        except ValidationError:
            raise
        except Exception:
            return None
        if dev != device:
            raise wrong_device(op, dev, device)
        return ptr, shape, strides, t, current_stream(dev) or LEGACY, nbytes

    return read_torch


def _cupy_reader(cupy: Any) -> Reader:
    """The reader of CuPy arrays: its stream query bound once."""
    by_dtype = dtypes.BY_NUMPY
    current_stream = cupy.cuda.get_current_stream

    def read_cupy(x: Any, device: int, op: str) -> Direct | None:
        try:
            t = by_dtype.get(x.dtype)
            if t is None:
                return None
            dev = x.device.id
            ptr, shape, strides = x.data.ptr, x.shape, x.strides
            nbytes = x.nbytes if x.flags.c_contiguous else -1
            stream = current_stream().ptr
        except Exception:
            return None
        if dev != device:
            raise wrong_device(op, dev, device)
        return ptr, shape, strides, t, stream or LEGACY, nbytes

    return read_cupy


# The compact span last made of a directly read array, per span class and array id, kept
# weakly: the same torch tensor given again with the same fields gets the same span object,
# so a launch given the very objects of its previous call packs nothing again. Each table is
# made once (the span imports of `tenferro.span_import` bind it) and cleared in place.
kept: dict[type, dict[int, weakref.ref[Span]]] = {TensorRef: {}, TensorMut: {}}
KEPT_MAX = 1024  # entries a table


def kept_compact(
    st: Any,
    cls: type[Span],
    ptr: int,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    t: dtypes.ScalarType,
    nbytes: int,
    x: Any,
) -> Any:
    """The span of ``x`` last made for ``st`` if its fields are the ones just read, or a new one.

    While the span lives it holds ``x``, so no other array can have its ``id``.
    """
    table = kept[cls]
    ref = table.get(id(x))
    if ref is not None:
        span = ref()
        if (
            span is not None
            and span.state is st
            and span.ptr == ptr
            and span.shape == shape
            and span.strides == strides
            and span.scalar_type is t
        ):
            return span
    return keep(table, id(x), cls.compact(ptr, shape, strides, t, nbytes, st.device, x, st))


def compact_span(
    st: Any, cls: type[Span], x: Any, ptr: int, shape: tuple[int, ...], t: dtypes.ScalarType
) -> Any:
    """A new span of ``cls`` over the compact array ``x``, kept for it.

    None where it is misaligned or reaches outside the address space: `import_span` says which.
    """
    layout = layouts.get((shape, t.itemsize)) or compact_layout(shape, t.itemsize)
    if ptr % t.alignment or ptr + layout[2] > ADDRESS_END:
        return None
    return keep(
        kept[cls], id(x), cls.compact(ptr, layout[0], layout[1], t, layout[2], st.device, x, st)
    )


def keep(table: dict[int, weakref.ref[Span]], key: int, span: Any) -> Any:
    """Keep ``span`` in ``table`` (one of `kept`) as the span of the array whose id is ``key``."""
    if len(table) >= KEPT_MAX:  # entries of dead spans: dropped together, now and then
        table.clear()
    table[key] = weakref.ref(span)
    return span
