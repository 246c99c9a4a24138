"""One table: numpy dtype <-> DLPack code <-> PTX parameter type <-> scalar packer.

Every other module asks this table; nothing else spells a dtype.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from .errors import ValidationError

__all__ = [
    "BY_NUMPY",
    "SCALAR_TYPES",
    "ScalarType",
    "by_name",
    "from_c_name",
    "from_dlpack",
    "from_numpy",
    "is_int",
    "numpy_scalar_class",
    "record_type",
]

RECORD = "record"  # the kind of a structured dtype's type
# DLPack type codes (dlpack.h DLDataTypeCode).
DL_INT, DL_UINT, DL_FLOAT, DL_OPAQUE, DL_BFLOAT, DL_COMPLEX, DL_BOOL = 0, 1, 2, 3, 4, 5, 6


@dataclass(frozen=True, slots=True, eq=False)
class ScalarType:
    """A scalar type as every layer sees it.

    ``kind`` is ``"int"``, ``"uint"``, ``"float"``, ``"bool"``, ``"complex"`` or
    ``"record"`` (a numpy structured dtype: `record_type`); ``ptx`` is the PTX parameter type
    a kernel declares for it. There is one object per type (`SCALAR_TYPES`, and one per
    structured dtype), compared and hashed by identity: a launch tests membership in sets of
    them, and hashing nine fields each time would cost more than the test.
    """

    name: str
    kind: str
    itemsize: int
    numpy: np.dtype | None
    dl_code: int
    dl_bits: int
    ptx: str
    fmt: str  # struct format of the packed bits
    alignment: int = 0  # bytes an element's address is a multiple of; 0: the itemsize

    def __post_init__(self) -> None:
        if not self.alignment:
            object.__setattr__(self, "alignment", self.itemsize)

    @property
    def is_float(self) -> bool:
        """True for floating-point types (float16, bfloat16, float32, float64)."""
        return self.kind == "float"


def numpy_scalar_class(t: ScalarType) -> type | None:
    """The numpy scalar class for ``t`` whose native bytes are ``t``'s packing, or None.

    Little-endian hosts only (numpy scalars hold native bytes; kernel arguments are
    little-endian), and not for types numpy lacks (bf16).
    """
    if t.numpy is None or sys.byteorder != "little":
        return None
    return t.numpy.type


def _bfloat16_dtype() -> np.dtype | None:
    try:  # ml_dtypes is what jax and torch interop hand us; optional.
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        return None


SCALAR_TYPES: tuple[ScalarType, ...] = (
    ScalarType("bool", "bool", 1, np.dtype(np.bool_), DL_BOOL, 8, "u8", "<B"),
    ScalarType("i8", "int", 1, np.dtype(np.int8), DL_INT, 8, "s8", "<b"),
    ScalarType("i16", "int", 2, np.dtype(np.int16), DL_INT, 16, "s16", "<h"),
    ScalarType("i32", "int", 4, np.dtype(np.int32), DL_INT, 32, "s32", "<i"),
    ScalarType("i64", "int", 8, np.dtype(np.int64), DL_INT, 64, "s64", "<q"),
    ScalarType("u8", "uint", 1, np.dtype(np.uint8), DL_UINT, 8, "u8", "<B"),
    ScalarType("u16", "uint", 2, np.dtype(np.uint16), DL_UINT, 16, "u16", "<H"),
    ScalarType("u32", "uint", 4, np.dtype(np.uint32), DL_UINT, 32, "u32", "<I"),
    ScalarType("u64", "uint", 8, np.dtype(np.uint64), DL_UINT, 64, "u64", "<Q"),
    ScalarType("f16", "float", 2, np.dtype(np.float16), DL_FLOAT, 16, "f16", "<H"),
    ScalarType("bf16", "float", 2, _bfloat16_dtype(), DL_BFLOAT, 16, "b16", "<H"),
    ScalarType("f32", "float", 4, np.dtype(np.float32), DL_FLOAT, 32, "f32", "<f"),
    ScalarType("f64", "float", 8, np.dtype(np.float64), DL_FLOAT, 64, "f64", "<d"),
    ScalarType("c64", "complex", 8, np.dtype(np.complex64), DL_COMPLEX, 64, "b64", "<ff"),
    ScalarType("c128", "complex", 16, np.dtype(np.complex128), DL_COMPLEX, 128, "b128", "<dd"),
)

_BY_NAME = {t.name: t for t in SCALAR_TYPES}
_BY_NUMPY = {t.numpy: t for t in SCALAR_TYPES if t.numpy is not None}
# The same by numpy's scalar class too (np.float32, as allocations are usually asked): one
# dictionary read, no np.dtype() made.
_BY_DTYPE_OR_CLASS: dict[Any, ScalarType] = {
    **_BY_NUMPY,
    **{dt.type: t for dt, t in _BY_NUMPY.items()},
}
# numpy dtype -> scalar type, read-only: a lookup with no conversion and no error (None: not
# a device type), for readers that try a direct path before the general one.
BY_NUMPY: Mapping[np.dtype, ScalarType] = MappingProxyType(_BY_NUMPY)
_BY_DL = {(t.dl_code, t.dl_bits): t for t in SCALAR_TYPES}


def is_int(v: Any) -> bool:
    """True for a Python or numpy integer that is not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def by_name(name: str) -> ScalarType:
    """The scalar type called ``name`` (``"f32"``, ``"u64"``, ...)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValidationError(
            f"dtypes.by_name: unknown scalar type {name!r}; known: {sorted(_BY_NAME)}"
        ) from None


# C type names as compilers spell them (``char`` as signed, as NVRTC's targets have it), the
# fixed-width and size typedefs a declaration may use, and CUDA's half and bfloat16 types.
_C_NAMES = {
    "float": "f32",
    "double": "f64",
    "bool": "bool",
    "char": "i8",
    "signed char": "i8",
    "unsigned char": "u8",
    "int8_t": "i8",
    "uint8_t": "u8",
    "short": "i16",
    "unsigned short": "u16",
    "int16_t": "i16",
    "uint16_t": "u16",
    "int": "i32",
    "signed": "i32",
    "unsigned": "u32",
    "unsigned int": "u32",
    "int32_t": "i32",
    "uint32_t": "u32",
    "long": "i64",
    "unsigned long": "u64",
    "long long": "i64",
    "unsigned long long": "u64",
    "int64_t": "i64",
    "uint64_t": "u64",
    "size_t": "u64",
    "ptrdiff_t": "i64",
    "__half": "f16",
    "half": "f16",
    "__nv_bfloat16": "bf16",
    "nv_bfloat16": "bf16",
}


def from_c_name(name: str) -> ScalarType | None:
    """The scalar type a C type name denotes (``"unsigned long"`` -> u64), or None."""
    found = _C_NAMES.get(name)
    return None if found is None else _BY_NAME[found]


def from_numpy(dtype: Any, op: str = "dtype") -> ScalarType:
    """The scalar type of a numpy dtype (or anything ``np.dtype`` accepts).

    A structured dtype is a record type (`record_type`).
    """
    try:
        t = _BY_DTYPE_OR_CLASS.get(dtype)
    except TypeError:  # unhashable: np.dtype decides below
        t = None
    if t is not None:
        return t
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ValidationError(f"{op}: {dtype!r} is not a dtype") from None
    t = _BY_NUMPY.get(dt)  # a big-endian dtype is not equal to any key: refused
    if t is None:
        if dt.names:
            return record_type(dt, op)
        raise ValidationError(f"{op}: dtype {dt} is not supported on the device")
    return t


_RECORDS: dict[np.dtype, ScalarType] = {}  # structured dtype -> its one record type


def _record_name(dt: np.dtype) -> str:
    """``record(x f32 @0, hits i32 @4; 8 bytes)``: each field's type and offset, the size."""
    fields = []
    for name in dt.names or ():
        field, offset = dt.fields[name][:2]  # type: ignore[index]
        base = field.base
        what = _record_name(base) if base.names else _BY_NUMPY[base].name
        shape = "".join(f"[{d}]" for d in field.shape)
        fields.append(f"{name} {what}{shape} @{offset}")
    return f"record({', '.join(fields)}; {dt.itemsize} bytes)"


