"""dlpack.h's structures as ctypes, an independent reading of the layout for the tests."""

import ctypes

from tenferro.interop import dlpack


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


class DLManagedTensor(ctypes.Structure):
    """dlpack.h DLManagedTensor (legacy, before 1.0)."""

    _fields_ = (
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    )


class DLPackVersion(ctypes.Structure):
    """dlpack.h DLPackVersion."""

    _fields_ = (("major", ctypes.c_uint32), ("minor", ctypes.c_uint32))


class DLManagedTensorVersioned(ctypes.Structure):
    """dlpack.h DLManagedTensorVersioned (1.0 and later)."""

    _fields_ = (
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    )


# The package reads and writes the same layouts with struct formats: they must agree.
assert dlpack.DLTENSOR.size == ctypes.sizeof(DLTensor)
assert dlpack.VERSIONED_HEAD.size == DLManagedTensorVersioned.dl_tensor.offset
assert dlpack.DLTENSOR.size + dlpack.LEGACY_TAIL.size == ctypes.sizeof(DLManagedTensor)
