"""`KernelArg`, the typed scalars (``tf.u32``, ``tf.f32``, ...), and packing into one param block.

`ParamBlock` holds one kernel's arguments in one buffer, with the pointer array cuLaunchKernel
takes, made once; `ParamBlock.pack` runs the ABI check of every argument against the kernel's
`Signature` and writes the values in place.
"""

from __future__ import annotations

import ctypes
import operator
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from . import dtypes
from .conditions import GraphCondition
from .dtypes import ScalarType
from .errors import ValidationError
from .signature import (
    BYTES,
    FLOAT,
    INT,
    OPAQUE,
    PTR,
    PTR_OR_INT,
    Param,
    Signature,
    display_name,
    element_types,
    value_types,
)
from .spans import DeviceBytes, Span, TensorMut, TensorRef, overlaps
from .tensor_maps import TENSOR_MAP_C_TYPES, TensorMap

# What a function built from source at run time says of itself: where its source is written.
_GENERATED = "Generated for one signature by tenferro.{} (its source is built there)."

__all__ = [
    "KernelArg",
    "ParamBlockBase",
    "ParamBlock",
    "CTYPES_SIMPLE",
    "check_overlaps",
    "from_ctypes",
    "span_of",
    "struct_of",
    "u8",
    "u16",
    "u32",
    "u64",
    "i8",
    "i16",
    "i32",
    "i64",
    "f16",
    "bf16",
    "f32",
    "f64",
]

_SCALAR, _POINTER, _BYTES = 0, 1, 2
_U64 = struct.Struct("<Q")
_SPAN_TYPES = (TensorRef, TensorMut, DeviceBytes)
_is = operator.is_


class KernelArg:
    """One launch argument: a typed scalar, a device pointer from a span, or raw struct bytes.

    Made by the factories `KernelArg.scalar`, `KernelArg.pointer`, `KernelArg.struct` or the typed
    scalars (``tf.u32(n)``); the value is checked and packed once, when it is made.
    """

    __slots__ = ("align", "data", "kind", "scalar_type", "span")
    kind: int
    scalar_type: ScalarType | None
    data: bytes
    span: Span | None
    align: int | None

    def __init__(
        self,
        kind: int,
        scalar_type: ScalarType | None,
        data: bytes,
        span: Span | None = None,
        align: int | None = None,
    ) -> None:
        self.kind = kind
        self.scalar_type = scalar_type
        self.data = data
        self.span = span
        self.align = align

    @classmethod
    def scalar(cls, value: Any, dtype: Any) -> KernelArg:
        """A scalar of ``dtype`` (a numpy dtype or a name like ``"u32"``); range-checked.

        Args:
            value: A Python or numpy number; an integer type takes integers only.
            dtype: A numpy dtype (or what ``np.dtype`` accepts), or a tenferro type name
                (``"u32"``, ``"bf16"``).

        Returns:
            The typed scalar, packed now.

        Raises:
            ValidationError: ``dtype`` is unknown or not a device type, or ``value`` does not
                fit it (out of range, a fraction for an integer type, a finite float that
                would round to infinity).
        """
        t = (
            dtypes.by_name(dtype)
            if isinstance(dtype, str)
            else dtypes.from_numpy(dtype, "KernelArg.scalar")
        )
        return cls(_SCALAR, t, dtypes.pack_scalar(t, value, f"KernelArg.scalar({t.name})"))

    @classmethod
    def pointer(cls, span: Span) -> KernelArg:
        """A device pointer to a span's memory (what passing the span itself does).

        Args:
            span: A `TensorRef`, `TensorMut` or `DeviceBytes`; its session, writability and
                element type are checked at launch as the span's own would be.

        Returns:
            The pointer argument, which holds ``span``.

        Raises:
            ValidationError: ``span`` is not a span.
        """
        if not isinstance(span, Span):
            raise ValidationError(
                f"KernelArg.pointer: span must be a TensorRef, TensorMut or "
                f"DeviceBytes, got {type(span).__name__}"
            )
        return cls(_POINTER, None, b"", span)

    @classmethod
    def struct(
        cls,
        data: bytes | bytearray | memoryview | np.ndarray | ctypes.Structure,
        align: int | None = None,
    ) -> KernelArg:
        """A by-value struct: its raw bytes, checked against the parameter's size at launch.

        ``align``, when given, is the struct's alignment in bytes (a power of two up to 256);
        a launch then also checks it against the parameter's where the signature says it (PTX
        and CUDA C). None leaves the alignment to the parameter.

        Args:
            data: The struct's bytes: bytes, bytearray, memoryview, a numpy array (its raw
                bytes, as ``tobytes()`` gives them) or a ``ctypes.Structure``.
            align: The struct's alignment in bytes, or None.

        Returns:
            The by-value argument, a copy of the bytes.

        Raises:
            ValidationError: ``align`` is not None or a power of two from 1 to 256, or
                ``data`` is of another type or empty.
        """
        op = "KernelArg.struct"
        if align is not None and (
            not isinstance(align, int)
            or isinstance(align, bool)
            or not 1 <= align <= 256
            or align & (align - 1)
        ):
            raise ValidationError(f"{op}: {align=} must be None or a power of two from 1 to 256")
        if isinstance(data, np.ndarray):
            raw = data.tobytes()
        elif isinstance(data, ctypes.Structure):
            raw = bytes(memoryview(data).cast("B"))
        elif isinstance(data, (bytes, bytearray, memoryview)):
            raw = bytes(data)
        else:
            raise ValidationError(
                f"{op}: data must be bytes, a numpy array or a "
                f"ctypes.Structure, got {type(data).__name__}"
            )
        if not raw:
            raise ValidationError(f"{op}: data is empty; a by-value struct has at least one byte")
        return cls(_BYTES, None, raw, None, align)

    def describe(self) -> str:
        """A short description for error messages."""
        if self.kind == _SCALAR and self.scalar_type is not None:
            return f"{self.scalar_type.name} scalar"
        if self.kind == _BYTES:
            aligned = "" if self.align is None else f" aligned to {self.align}"
            return f"{len(self.data)}-byte struct{aligned}"
        return type(self.span).__name__

    def __repr__(self) -> str:
        return f"KernelArg({self.describe()})"