def _field_alignment(base: np.dtype) -> int:
    """A record field's alignment: its scalar's size, a complex number's part's (numpy's)."""
    t = _BY_NUMPY[base]
    return t.itemsize // 2 if t.kind == "complex" else t.alignment


def record_type(dtype: np.dtype, op: str = "dtype") -> ScalarType:
    """The record type of a numpy structured dtype: one object per dtype (equal dtypes, one).

    Elements of a record span are the dtype's bytes as numpy lays them out (its offsets and
    itemsize, padding included): a CUDA C kernel reads them through a pointer to a struct of
    that layout, a numba kernel through an array of that record type. Each field must sit at
    a multiple of its scalar's size (a complex number's part's), as the device reads it, and
    the itemsize must be a multiple of the widest such alignment; numpy's ``align=True``
    lays a dtype out so. DLPack has no record types: such spans export through
    ``__cuda_array_interface__``.

    Args:
        dtype: A numpy structured dtype (or what ``np.dtype`` makes one of).
        op: The operation named in a refusal.

    Returns:
        The `ScalarType` of kind ``"record"`` for that layout, the same object each time.

    Raises:
        ValidationError: The dtype has no fields, holds Python objects, has a field not in
            the host's byte order or out of order, a field off its alignment, or an itemsize
            that is not a multiple of its alignment.
    """
    dt = np.dtype(dtype)
    found = _RECORDS.get(dt)
    if found is not None:
        return found
    if not dt.names:
        raise ValidationError(f"{op}: dtype {dt} is not a structured dtype")
    if dt.hasobject:
        raise ValidationError(f"{op}: dtype {dt} holds Python objects; the device cannot")
    try:
        _ = dt.descr  # what __cuda_array_interface__ describes a record by
    except ValueError:
        raise ValidationError(
            f"{op}: dtype {dt} has fields out of order or overlapping, which "
            "__cuda_array_interface__ cannot describe; order its fields by offset"
        ) from None
    fields: Mapping[str, Any] = dt.fields or {}
    alignment = 1  # a C struct's: its widest field's
    for name in dt.names:
        field, offset = fields[name][:2]
        if field.base.names:  # a struct in the struct: its own fields checked the same way
            align = record_type(field.base, op).alignment
        elif not field.isnative or _BY_NUMPY.get(field.base) is None:
            raise ValidationError(
                f"{op}: dtype {dt}: field {name!r} ({field}) is not a device type in the "
                "host's byte order"
            )
        else:
            align = _field_alignment(field.base)
        if offset % align:
            raise ValidationError(
                f"{op}: dtype {dt}: field {name!r} at offset {offset} is not aligned to the "
                f"{align} bytes the device reads it in; make the dtype with align=True"
            )
        alignment = max(alignment, align)
    if dt.itemsize % alignment:
        raise ValidationError(
            f"{op}: dtype {dt} is {dt.itemsize} bytes, not a multiple of its {alignment}-byte "
            "alignment, so every other element would be misaligned; make it with align=True"
        )
    t = ScalarType(
        _record_name(dt), RECORD, dt.itemsize, dt, -1, 8 * dt.itemsize, "", "", alignment
    )
    return _RECORDS.setdefault(dt, t)  # one object even when two threads make it at once


