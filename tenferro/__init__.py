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

from ._checkout import find_checkout_kernels as _find_checkout_kernels

_find_checkout_kernels(__path__[0])  # a checkout's top-level kernels/ is tenferro.kernels


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext tenferro``: the ``%%cuda`` cell magic (`tenferro.jupyter`)."""
    from .jupyter import load_ipython_extension as load

    load(ipython)