_KEPT_SCALARS = 256  # values a scalar factory keeps, each type (then it starts again)


def _scalar_factory(name: str) -> Callable[[Any], KernelArg]:
    t = dtypes.by_name(name)
    op = f"tf.{name}"
    pack = dtypes.pack_scalar
    new = KernelArg.__new__

    def typed(data: bytes) -> KernelArg:
        a = new(KernelArg)
        a.kind, a.scalar_type, a.data, a.span, a.align = _SCALAR, t, data, None, None
        return a

    # The common case, an int in range or a float, is packed at once; anything else takes
    # pack_scalar, which checks it and words the refusal. The scalars made last are kept by
    # value (a KernelArg never changes), so a loop that passes tf.u32(n) each call passes the
    # same object, and a launch of the same objects as the last one skips its checks. Zero
    # is not kept for floats: 0.0 and -0.0 are equal keys with different bits.
    made: dict[Any, KernelArg] = {}
    if t.kind in ("int", "uint"):
        bits = 8 * t.itemsize
        lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if t.kind == "int" else (0, 1 << bits)
        put = struct.Struct(t.fmt).pack

        def make(value: Any) -> KernelArg:
            if value.__class__ is int:
                a = made.get(value)
                if a is not None:
                    return a
                if lo <= value < hi:
                    if len(made) >= _KEPT_SCALARS:
                        made.clear()
                    a = made[value] = typed(put(value))
                    return a
            return typed(pack(t, value, op))
    elif t.name in ("f32", "f64"):
        put = struct.Struct(t.fmt).pack

        def make(value: Any) -> KernelArg:
            if value.__class__ is float:
                a = made.get(value)
                if a is not None:
                    return a
                try:
                    a = typed(put(value))
                except OverflowError:  # past f32's range: pack_scalar words it
                    return typed(pack(t, value, op))
                if value:
                    if len(made) >= _KEPT_SCALARS:
                        made.clear()
                    made[value] = a
                return a
            return typed(pack(t, value, op))
    else:

        def make(value: Any) -> KernelArg:
            return typed(pack(t, value, op))

    make.__name__ = make.__qualname__ = name
    make.__doc__ = f"A {name} kernel argument; refuses values {name} cannot hold."
    return make


# Each a function of one value: the typed scalar (a KernelArg), range-checked once.
u8: Callable[[Any], KernelArg]
u16: Callable[[Any], KernelArg]
u32: Callable[[Any], KernelArg]
u64: Callable[[Any], KernelArg]
i8: Callable[[Any], KernelArg]
i16: Callable[[Any], KernelArg]
i32: Callable[[Any], KernelArg]
i64: Callable[[Any], KernelArg]
f16: Callable[[Any], KernelArg]
bf16: Callable[[Any], KernelArg]
f32: Callable[[Any], KernelArg]
f64: Callable[[Any], KernelArg]
u8, u16, u32, u64 = (_scalar_factory(n) for n in ("u8", "u16", "u32", "u64"))
i8, i16, i32, i64 = (_scalar_factory(n) for n in ("i8", "i16", "i32", "i64"))
f16, bf16, f32, f64 = (_scalar_factory(n) for n in ("f16", "bf16", "f32", "f64"))


