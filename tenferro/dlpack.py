"""Consuming DLPack capsules (legacy ``dltensor`` and versioned ``dltensor_versioned``).

The capsule is renamed ``used_...`` the moment we take it, and a `_CapsuleOwner` calls the
producer's deleter exactly once when the last span over the memory is gone, also when reading
the tensor failed half-way. ``byte_offset`` is honoured, strides are converted from elements to
bytes, NULL strides mean C order, and the READ_ONLY flag of DLPack >= 1.0 makes ``tensor_mut``
refuse. The producer orders its own stream before ours: we pass our stream to ``__dlpack__``.
"""

from __future__ import annotations

import ctypes
from typing import Any

from . import dtypes
from .errors import ValidationError
from .interop import Foreign
from .spans import c_strides

__all__ = ["DL_CUDA", "DL_CUDA_MANAGED", "MAX_VERSION", "read_capsule", "read_dlpack"]

DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED = 1, 2, 3, 13
MAX_VERSION = (1, 1)
FLAG_READ_ONLY = 1

_LEGACY, _LEGACY_USED = b"dltensor", b"used_dltensor"
_VERSIONED, _VERSIONED_USED = b"dltensor_versioned", b"used_dltensor_versioned"


class DLDevice(ctypes.Structure):
    """dlpack.h DLDevice."""

    _fields_ = (("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32))


class DLDataType(ctypes.Structure):
    """dlpack.h DLDataType."""

    _fields_ = (("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16))


class DLTensor(ctypes.Structure):
    """dlpack.h DLTensor."""

    _fields_ = (
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    )


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    """dlpack.h DLManagedTensor (legacy, before 1.0)."""

    _fields_ = (("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p))


class DLPackVersion(ctypes.Structure):
    """dlpack.h DLPackVersion."""

    _fields_ = (("major", ctypes.c_uint32), ("minor", ctypes.c_uint32))


class DLManagedTensorVersioned(ctypes.Structure):
    """dlpack.h DLManagedTensorVersioned (1.0 and later)."""

    _fields_ = (("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", DLTensor))


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
        m = DLManagedTensorVersioned.from_address(addr)
        owner = _CapsuleOwner(addr, m.deleter or 0, producer)
        if m.version.major != 1:
            raise ValidationError(f"{op}: DLPack version {m.version.major}.{m.version.minor} "
                                  f"is not supported (this reader knows 1.x)")
        readonly = bool(m.flags & FLAG_READ_ONLY)
        t = m.dl_tensor
    elif _api.PyCapsule_IsValid(capsule, _LEGACY):
        addr = _api.PyCapsule_GetPointer(capsule, _LEGACY)
        _api.PyCapsule_SetName(capsule, _LEGACY_USED)
        m = DLManagedTensor.from_address(addr)
        owner = _CapsuleOwner(addr, m.deleter or 0, producer)
        readonly = False
        t = m.dl_tensor
    else:
        raise ValidationError(f"{op}: not an unused DLPack capsule (a capsule is consumed once)")
    dev = (t.device.device_type, t.device.device_id)
    if dev[0] not in (DL_CUDA, DL_CUDA_MANAGED):
        where = {DL_CPU: "host (kDLCPU)", DL_CUDA_HOST: "pinned host (kDLCUDAHost)"}.get(
            dev[0], f"device_type {dev[0]}")
        raise ValidationError(f"{op}: x is in {where} memory; the session needs CUDA device "
                              "memory")
    if dev[1] < 0:
        raise ValidationError(f"{op}: DLPack device_id={dev[1]} is negative")
    st = dtypes.from_dlpack(t.dtype.code, t.dtype.bits, t.dtype.lanes, op)
    if t.ndim < 0:
        raise ValidationError(f"{op}: DLPack ndim={t.ndim} is negative")
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    if any(d < 0 for d in shape):
        raise ValidationError(f"{op}: DLPack shape={shape} has a negative extent")
    if t.strides:
        strides = tuple(int(t.strides[i]) * st.itemsize for i in range(t.ndim))
    else:
        strides = c_strides(shape, st.itemsize)
    ptr = (t.data or 0) + t.byte_offset
    if not t.data and 0 not in shape:
        raise ValidationError(f"{op}: DLPack data is NULL for shape={shape}")
    return Foreign(ptr, shape, strides, st, readonly, None, owner, dev[1])


def read_dlpack(x: Any, stream: int, device: int, op: str) -> Foreign:
    """Ask ``x.__dlpack__`` for a capsule ordered on ``stream`` and consume it.

    ``__dlpack_device__`` is asked first, so host and other-device arrays are refused before the
    producer is handed our stream.
    """
    if hasattr(x, "__dlpack_device__"):
        dev_type, dev_id = x.__dlpack_device__()
        dev_type, dev_id = int(dev_type), int(dev_id)
        if dev_type not in (DL_CUDA, DL_CUDA_MANAGED):
            raise ValidationError(f"{op}: x is on DLPack device_type {dev_type} (host or "
                                  "another kind); the session needs CUDA device memory")
        if dev_id != device:
            raise ValidationError(f"{op}: x lives on device {dev_id}, this session is on "
                                  f"device {device}")
    try:
        capsule = x.__dlpack__(stream=stream, max_version=MAX_VERSION)
    except TypeError:  # producers before DLPack 1.0 take no max_version
        capsule = x.__dlpack__(stream=stream)
    return read_capsule(capsule, op, x)
