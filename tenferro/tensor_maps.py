"""TMA tensor maps: a ``CUtensorMap`` descriptor over a checked span, passed to a kernel by value.

``tf.tensor_map(span, box)`` checks what the Tensor Memory Accelerator asks of the memory and
the tile (sm_90 and later: 16-byte aligned start, a contiguous innermost dimension, the other
strides whole multiples of 16 bytes, a box of 1 to 256 elements a dimension whose innermost
row is a multiple of 16 bytes) and encodes the descriptor. A launch passes it where the kernel
takes a ``const __grid_constant__ CUtensorMap`` (NVRTC cannot include ``cuda.h``: declare
``struct alignas(64) CUtensorMap_st { unsigned long long opaque[16]; };`` and
``typedef CUtensorMap_st CUtensorMap;``), and holds and overlap-checks the span as its own.
Shapes and boxes are given in the span's order, outermost first, as numpy writes them.
"""

from __future__ import annotations

from typing import Any

from . import _driver
from .errors import ValidationError
from .spans import TensorMut, TensorRef, c_strides

__all__ = ["TENSOR_MAP_C_TYPES", "TensorMap", "tensor_map"]

# The names a compiler gives the kernel parameter a tensor map goes to.
TENSOR_MAP_C_TYPES = frozenset({"CUtensorMap", "CUtensorMap_st"})
_DATA_TYPES = {
    "u8": "UINT8",
    "u16": "UINT16",
    "u32": "UINT32",
    "i32": "INT32",
    "u64": "UINT64",
    "i64": "INT64",
    "f16": "FLOAT16",
    "bf16": "BFLOAT16",
    "f32": "FLOAT32",
    "f64": "FLOAT64",
}
_SWIZZLES = {None: "NONE", 32: "32B", 64: "64B", 128: "128B"}
_L2_PROMOTIONS = {None: "NONE", 64: "L2_64B", 128: "L2_128B", 256: "L2_256B"}
_OOB_FILLS = {"zero": "NONE", "nan": "NAN_REQUEST_ZERO_FMA"}
_MAX_DIM, _MAX_STRIDE, _MAX_BOX = 1 << 32, 1 << 40, 256
# Maps already made, by what they were asked with (the span's context, address, layout and
# type, and the arguments): checking and encoding cost tens of microseconds, and a kernel
# called in a loop asks for the same maps every call.
_MADE: dict[tuple, tuple[tuple[int, ...], bytes]] = {}
_MAX_MADE = 1024


class TensorMap:
    """A TMA descriptor (``CUtensorMap``, 128 bytes) over a span, made by `tensor_map`.

    Pass it in a launch's argument list where the kernel takes a ``CUtensorMap`` by value; the
    launch holds ``span`` (and so its owner) as it holds a span given directly.
    """

    __slots__ = ("box", "data", "span", "swizzle")
    span: TensorRef | TensorMut
    box: tuple[int, ...]
    swizzle: int | None
    data: bytes

    def __init__(
        self, span: TensorRef | TensorMut, box: tuple[int, ...], swizzle: int | None, data: bytes
    ) -> None:
        self.span, self.box, self.swizzle, self.data = span, box, swizzle, data

    @property
    def state(self) -> Any:
        """The session state of its span."""
        return self.span.state

    def __repr__(self) -> str:
        return (
            f"TensorMap(shape={self.span.shape}, dtype={self.span.scalar_type.name}, "
            f"box={self.box}, swizzle={self.swizzle})"
        )


def _exact_ints(value: Any) -> bool:
    """Whether ``value`` is an int or a tuple of ints, bools and other numbers excluded."""
    return type(value) is int or (type(value) is tuple and all(type(v) is int for v in value))