# ctypes simple types that hold an address or a character, not a number.
_CTYPES_ADDRESSES = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_wchar_p)
_CTYPES_CHARACTERS = (ctypes.c_char, ctypes.c_wchar)
# Every ctypes simple type (c_int is c_int32, c_long c_int64 here); subclasses are instances.
CTYPES_SIMPLE = (
    ctypes.c_bool,
    ctypes.c_byte,
    ctypes.c_ubyte,
    ctypes.c_short,
    ctypes.c_ushort,
    ctypes.c_int,
    ctypes.c_uint,
    ctypes.c_long,
    ctypes.c_ulong,
    ctypes.c_longlong,
    ctypes.c_ulonglong,
    ctypes.c_float,
    ctypes.c_double,
    ctypes.c_longdouble,
    *_CTYPES_ADDRESSES,
    *_CTYPES_CHARACTERS,
)


def from_ctypes(a: Any, where: str) -> np.generic:
    """A ctypes number (``c_int(5)``, ``c_float``, a subclass) as the numpy scalar of its C type.

    Args:
        a: A ctypes simple-type instance.
        where: What the refusal names (``"session.launch: args[2]"``).

    Returns:
        The numpy scalar of the same width, signedness and value.

    Raises:
        ValidationError: ``a`` holds an address or a character, or has a C type no kernel
            scalar has (``c_longdouble``).
    """
    name = type(a).__name__
    if isinstance(a, _CTYPES_ADDRESSES):
        raise ValidationError(
            f"{where} is a ctypes {name}, an address; pass memory as a span (s.tensor(x)), "
            "whose owner, device and size are checked"
        )
    if isinstance(a, _CTYPES_CHARACTERS):
        raise ValidationError(f"{where} is a ctypes {name}, a character; pass a number")
    try:
        numpy_type = dtypes.from_numpy(np.dtype(type(a)), where).numpy
    except (TypeError, ValidationError):
        numpy_type = None
    if numpy_type is None:
        raise ValidationError(f"{where} is a ctypes {name}, a C type no kernel scalar type has")
    return numpy_type.type(a.value)


_BY_VALUE_STRUCTS = (ctypes.Structure, ctypes.Union)


def struct_of(a: ctypes.Structure | ctypes.Union | np.void) -> KernelArg:
    """A ctypes struct or union, or a numpy structured scalar, as a by-value struct argument.

    Its alignment is its own (``ctypes.alignment``, the numpy dtype's, which is C's for a
    dtype made with ``align=True`` and 1 without), so a launch checks it against the
    kernel's as it checks the size.

    Args:
        a: The struct: a ``ctypes.Structure`` or ``ctypes.Union`` instance, or a numpy
            structured scalar (``np.void`` with fields).

    Returns:
        `KernelArg.struct` of its bytes, with its alignment.
    """
    if isinstance(a, np.void):
        return KernelArg.struct(a.tobytes(), align=a.dtype.alignment)
    return KernelArg.struct(bytes(memoryview(a).cast("B")), align=ctypes.alignment(a))


def _describe(a: Any) -> str:
    if isinstance(a, KernelArg):
        return a.describe()
    if isinstance(a, np.generic):
        return f"numpy {a.dtype} scalar"
    return type(a).__name__


def _phrase(a: Any) -> str:
    """What an argument is, as a refusal against a C type says it (``an f64 scalar``)."""
    if isinstance(a, Span):
        return f"a {type(a).__name__} (pointer)"
    if isinstance(a, KernelArg):
        if a.kind == _SCALAR and a.scalar_type is not None:
            name = a.scalar_type.name
            return f"{'an' if name[0] in 'fi' else 'a'} {name} scalar"
        if a.kind == _BYTES:
            aligned = "" if a.align is None else f", aligned to {a.align}"
            return f"a struct of {len(a.data)} bytes{aligned}"
        return _phrase(a.span)
    return f"a {_describe(a)}"


