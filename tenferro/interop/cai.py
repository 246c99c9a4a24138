"""Reading the CUDA Array Interface (versions 2 and 3) into a `Foreign` record."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes
from ..errors import ValidationError
from ..spans import c_strides
from .foreign_array import Foreign
from .streams import stream_value

__all__ = ["read_cai"]


def _int_tuple(v: Any, what: str, op: str) -> tuple[int, ...]:
    if not isinstance(v, tuple) or not all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in v
    ):
        raise ValidationError(
            f"{op}: __cuda_array_interface__ {what}={v!r} must be a tuple of ints"
        )
    return tuple(int(d) for d in v)


def _record_of(descr: Any, itemsize: int, op: str) -> np.dtype:
    """The structured dtype a CAI ``descr`` lists, ``itemsize`` bytes in all.

    Named fields at their offsets, ``""`` for padding, and a struct in the struct as a list
    of its own, as numpy's ``dtype.descr`` writes them.
    """
    try:
        dtype = _fields_of(descr)
    except (TypeError, ValueError, IndexError, KeyError):
        dtype = None
    if dtype is None or dtype.itemsize != itemsize:
        raise ValidationError(
            f"{op}: __cuda_array_interface__ {descr=} is not a list of (name, typestr) fields "
            f"that make up the {itemsize}-byte record its typestr says"
        )
    return dtype


def _fields_of(descr: Any) -> np.dtype | None:
    """The dtype of a descr list (None: no named field); raises for what is not one."""
    if isinstance(descr, (str, bytes)):
        raise TypeError(descr)
    names: list[str] = []
    formats: list[np.dtype] = []
    offsets: list[int] = []
    at = 0
    for entry in descr:
        name, kind = entry[0], entry[1]
        fmt = _fields_of(kind) if isinstance(kind, list) else np.dtype(kind)
        if fmt is None:
            raise ValueError(kind)
        if len(entry) == 3:
            fmt = np.dtype((fmt, tuple(entry[2])))
        elif len(entry) != 2:
            raise ValueError(entry)
        if name:
            names.append(name)
            formats.append(fmt)
            offsets.append(at)
        at += fmt.itemsize
    if not names:
        return None
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": at})


def read_cai(x: Any, op: str) -> Foreign:
    """Read ``x.__cuda_array_interface__`` (versions 2 and 3).

    A record array's fields come from ``descr``, or, where the producer gives none (numba's
    device arrays), from its own numpy ``dtype`` of the typestr's size.

    Refused (`ValidationError`): a ``mask``, a malformed shape/strides/data, a typestr the
    device has no type for, and a ``stream`` the stream rule refuses (0: ambiguous).
    """
    try:
        cai = x.__cuda_array_interface__
    except Exception as exc:  # a producer may raise for arrays it cannot export
        raise ValidationError(
            f"{op}: reading __cuda_array_interface__ of {type(x).__name__} failed: {exc}"
        ) from exc
    if not isinstance(cai, dict):
        raise ValidationError(
            f"{op}: __cuda_array_interface__ must be a dict, got {type(cai).__name__}"
        )
    version = cai.get("version")
    if not isinstance(version, int) or version < 2:
        raise ValidationError(
            f"{op}: __cuda_array_interface__ {version=} is not supported (need 2 or 3)"
        )
    if cai.get("mask") is not None:
        raise ValidationError(
            f"{op}: __cuda_array_interface__ has a mask; masked arrays are not supported"
        )
    shape = _int_tuple(cai.get("shape"), "shape", op)
    if any(d < 0 for d in shape):
        raise ValidationError(f"{op}: __cuda_array_interface__ shape={shape} has a negative extent")
    typestr = cai.get("typestr")
    try:
        dtype = np.dtype(typestr)
        if dtype.kind == "V":  # a record: its fields are in descr, or in the producer's dtype
            descr = cai.get("descr")
            if descr is not None and list(descr) != [("", typestr)]:  # not the default
                dtype = _record_of(descr, dtype.itemsize, op)
            else:
                own = getattr(x, "dtype", None)  # numba's device arrays give no descr
                if isinstance(own, np.dtype) and own.names and own.itemsize == dtype.itemsize:
                    dtype = own
        t = dtypes.from_numpy(dtype, op)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ValidationError):
            raise
        raise ValidationError(f"{op}: __cuda_array_interface__ {typestr=} is not a dtype") from None
    data = cai.get("data")
    if not (isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], (int, np.integer))):
        raise ValidationError(
            f"{op}: __cuda_array_interface__ data={data!r} must be (pointer, readonly)"
        )
    ptr, readonly = int(data[0]), bool(data[1])
    strides = cai.get("strides")
    if strides is None:
        strides = c_strides(shape, t.itemsize)
    else:
        strides = _int_tuple(strides, "strides", op)
        if len(strides) != len(shape):
            raise ValidationError(
                f"{op}: __cuda_array_interface__ strides={strides} do not match shape={shape}"
            )
    # v2 has no stream to order after; v3 forbids 0 (ambiguous) as every stream value does.
    stream = (
        stream_value(cai.get("stream"), "__cuda_array_interface__ stream", op)
        if version >= 3
        else None
    )
    return Foreign(ptr, shape, strides, t, readonly, stream, x)
