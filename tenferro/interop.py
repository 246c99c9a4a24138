"""Reading foreign device arrays: the CUDA Array Interface (v2/v3) and DLPack.

Both readers return a `Foreign` record: pointer, shape, strides in bytes, scalar type, whether
the producer marked it read-only, the producer's stream (to order after, never to host-sync
on), and the object that keeps the memory alive. The session checks the rest (device, host
memory, dtype, strides) the same way for every producer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import dtypes
from .dtypes import ScalarType
from .errors import ValidationError
from .spans import c_strides

__all__ = ["Foreign", "read_cai"]


@dataclass(slots=True)
class Foreign:
    """What a producer told us about its array."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    scalar_type: ScalarType
    readonly: bool
    stream: int | None  # the producer's stream handle to order after; None: nothing to wait for
    owner: Any
    device: int | None = None  # the producer's own claim (DLPack); CAI does not say
    ordered: bool = True  # False for CAI v2: the producer said nothing about its stream


def _int_tuple(v: Any, what: str, op: str) -> tuple[int, ...]:
    if not isinstance(v, tuple) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in v):
        raise ValidationError(f"{op}: __cuda_array_interface__ {what}={v!r} must be a tuple "
                              "of ints")
    return tuple(int(d) for d in v)


def read_cai(x: Any, op: str) -> Foreign:
    """Read ``x.__cuda_array_interface__`` (versions 2 and 3).

    Refused (`ValidationError`): a ``mask``, a malformed shape/strides/data, a typestr the
    device has no type for, and ``stream=0`` (which v3 forbids as ambiguous).
    """
    try:
        cai = x.__cuda_array_interface__
    except Exception as exc:  # a producer may raise for arrays it cannot export
        raise ValidationError(f"{op}: reading __cuda_array_interface__ of "
                              f"{type(x).__name__} failed: {exc}") from exc
    if not isinstance(cai, dict):
        raise ValidationError(f"{op}: __cuda_array_interface__ must be a dict, got "
                              f"{type(cai).__name__}")
    version = cai.get("version")
    if not isinstance(version, int) or version < 2:
        raise ValidationError(f"{op}: __cuda_array_interface__ {version=} is not supported "
                              "(need 2 or 3)")
    if cai.get("mask") is not None:
        raise ValidationError(f"{op}: __cuda_array_interface__ has a mask; masked arrays are "
                              "not supported")
    shape = _int_tuple(cai.get("shape"), "shape", op)
    if any(d < 0 for d in shape):
        raise ValidationError(f"{op}: __cuda_array_interface__ shape={shape} has a negative "
                              "extent")
    typestr = cai.get("typestr")
    try:
        t = dtypes.from_numpy(np.dtype(typestr), op)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ValidationError):
            raise
        raise ValidationError(f"{op}: __cuda_array_interface__ {typestr=} is not a dtype") \
            from None
    data = cai.get("data")
    if not (isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], (int, np.integer))):
        raise ValidationError(f"{op}: __cuda_array_interface__ data={data!r} must be "
                              "(pointer, readonly)")
    ptr, readonly = int(data[0]), bool(data[1])
    strides = cai.get("strides")
    if strides is None:
        strides = c_strides(shape, t.itemsize)
    else:
        strides = _int_tuple(strides, "strides", op)
        if len(strides) != len(shape):
            raise ValidationError(f"{op}: __cuda_array_interface__ strides={strides} do not "
                                  f"match shape={shape}")
    stream = cai.get("stream") if version >= 3 else None
    if stream is not None:
        if not isinstance(stream, (int, np.integer)) or isinstance(stream, bool):
            raise ValidationError(f"{op}: __cuda_array_interface__ {stream=} must be an int "
                                  "or None")
        if stream == 0:
            raise ValidationError(f"{op}: __cuda_array_interface__ stream=0 is forbidden by "
                                  "version 3 (ambiguous); the producer must give 1, 2 or a handle")
        stream = int(stream)
    return Foreign(ptr, shape, strides, t, readonly, stream, x, ordered=version >= 3)