def _scalar_fits(p: Param, t: ScalarType) -> bool:
    if p.c_type is not None:
        taken = value_types(p.c_type)  # the compiler's type: signedness and width exactly
        if taken is not None:
            return t in taken
        if p.kind == BYTES:  # a struct the compiler named: its bytes go by KernelArg.struct
            return False
    if p.kind == INT:
        return t.kind in ("int", "uint", "bool") and t.itemsize == p.size
    if p.kind == FLOAT:  # PTX says f16, f32 or f64, C the exact type: the parameter's own
        return t is p.scalar
    if p.kind == PTR_OR_INT:
        return t.kind in ("int", "uint") and t.itemsize == 8
    if p.kind in (BYTES, OPAQUE):
        return t.itemsize == p.size
    return False


def _pack_python(p: Param, a: Any, op: str, i: int) -> bytes:
    """A bare Python number, accepted only where the parameter's type is known."""
    where = f"{op}: args[{i}]"
    if p.kind == FLOAT and p.scalar is not None and not isinstance(a, bool):
        return dtypes.pack_scalar(p.scalar, a, where)
    if p.kind == BYTES and p.scalar is not None and p.scalar.kind == "complex":
        if not isinstance(a, bool):
            return dtypes.pack_scalar(p.scalar, a, where)
    if p.kind == INT and isinstance(a, int):
        if p.scalar is not None:
            return dtypes.pack_scalar(p.scalar, a, where)
        bits = 8 * p.size  # PTX gives the width, not the sign: accept either reading
        if not -(1 << (bits - 1)) <= a < (1 << bits):
            raise ValidationError(f"{where}: {a} does not fit a {bits}-bit integer parameter")
        return (a & ((1 << bits) - 1)).to_bytes(p.size, "little")
    raise ValidationError(
        f"{where} is a bare Python {type(a).__name__} but the parameter is {p.describe()}; "
        f"pass a typed scalar (tf.u64(...), tf.f32(...)) or a span"
    )


class ParamBlockBase:
    """One kernel's arguments packed in one buffer, and the pointer array cuLaunchKernel takes.

    The part `ParamBlock` (CUDA C, PTX, CUBIN) and the numba block share: the buffer laid out
    from the signature, `pack` over the subclass's `pack_slot`, the memory of the last
    arguments packed, and `snapshot`/`restore` so a refused update leaves the buffer as it was.
    The driver copies the buffer at enqueue time, so it can be repacked for the next launch at
    once.
    """

    __slots__ = (
        "_buf",
        "_mv",
        "_ptrs",
        "address",
        "last_args",
        "last_slot_spans",
        "last_spans",
        "nparams",
        "offsets",
        "sig",
    )
    sig: Signature
    offsets: tuple[int, ...]
    _buf: ctypes.Array[ctypes.c_char]
    _mv: memoryview
    _ptrs: ctypes.Array[ctypes.c_void_p]
    address: int
    last_args: tuple[Any, ...]
    last_spans: list[Span]
    last_slot_spans: list[Span | None]
    nparams: int
    what = "kernel"  # how refusals name the kernel

    def __init__(self, sig: Signature) -> None:
        self.sig = sig
        offsets, off = [], 0
        for p in sig.params:
            off = (off + p.align - 1) // p.align * p.align
            offsets.append(off)
            off += p.size
        self.offsets = tuple(offsets)
        self._buf = ctypes.create_string_buffer(max(off, 8))
        self._mv = memoryview(self._buf).cast("B")
        base = ctypes.addressof(self._buf)
        self._ptrs = (ctypes.c_void_p * max(len(offsets), 1))(*(base + o for o in offsets))
        self.address = ctypes.addressof(self._ptrs)
        self.last_args = ()
        self.last_spans = []
        # Per argument of last_args: its span, or None. Only this general pack records them;
        # ParamBlock's straight-line pack leaves them empty, so its refusals recheck everything.
        self.last_slot_spans = []

    def forget(self) -> None:
        """Drop the remembered last arguments (the session calls this when it synchronizes)."""
        self.last_args = ()
        self.last_spans = []
        self.last_slot_spans = []

    def snapshot(self) -> bytes:
        """The packed bytes as they are now, for `restore`."""
        return bytes(self._mv)

    def restore(self, saved: bytes) -> None:
        """Put back bytes taken by `snapshot`; the last arguments are forgotten."""
        self._mv[:] = saved
        self.forget()

    def pack(self, args: list[Any] | tuple[Any, ...], state: Any, op: str) -> list[Span]:
        """Check every argument against the signature and write it; return the spans used.

        Refuses (`ValidationError`): a wrong count, a span of another or a closed session, a
        span where a scalar is expected or the reverse, a size or float/int mismatch, a bare
        Python number where the type is not known, a `TensorRef` where the kernel writes, and
        overlapping spans where one of them is writable.
        """
        prev = self.last_args  # empty until a pack succeeds: then every argument is checked
        if prev and len(args) == len(prev) and all(map(_is, args, prev)):
            return self.last_spans  # the very objects checked and packed last time
        if len(args) != self.nparams:
            raise ValidationError(
                f"{op}: {self.what} {display_name(self.sig.name)!r} takes {self.nparams} "
                f"argument(s), got {len(args)}"
            )
        # An argument that is the very object packed last in its place is checked and
        # written already (prev is empty after a refused pack: everything is checked again).
        kept = self.last_slot_spans if len(self.last_slot_spans) == len(prev) > 0 else None
        self.last_slot_spans = []
        self.last_args = ()
        spans: list[Span] = []
        slot_spans: list[Span | None] = []
        new_span = False
        slot = self.pack_slot
        for i in range(self.nparams):
            a = args[i]
            if kept is not None and a is prev[i]:
                span = kept[i]
            else:
                span = slot(i, a, state, op)
                new_span = new_span or span is not None
            slot_spans.append(span)
            if span is not None:
                spans.append(span)
        if new_span and len(spans) > 1:
            check_overlaps(spans, args, op)
        self.last_args, self.last_spans = tuple(args), spans
        self.last_slot_spans = slot_spans
        return spans

    def pack_new(self, args: list[Any] | tuple[Any, ...], state: Any, op: str) -> list[Span]:
        """`pack`, for a caller that found ``args`` are not the very objects packed last."""
        return self.pack(args, state, op)

    def replace(
        self, args: list[Any], index: Any, arg: Any, state: Any, op: str
    ) -> tuple[list[Any], list[Span]]:
        """Check and write ``arg`` in place of ``args[index]`` alone; the new args and spans.

        ``args`` are the arguments the block holds packed. Only the new argument is checked,
        and its span for overlaps against the others. A refusal (`ValidationError`: ``index``
        out of range, ``arg`` refused for that parameter, an overlap) leaves the bytes as they
        were.
        """
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(args):
            raise ValidationError(f"{op}: {index=} is out of range for {len(args)} argument(s)")
        saved = self.snapshot()
        try:
            span = self.pack_slot(index, arg, state, op)
            new_args = list(args)
            new_args[index] = arg
            spans = [sp for sp in map(span_of, new_args) if sp is not None]
            if span is not None and len(spans) > 1:
                check_overlaps(spans, new_args, op)
        except BaseException:
            self.restore(saved)
            raise
        self.forget()  # the last arguments packed are no longer what the block holds
        return new_args, spans

    def pack_slot(self, i: int, a: Any, state: Any, op: str) -> Span | None:
        """Check and write argument ``i`` alone; return its span, or None for a value."""
        raise NotImplementedError