def _ints(value: Any, rank: int, name: str, lo: int, hi: int, op: str) -> tuple[int, ...]:
    """``value`` as ``rank`` ints from ``lo`` to ``hi``, or a refusal naming ``name``."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if (
        not isinstance(value, (tuple, list))
        or len(value) != rank
        or not all(isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi for v in value)
    ):
        raise ValidationError(
            f"{op}: {name}={value!r} must be {rank} int(s) from {lo} to {hi}, one a dimension "
            "of the span (outermost first)"
        )
    return tuple(value)


def tensor_map(
    span: TensorRef | TensorMut,
    box: int | tuple[int, ...],
    *,
    swizzle: int | None = None,
    element_strides: int | tuple[int, ...] | None = None,
    oob_fill: str = "zero",
    l2_promotion: int | None = None,
) -> TensorMap:
    """A TMA descriptor over ``span`` that moves tiles of ``box`` elements (sm_90 and later).

    Args:
        span: A `TensorRef` or `TensorMut` of an open session (``s.tensor(x)``; strided spans
            need ``allow_strided=True``), of 1 to 5 dimensions, its innermost contiguous.
        box: The tile, one int a dimension of the span, outermost first, each 1 to 256; its
            innermost row must be a multiple of 16 bytes.
        swizzle: None, or the shared-memory swizzle span in bytes: 32, 64 or 128, at least the
            box's innermost row.
        element_strides: None (every element), or one int from 1 to 8 a dimension.
        oob_fill: What a tile reads past the span's edges: ``"zero"``, or ``"nan"`` (floats).
        l2_promotion: None, or 64, 128 or 256 bytes of L2 promotion.

    Returns:
        The `TensorMap`, which holds ``span``.

    Raises:
        ValidationError: ``span`` is not a span, or the device is older than sm_90, or a
            requirement above is not met (each refusal names the argument and the value).
        RuntimeStateError: The span's session is closed or used from another thread.
        BackendError: The driver refused to encode the descriptor.
    """
    op = "tensor_map"
    if type(span) not in (TensorRef, TensorMut):
        raise ValidationError(
            f"{op}: span must be a TensorRef or TensorMut (s.tensor(x)), got {type(span).__name__}"
        )
    st = span.state
    st.check_use(op)
    key: tuple | None = (
        st.context,
        span.ptr,
        span.shape,
        span.strides,
        span.scalar_type,
        box,
        swizzle,
        element_strides,
        oob_fill,
        l2_promotion,
    )
    # Only ints are looked up (True or 64.0 would find the map made for 1 or 64, and they are
    # refused); anything else is checked and encoded the long way.
    if not (_exact_ints(box) and (element_strides is None or _exact_ints(element_strides))):
        key = None
    made = None if key is None else _MADE.get(key)
    if made is not None:
        return TensorMap(span, made[0], swizzle, made[1])
    major, minor = st.context.compute_capability
    if major < 9:
        raise ValidationError(
            f"{op}: tensor maps need the Tensor Memory Accelerator (sm_90 or later); this "
            f"device is sm_{major}{minor}"
        )
    shape, t = span.shape, span.scalar_type
    # A dimension of one element is never stepped along: its stride is the compact one,
    # whatever the producer said (torch's (1, K) view of a column may say 2 bytes there).
    compact = c_strides(shape, t.itemsize)
    strides = tuple(
        c if d == 1 else s for d, s, c in zip(shape, span.strides, compact, strict=True)
    )
    rank = len(shape)
    if not 1 <= rank <= 5:
        raise ValidationError(f"{op}: the span has {rank} dimension(s); a tensor map takes 1 to 5")
    data_type = _DATA_TYPES.get(t.name)
    if data_type is None:
        raise ValidationError(
            f"{op}: the span is {t.name}; a tensor map takes {', '.join(_DATA_TYPES)}"
        )
    if span.ptr % 16:
        raise ValidationError(
            f"{op}: the span starts at 0x{span.ptr:x}, not on 16 bytes as a tensor map must"
        )
    if any(not 1 <= d <= _MAX_DIM for d in shape):
        raise ValidationError(f"{op}: shape={shape}: every dimension must be 1 to 2**32")
    if strides[-1] != t.itemsize and shape[-1] != 1:
        raise ValidationError(
            f"{op}: strides={strides} (bytes): the innermost dimension must be contiguous "
            f"({t.itemsize} bytes a step)"
        )
    outer = strides[:-1]
    if any(s <= 0 or s % 16 or s >= _MAX_STRIDE for s in outer):
        raise ValidationError(
            f"{op}: strides={strides} (bytes): every stride but the innermost must be a "
            "positive multiple of 16 bytes below 2**40"
        )
    tile = _ints(box, rank, "box", 1, _MAX_BOX, op)
    row = tile[-1] * t.itemsize
    if row % 16:
        raise ValidationError(
            f"{op}: box={tile}: its innermost row is {row} bytes; a tensor map moves rows of "
            "a multiple of 16 bytes"
        )
    if swizzle not in _SWIZZLES:
        raise ValidationError(f"{op}: {swizzle=} must be None, 32, 64 or 128 (bytes)")
    if swizzle is not None and row > swizzle:
        raise ValidationError(
            f"{op}: box={tile}: its innermost row is {row} bytes, past swizzle={swizzle}"
        )
    steps = (
        (1,) * rank
        if element_strides is None
        else _ints(element_strides, rank, "element_strides", 1, 8, op)
    )
    if oob_fill not in _OOB_FILLS:
        raise ValidationError(f"{op}: {oob_fill=} must be 'zero' or 'nan'")
    if oob_fill == "nan" and not t.is_float:
        raise ValidationError(f"{op}: oob_fill='nan' needs a float span; the span is {t.name}")
    if l2_promotion not in _L2_PROMOTIONS:
        raise ValidationError(f"{op}: {l2_promotion=} must be None, 64, 128 or 256 (bytes)")
    # The driver counts dimensions innermost first, and gives no stride for the innermost.
    data = _driver.tensor_map_encode(
        data_type,
        span.ptr,
        shape[::-1],
        outer[::-1],
        tile[::-1],
        steps[::-1],
        _SWIZZLES[swizzle],
        _L2_PROMOTIONS[l2_promotion],
        _OOB_FILLS[oob_fill],
        op,
    )
    if key is not None:
        if len(_MADE) >= _MAX_MADE:
            _MADE.clear()
        _MADE[key] = (tile, data)
    return TensorMap(span, tile, swizzle, data)
