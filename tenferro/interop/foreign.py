"""Foreign arrays read into a `Foreign` record, and the device checks every import shares.

`read_foreign` takes DLPack first wherever a producer has ``__dlpack__`` (it names the device,
spells every dtype, carries READ_ONLY and has the producer order its own stream before ours),
and the CUDA Array Interface otherwise. The session turns the record into a span.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _driver
from ..errors import RuntimeStateError, ValidationError, wrong_device
from ..spans import ADDRESS_END as _ADDRESS_END
from .cai import read_cai
from .dlpack import read_capsule, read_dlpack
from .foreign_array import Foreign

__all__ = ["check_memory", "read_foreign"]


def _cupy_negative_strides(x: Any) -> bool:
    """True for a CuPy array with a negative stride, which is read through its CAI instead.

    CuPy's DLPack export divides such byte strides as unsigned numbers (-4 bytes becomes
    2**62 - 1 elements); its CUDA Array Interface gives them right.
    """
    return type(x).__module__.partition(".")[0] == "cupy" and any(
        st < 0 for st in getattr(x, "strides", ())
    )


def read_foreign(
    x: Any, stream: int, device: int, capturing: bool, op: str, *, dlpack_only: bool = False
) -> Foreign:
    """Read ``x`` for a session on ``device`` whose stream is ``stream``.

    ``x`` has ``__dlpack__`` or ``__cuda_array_interface__``, or is an unused DLPack capsule.
    ``dlpack_only`` refuses a producer without ``__dlpack__``. During a capture a DLPack
    producer is refused: it would order itself on the capturing stream.
    """
    if isinstance(x, np.ndarray):
        raise ValidationError(
            f"{op}: x is a numpy array in host memory; s.upload(x) copies it to the device"
        )
    if type(x).__name__ == "PyCapsule":
        return read_capsule(x, op)
    has_dlpack = hasattr(x, "__dlpack__")
    if dlpack_only and not has_dlpack:
        raise ValidationError(
            f"{op}: x is a {type(x).__name__}; expected an object with "
            "__dlpack__ or a DLPack capsule"
        )
    if has_dlpack and (dlpack_only or not _cupy_negative_strides(x)):
        if capturing:
            raise RuntimeStateError(
                f"{op}: not allowed during s.capture(): a DLPack producer "
                "would order itself on the capturing stream; make the span "
                "before the capture"
            )
        return read_dlpack(x, stream, device, op)
    if hasattr(x, "__cuda_array_interface__"):
        return read_cai(x, op)
    raise ValidationError(
        f"{op}: x is a {type(x).__name__}; expected a tf.Tensor, a span or a "
        "device array with __cuda_array_interface__ or __dlpack__"
    )


def check_memory(f: Foreign, device: int, op: str) -> None:
    """Refuse memory that is not CUDA device memory of ``device``.

    A DLPack producer names its device; CAI memory is asked of the driver.
    """
    if not 0 <= f.ptr < _ADDRESS_END:
        raise ValidationError(f"{op}: x's data pointer {f.ptr} is not a 64-bit address")
    if f.device is not None and f.device != device:
        raise wrong_device(op, f.device, device)
    if f.ptr == 0 and all(d for d in f.shape):
        raise ValidationError(f"{op}: x has a null data pointer")
    if not f.ptr or 0 in f.shape or f.device is not None:
        return  # a DLPack producer said kDLCUDA and its device id: asking the driver again
        # costs a call per import and adds nothing
    kind, ordinal = _driver.pointer_info(f.ptr)
    if kind == _driver.MEMORY_HOST:
        raise ValidationError(
            f"{op}: x is in host memory (0x{f.ptr:x}); copy it to the device first"
        )
    if kind != _driver.MEMORY_DEVICE:
        raise ValidationError(f"{op}: x's pointer 0x{f.ptr:x} is not CUDA device memory")
    if ordinal != device:
        raise wrong_device(op, ordinal, device)