class ParamBlock(ParamBlockBase):
    """The packed arguments of a CUDA C, PTX or CUBIN kernel, checked against its `Signature`.

    Made once per kernel (or per bound launch); `pack` overwrites the values in place, so a
    launch allocates nothing for its parameters. It remembers the argument objects it packed
    last: a launch with the very same objects (by identity) skips the checks it already made.
    Those objects stay referenced until the next launch with others or the session's end.
    """

    # pack_new: the straight-line pack without its identity test, a plain function (no
    # bound method made a launch).
    __slots__ = (
        "_pack",
        "elements",
        "pack_new",
        "params",
        "read_only_ok",
        "scalars_taken",
        "slices",
        "takes_pointer",
        "writes",
    )
    _pack: Callable[[list[Any] | tuple[Any, ...], Any, str], list[Span]]
    nparams: int  # set here, from the signature (ParamBlockBase declares it)
    pack_new: Callable[[list[Any] | tuple[Any, ...], Any, str], list[Span]]  # type: ignore[assignment]
    params: tuple[Param, ...]
    elements: tuple[frozenset[ScalarType] | None, ...]
    read_only_ok: tuple[bool, ...]
    scalars_taken: tuple[frozenset[ScalarType], ...]
    slices: tuple[slice, ...]
    takes_pointer: tuple[bool, ...]
    writes: tuple[bool, ...]

    def __init__(self, sig: Signature) -> None:
        super().__init__(sig)
        params = self.params = sig.params
        self.nparams = len(params)
        # Per parameter, decided once: the scalar types it takes, where its bytes go, whether
        # a span may go there, and whether the kernel writes through it.
        self.scalars_taken = tuple(
            frozenset(t for t in dtypes.SCALAR_TYPES if _scalar_fits(p, t)) for p in params
        )
        self.slices = tuple(slice(o, o + p.size) for o, p in zip(self.offsets, params, strict=True))
        self.takes_pointer = tuple(
            p.kind is PTR or p.kind is PTR_OR_INT or (p.kind == OPAQUE and p.size == 8)
            for p in params
        )
        self.writes = tuple(bool(p.writes) for p in params)
        # From the C type where the compiler gave it: the span dtypes a pointer takes (None:
        # any), and whether memory its producer marked read-only may go there (a const
        # pointee, or no C type to say otherwise).
        self.elements = tuple(element_types(p.c_type) for p in params)
        self.read_only_ok = tuple(
            p.c_type is None or p.c_type.pointee is None or p.c_type.pointee.is_const
            for p in params
        )
        self._pack, self.pack_new = self._straight_line_pack()

    def pack(self, args: list[Any] | tuple[Any, ...], state: Any, op: str) -> list[Span]:
        """`ParamBlockBase.pack`, through straight-line code made for this signature."""
        return self._pack(args, state, op)

    def _straight_line_pack(self) -> tuple[Any, Any]:
        """``(pack, pack_new)``: `ParamBlockBase.pack` unrolled for this signature.

        As PyCUDA's ``prepare`` does; ``pack_new`` is the same without the identity test.
        Each parameter gets the one test its usual argument passes (a span of this session
        where a pointer goes, a typed scalar of a type the parameter takes where a value
        goes); anything else goes to `pack_slot`, which accepts or refuses it as always. What
        is written and returned is what the general loop writes and returns.
        """
        lines = [
            "def pack(args, state, op):",
            f'    """{_GENERATED.format("args.ParamBlock._straight_line_pack")}"""',
            "    prev = block.last_args",
            "    if prev and len(args) == len(prev) and all(map(_is, args, prev)):",
            "        return block.last_spans",
            "    return pack_new(args, state, op)",
            "def pack_new(args, state, op):",
            f'    """{_GENERATED.format("args.ParamBlock._straight_line_pack")}"""',
            f"    if len(args) != {self.nparams}:",
            "        return general(args, state, op)",
            "    block.last_args = ()",
            "    spans = []",
        ]
        consts: dict[str, Any] = {}
        for i, off in enumerate(self.offsets):
            lines.append(f"    a = args[{i}]")
            if self.takes_pointer[i]:
                typed = "c is TensorMut"
                if not self.writes[i]:
                    typed += " or c is TensorRef" + (
                        "" if self.read_only_ok[i] else " and not a.producer_readonly"
                    )
                elements = self.elements[i]
                if elements is not None:  # one element type: an identity test
                    single = len(elements) == 1
                    consts[f"E{i}"] = next(iter(elements)) if single else elements
                    typed = f"({typed}) and a.scalar_type {'is' if single else 'in'} E{i}"
                lines += [
                    "    c = a.__class__",
                    f"    if (c is DeviceBytes or {typed}) and a.state is state:",
                    f"        put_u64(mv, {off}, a.ptr)",
                    "        spans.append(a)",
                    f"    elif (a := slot({i}, a, state, op)) is not None:",
                    "        spans.append(a)",
                ]
            elif self._takes_tensor_map(i):  # the map's bytes; its span is held
                lines += [
                    "    if a.__class__ is TensorMap and a.span.state is state:",
                    f"        mv[{off}:{off + 128}] = a.data",
                    "        spans.append(a.span)",
                    f"    elif (a := slot({i}, a, state, op)) is not None:",
                    "        spans.append(a)",
                ]
            else:
                size = self.params[i].size
                # numpy scalars (np.float32(x)) of a type the parameter takes: their own bits,
                # assigned into a one-element array of their own type over the place
                consts[f"N{i}"] = {
                    c: np.frombuffer(self._mv, dtype=c, count=1, offset=off)
                    for c in map(dtypes.numpy_scalar_class, self.scalars_taken[i])
                    if c is not None and np.dtype(c).itemsize == size
                }
                lines += [
                    f"    if a.__class__ is KernelArg and a.kind == {_SCALAR} and "
                    f"a.scalar_type in taken[{i}]:",
                    f"        mv[{off}:{off + size}] = a.data",
                    f"    elif (v := N{i}.get(a.__class__)) is not None:",
                    "        v[0] = a",
                    f"    elif (a := slot({i}, a, state, op)) is not None:",
                    "        spans.append(a)  # a tensor map's span",
                ]
        # Two or three spans: each pair tested inline (`overlaps`); check_overlaps names them.
        pair = (
            "(({0}.writable or {1}.writable) and {0}.lo < {1}.hi and {1}.lo < {0}.hi and "
            "{0}.hi > {0}.lo and {1}.hi > {1}.lo)"
        )
        lines += [
            "    if len(spans) == 2:",
            "        a, b = spans",
            f"        if {pair.format('a', 'b')}:",
            "            check_overlaps(spans, args, op)",
            "    elif len(spans) == 3:",
            "        a, b, c = spans",
            f"        if {pair.format('a', 'b')} or {pair.format('a', 'c')} or "
            f"{pair.format('b', 'c')}:",
            "            check_overlaps(spans, args, op)",
            "    elif len(spans) > 3:",
            "        check_overlaps(spans, args, op)",
            "    block.last_args, block.last_spans = tuple(args), spans",
            "    return spans",
        ]
        namespace = {
            "block": self,
            "_is": _is,
            "general": super().pack,
            "slot": self.pack_slot,
            "mv": self._mv,
            "put_u64": _U64.pack_into,
            "taken": self.scalars_taken,
            **consts,
            "KernelArg": KernelArg,
            "TensorMut": TensorMut,
            "TensorRef": TensorRef,
            "DeviceBytes": DeviceBytes,
            "TensorMap": TensorMap,
            "check_overlaps": check_overlaps,
        }
        exec(
            compile("\n".join(lines), "<tenferro.args.ParamBlock._straight_line_pack>", "exec"),
            namespace,
        )
        return namespace["pack"], namespace["pack_new"]

    def fresh(self) -> ParamBlock:
        """A new, empty block for the same signature (for a bound launch of its own)."""
        return ParamBlock(self.sig)

    def mismatch(self, op: str, i: int, a: Any, got: str = "", hint: str = "") -> ValidationError:
        """The refusal of ``a`` for parameter ``i``: what it is against what the kernel takes.

        Against the C type where the compiler gave one (``args[1] 'x' is float64, the kernel
        takes const float*``), else against the parameter's kind. ``got`` says what ``a`` is
        where its class does not (a span's dtype).
        """
        p = self.params[i]
        if p.c_type is None:
            return ValidationError(
                f"{op}: args[{i}] expects {p.describe()}, got {got or _describe(a)}"
            )
        name = f" {p.name!r}" if p.name else ""
        what = p.c_type.spell()
        if p.kind == BYTES:
            what += f" ({p.size} bytes, aligned to {p.align})"
            if not hint and isinstance(a, KernelArg) and a.kind == _SCALAR:
                hint = (
                    "; pass the struct itself (a ctypes.Structure, a numpy structured scalar) "
                    "or its bytes with tf.KernelArg.struct"
                )
        return ValidationError(
            f"{op}: args[{i}]{name} is {got or _phrase(a)}, the kernel takes {what}{hint}"
        )

    def _takes_tensor_map(self, i: int) -> bool:
        """Whether parameter ``i`` is a ``CUtensorMap`` by value (or 128 bytes of no C type)."""
        p = self.params[i]
        name = None if p.c_type is None else p.c_type.unqualified().name
        return p.kind == BYTES and p.size == 128 and (name is None or name in TENSOR_MAP_C_TYPES)

    def _pack_tensor_map(self, i: int, a: TensorMap, state: Any, op: str) -> Span:
        """Write a tensor map where the kernel takes a ``CUtensorMap``; its span is held."""
        if not self._takes_tensor_map(i):
            raise self.mismatch(op, i, a, got=f"a TensorMap ({len(a.data)} bytes)")
        if a.span.state is not state:
            raise ValidationError(
                f"{op}: args[{i}] is a TensorMap over a span of another session; make the "
                "span and its map in this session"
            )
        self._mv[self.slices[i]] = a.data
        return a.span

    def _pack_condition(self, i: int, a: GraphCondition, state: Any, op: str) -> None:
        """A graph condition where the kernel takes a ``cudaGraphConditionalHandle``."""
        p = self.params[i]
        if p.kind not in (INT, PTR_OR_INT) or p.size != 8:
            raise self.mismatch(op, i, a, got="a GraphCondition (a 64-bit handle)")
        why = a.refusal(state)
        if why is not None:
            raise ValidationError(f"{op}: args[{i}] {why}")
        _U64.pack_into(self._mv, self.offsets[i], a.handle)

    def pack_slot(self, i: int, a: Any, state: Any, op: str) -> Span | None:
        """Check and write argument ``i`` alone; return its span, or None for a value."""
        cls = a.__class__
        if cls is TensorMap:
            return self._pack_tensor_map(i, a, state, op)
        if cls is GraphCondition:
            self._pack_condition(i, a, state, op)
            return None
        if isinstance(a, _BY_VALUE_STRUCTS) or (cls is np.void and a.dtype.names):
            a, cls = struct_of(a), KernelArg  # its size and alignment are checked as one
        if cls is KernelArg:
            if a.kind == _SCALAR:
                if a.scalar_type not in self.scalars_taken[i]:
                    raise self.mismatch(op, i, a)
                self._mv[self.slices[i]] = a.data
                return None
            if a.kind == _POINTER:
                a = a.span
                cls = a.__class__
            else:
                p = self.params[i]
                if (
                    p.kind not in (BYTES, OPAQUE)
                    or len(a.data) != p.size
                    or (a.align is not None and p.kind == BYTES and a.align != p.align)
                ):
                    where = f" aligned to {p.align}" if p.kind == BYTES else ""
                    if p.c_type is not None:
                        raise self.mismatch(op, i, a)
                    raise ValidationError(
                        f"{op}: args[{i}] expects {p.describe()}{where}, got {a.describe()}"
                    )
                self._mv[self.slices[i]] = a.data
                return None
        if cls is TensorMut or cls is TensorRef or cls is DeviceBytes:
            if a.state is not state:
                raise ValidationError(
                    f"{op}: args[{i}] is a {cls.__name__} of another session; make spans "
                    f"with this session's tensor()/tensor_mut()"
                )
            if not self.takes_pointer[i]:
                raise self.mismatch(op, i, a, got=f"a {cls.__name__} (pointer)")
            if cls is TensorRef and self.writes[i]:
                p = self.params[i]
                raise ValidationError(
                    f"{op}: args[{i}] is a read-only TensorRef but kernel "
                    f"{display_name(self.sig.name)!r} writes parameter {p.name or i}; use "
                    "tensor_mut()"
                )
            elements = self.elements[i]
            if elements is not None and cls is not DeviceBytes and a.scalar_type not in elements:
                raise self.mismatch(op, i, a, got=str(a.dtype))
            if cls is TensorRef and a.producer_readonly and not self.read_only_ok[i]:
                raise self.mismatch(
                    op,
                    i,
                    a,
                    got="memory its producer marked read-only",
                    hint="; declare it const if the kernel only reads it",
                )
            _U64.pack_into(self._mv, self.offsets[i], a.ptr)
            return a
        p = self.params[i]
        got = ""
        if isinstance(a, CTYPES_SIMPLE):  # c_int(5): the numpy scalar of its C type
            got = f"a ctypes {cls.__name__}"
            a = from_ctypes(a, f"{op}: args[{i}]")
        if isinstance(a, np.generic):
            t = dtypes.from_numpy(a.dtype, f"{op}: args[{i}]")
            if not _scalar_fits(p, t):
                raise self.mismatch(op, i, a, got=got and f"{got} ({t.name})")
            data = dtypes.pack_scalar(t, a.item(), f"{op}: args[{i}]")
        elif cls is int or cls is float or cls is bool or cls is complex:
            data = _pack_python(p, a, op, i)
        else:
            raise ValidationError(
                f"{op}: args[{i}] is {_describe(a)}; expected a span (s.tensor(x), "
                f"s.tensor_mut(x)), a KernelArg or a typed scalar such as tf.u32(n)"
            )
        self._mv[self.slices[i]] = data
        return None


def span_of(a: Any) -> Span | None:
    """The span an argument passes (a pointer's, a tensor map's), or None for a value."""
    cls = type(a)
    if cls in _SPAN_TYPES:
        return a
    if cls is KernelArg or cls is TensorMap:
        return a.span
    return None


def _span_positions(args: list[Any] | tuple[Any, ...]) -> list[int]:
    """The argument index of each span, in the order `ParamBlock.pack` collected them."""
    return [i for i, a in enumerate(args) if span_of(a) is not None]


def check_overlaps(spans: list[Span], args: list[Any] | tuple[Any, ...], op: str) -> None:
    """Refuse spans of one launch that overlap where one of them is writable."""
    n = len(spans)
    for i in range(n):
        a = spans[i]
        for j in range(i + 1, n):
            b = spans[j]
            if (a.writable or b.writable) and overlaps(a, b):
                pos = _span_positions(args)
                raise ValidationError(
                    f"{op}: args[{pos[i]}] ({type(a).__name__}) and "
                    f"args[{pos[j]}] ({type(b).__name__}) overlap in memory "
                    f"(0x{a.lo:x}-0x{a.hi:x} and 0x{b.lo:x}-0x{b.hi:x}); "
                    "a writable span must be exclusive in a launch"
                )