def as_scalar_type(dtype: Any, op: str = "dtype") -> ScalarType:
    """``dtype`` as a scalar type: a `ScalarType` as it is, else `from_numpy`'s."""
    return dtype if isinstance(dtype, ScalarType) else from_numpy(dtype, op)


def from_dlpack(code: int, bits: int, lanes: int, op: str = "dlpack") -> ScalarType:
    """The scalar type of a DLPack ``DLDataType``; vector lanes are refused."""
    if lanes != 1:
        raise ValidationError(f"{op}: DLPack dtype with {lanes=} is not supported (need 1)")
    t = _BY_DL.get((code, bits))
    if t is None:
        raise ValidationError(f"{op}: DLPack dtype code={code} bits={bits} is not supported")
    return t


_F32_MAX = float(np.finfo(np.float32).max)
_F32, _F32_BITS, _U16 = struct.Struct("<f"), struct.Struct("<I"), struct.Struct("<H")
_BF16_NAN = _U16.pack(0x7FC0)
_F16_MAX = 65504.0
_BF16_MAX = 3.3895313892515355e38


def _huge(value: Any) -> str:
    """An integer past float64's range, described by its length (it has 309 digits or more)."""
    return f"an integer of {len(str(abs(int(value))))} digits"


def pack_scalar(t: ScalarType, value: Any, op: str) -> bytes:
    """Pack ``value`` into ``t``'s bits, refusing values outside the type.

    An integer out of range, a non-integral value for an integer type, and a finite float that
    would become infinite are refused with `ValidationError`.
    """
    if t.kind in ("int", "uint", "bool"):
        if isinstance(value, (float, np.floating)) or not isinstance(
            value, (int, np.integer, bool, np.bool_)
        ):
            raise ValidationError(
                f"{op}: {t.name} needs an integer, got {type(value).__name__} {value!r}"
            )
        n = int(value)
        lo, hi = (
            (0, (1 << (8 * t.itemsize)) - 1)
            if t.kind != "int"
            else (-(1 << (8 * t.itemsize - 1)), (1 << (8 * t.itemsize - 1)) - 1)
        )
        if t.kind == "bool":
            lo, hi = 0, 1
        if not lo <= n <= hi:
            raise ValidationError(f"{op}: {n} is out of range for {t.name} [{lo}, {hi}]")
        return struct.pack(t.fmt, n)
    if t.kind == "float":
        if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(
            value, (bool, np.bool_)
        ):
            raise ValidationError(
                f"{op}: {t.name} needs a real number, got {type(value).__name__} {value!r}"
            )
        try:
            v = float(value)
        except OverflowError:  # an int past float64's range
            raise ValidationError(f"{op}: {_huge(value)} overflows {t.name}") from None
        if t.name == "bf16":
            if v != v:
                return _BF16_NAN
            try:  # round to f32 first; past f32's range is past bf16's too
                bits = _F32_BITS.unpack(_F32.pack(v))[0]
            except OverflowError:
                bits = 0x7F800000
            bits += 0x7FFF + ((bits >> 16) & 1)  # round to nearest even
            half = (bits >> 16) & 0xFFFF
            if half & 0x7FFF == 0x7F80 and v - v == 0:  # infinite, from a finite value
                raise ValidationError(
                    f"{op}: {v!r} overflows {t.name} (it rounds past {_BF16_MAX!r})"
                )
            return _U16.pack(half)
        try:  # struct rounds to nearest and refuses exactly what would round to infinity
            return struct.pack(t.fmt if t.name != "f16" else "<e", v)
        except OverflowError:
            limit = _F16_MAX if t.name == "f16" else _F32_MAX
            raise ValidationError(
                f"{op}: {v!r} overflows {t.name} (it rounds past {limit!r})"
            ) from None
    if t.kind == "complex":
        if not isinstance(value, (int, float, complex, np.number)):
            raise ValidationError(f"{op}: {t.name} needs a number, got {value!r}")
        try:
            c = complex(value)
        except OverflowError:
            raise ValidationError(f"{op}: {_huge(value)} overflows {t.name}") from None
        try:  # as for f32: refused exactly where a finite part would round to infinity
            return struct.pack(t.fmt, c.real, c.imag)
        except OverflowError:
            raise ValidationError(
                f"{op}: {c!r} overflows {t.name} (a part rounds past {_F32_MAX!r})"
            ) from None
    raise ValidationError(f"{op}: cannot pack {t.name}")  # pragma: no cover
