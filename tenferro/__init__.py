"""tenferro: write and launch your own CUDA kernels from Python, checked and fast."""

from .args import KernelArg, bf16, f16, f32, f64, i8, i16, i32, i64, u8, u16, u32, u64
from .compiler import CompiledCuda, cache_stats, compile_cuda
from .devices import device_count, local_device
from .errors import (
    BackendError,
    CompileError,
    KernelFault,
    RuntimeStateError,
    TenferroError,
    ValidationError,
)
from .events import Event
from .launch_config import LaunchConfig
from .module import Function, Module
from .session import Session, from_dlpack
from .spans import DeviceBytes, TensorMut, TensorRef
from .tensor import Tensor

__all__ = [
    "BackendError", "CompileError", "CompiledCuda", "DeviceBytes", "Event", "Function",
    "KernelArg", "KernelFault", "LaunchConfig", "Module", "RuntimeStateError", "Session",
    "Tensor", "TenferroError", "TensorMut", "TensorRef", "ValidationError", "bf16",
    "cache_stats", "compile_cuda", "device_count", "f16", "f32", "f64", "from_dlpack", "i8",
    "i16", "i32", "i64", "local_device", "u8", "u16", "u32", "u64",
]

import os as _os

# The ready kernels live in the repository's top-level kernels/ and install as tenferro.kernels
# (pyproject's package-dir). Imported from a checkout on sys.path, point the subpackage there.
_checkout_kernels = _os.path.join(_os.path.dirname(__path__[0]), "kernels", "__init__.py")
if not _os.path.isfile(_os.path.join(__path__[0], "kernels", "__init__.py")) and _os.path.isfile(
        _checkout_kernels):  # a stale tenferro/kernels/__pycache__ alone does not count
    __path__.append(_os.path.dirname(__path__[0]))
del _checkout_kernels


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext tenferro``: the ``%%cuda`` cell magic (`tenferro.jupyter`)."""
    from .jupyter import load_ipython_extension as load

    load(ipython)
