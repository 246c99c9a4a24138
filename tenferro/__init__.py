"""tenferro: write and launch your own CUDA kernels from Python, checked and fast."""

from .args import KernelArg, bf16, f16, f32, f64, i8, i16, i32, i64, u8, u16, u32, u64
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
from .launch import LaunchConfig
from .module import CompiledCuda, Function, Module, cache_stats, compile_cuda
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
