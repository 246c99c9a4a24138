"""Consuming DLPack capsules (legacy ``dltensor`` and versioned ``dltensor_versioned``).

The capsule is renamed ``used_...`` the moment we take it, and a `_CapsuleOwner` calls the
producer's deleter exactly once when the last span over the memory is gone, also when reading
the tensor failed half-way. ``byte_offset`` is honoured, strides are converted from elements to
bytes, NULL strides mean C order, and the READ_ONLY flag of DLPack >= 1.0 makes ``tensor_mut``
refuse. The producer orders its own stream before ours: we pass our stream to ``__dlpack__``.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any

from .. import dtypes
from ..errors import ValidationError, negated_view, wrong_device
from ..spans import c_strides
from .foreign_array import Foreign

__all__ = [
    "DLTENSOR",
    "DL_CUDA",
    "DL_CUDA_MANAGED",
    "LEGACY_TAIL",
    "MAX_VERSION",
    "VERSIONED_HEAD",
    "read_capsule",
    "read_dlpack",
]

DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED = 1, 2, 3, 13
MAX_VERSION = (1, 1)
MAX_NDIM = 64  # numpy's limit; a larger ndim is a malformed capsule, not an array to read
FLAG_READ_ONLY = 1

_LEGACY, _LEGACY_USED = b"dltensor", b"used_dltensor"
_VERSIONED, _VERSIONED_USED = b"dltensor_versioned", b"used_dltensor_versioned"


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # a managed tensor's deleter

# dlpack.h's structures as flat little-endian layouts, read and written in one step.
DLTENSOR = struct.Struct("<QiiiBBHQQQ")  # DLTensor: data, device, ndim, dtype, shape, strides, off
VERSIONED_HEAD = struct.Struct("<IIQQQ")  # version, manager_ctx, deleter, flags; then DLTensor
LEGACY_TAIL = struct.Struct("<QQ")  # DLTensor first; then manager_ctx, deleter

_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = (ctypes.py_object, ctypes.c_char_p)
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = (ctypes.py_object, ctypes.c_char_p)
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = (ctypes.py_object, ctypes.c_char_p)


class _CapsuleOwner:
    """Calls the producer's deleter once, when the last span holding it is gone."""

    __slots__ = ("__weakref__", "_deleter", "_managed", "producer")

    def __init__(self, managed: int, deleter: int, producer: Any) -> None:
        self._managed = managed
        self._deleter = deleter
        self.producer = producer

    def release(self) -> None:
        """Call the deleter now (once); later calls do nothing."""
        m, self._managed = self._managed, 0
        if m and self._deleter:
            _Deleter(self._deleter)(m)

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # never raise from a finaliser
            pass


def read_capsule(capsule: Any, op: str, producer: Any = None) -> Foreign:
    """Consume a DLPack capsule into a `Foreign` record (the capsule is renamed as used)."""
    if _api.PyCapsule_IsValid(capsule, _VERSIONED):
        addr = _api.PyCapsule_GetPointer(capsule, _VERSIONED)
        _api.PyCapsule_SetName(capsule, _VERSIONED_USED)
        major, minor, _ctx, deleter, flags = VERSIONED_HEAD.unpack(
            ctypes.string_at(addr, VERSIONED_HEAD.size)
        )
        owner = _CapsuleOwner(addr, deleter, producer)
        if major != 1:
            raise ValidationError(
                f"{op}: DLPack version {major}.{minor} is not supported (this reader knows 1.x)"
            )
        readonly = bool(flags & FLAG_READ_ONLY)
        tensor_at = addr + VERSIONED_HEAD.size
    elif _api.PyCapsule_IsValid(capsule, _LEGACY):
        addr = _api.PyCapsule_GetPointer(capsule, _LEGACY)
        _api.PyCapsule_SetName(capsule, _LEGACY_USED)
        _ctx, deleter = LEGACY_TAIL.unpack(ctypes.string_at(addr + DLTENSOR.size, LEGACY_TAIL.size))
        owner = _CapsuleOwner(addr, deleter, producer)
        readonly = False
        tensor_at = addr
    else:
        raise ValidationError(f"{op}: not an unused DLPack capsule (a capsule is consumed once)")
    # One read of the DLTensor (struct.unpack is several times cheaper than ctypes fields).
    data, dev_type, dev_id, ndim, code, bits, lanes, shape_p, strides_p, offset = DLTENSOR.unpack(
        ctypes.string_at(tensor_at, DLTENSOR.size)
    )
    if dev_type not in (DL_CUDA, DL_CUDA_MANAGED):
        where = {DL_CPU: "host (kDLCPU)", DL_CUDA_HOST: "pinned host (kDLCUDAHost)"}.get(
            dev_type, f"device_type {dev_type}"
        )
        raise ValidationError(f"{op}: x is in {where} memory; the session needs CUDA device memory")
    if dev_id < 0:
        raise ValidationError(f"{op}: DLPack device_id={dev_id} is negative")
    st = dtypes.from_dlpack(code, bits, lanes, op)
    if not 0 <= ndim <= MAX_NDIM:
        raise ValidationError(f"{op}: DLPack ndim={ndim} must be from 0 to {MAX_NDIM}")
    if ndim and not shape_p:
        raise ValidationError(f"{op}: DLPack shape is NULL for ndim={ndim}")
    shape = struct.unpack(f"<{ndim}q", ctypes.string_at(shape_p, 8 * ndim)) if ndim else ()
    if any(d < 0 for d in shape):
        raise ValidationError(f"{op}: DLPack shape={shape} has a negative extent")
    if strides_p and ndim:
        size = st.itemsize
        strides = tuple(
            e * size for e in struct.unpack(f"<{ndim}q", ctypes.string_at(strides_p, 8 * ndim))
        )
    else:
        strides = c_strides(shape, st.itemsize)
    if not data and 0 not in shape:
        raise ValidationError(f"{op}: DLPack data is NULL for shape={shape}")
    return Foreign(data + offset, shape, strides, st, readonly, None, owner, dev_id)


def read_dlpack(x: Any, stream: int, device: int, op: str) -> Foreign:
    """Ask ``x.__dlpack__`` for a capsule ordered on ``stream`` and consume it.

    ``__dlpack_device__`` is asked first, so host and other-device arrays are refused before the
    producer is handed our stream.
    """
    if hasattr(x, "__dlpack_device__"):
        try:
            dev_type, dev_id = x.__dlpack_device__()
            dev_type, dev_id = int(dev_type), int(dev_id)
        except Exception as exc:
            raise ValidationError(
                f"{op}: x.__dlpack_device__() of {type(x).__name__} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if dev_type not in (DL_CUDA, DL_CUDA_MANAGED):
            raise ValidationError(
                f"{op}: x is on DLPack device_type {dev_type} (host or "
                "another kind); the session needs CUDA device memory"
            )
        if dev_id != device:
            raise wrong_device(op, dev_id, device)
    is_neg = getattr(x, "is_neg", None)  # torch: a view whose memory lacks its values' sign
    if is_neg is not None and callable(is_neg) and is_neg() is True:
        raise negated_view(op)  # and DLPack does not say so
    try:
        try:
            capsule = x.__dlpack__(stream=stream, max_version=MAX_VERSION)
        except TypeError:  # producers before DLPack 1.0 take no max_version
            capsule = x.__dlpack__(stream=stream)
    except Exception as exc:  # the producer refused (torch: requires_grad, a conjugate view)
        raise ValidationError(
            f"{op}: x.__dlpack__() of {type(x).__name__} refused to export: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    return read_capsule(capsule, op, x)
