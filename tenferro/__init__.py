"""tenferro: write and launch your own CUDA kernels from Python, checked and fast.

A tour: the modules a launch passes through, in order.

``s.tensor(x)`` (`tenferro.session`) hands the session's `SessionState` (`tenferro._state`)
to `tenferro.span_import`, which reads a torch tensor's fields (`tenferro.interop.producers`)
or any other producer's DLPack / CAI record (`tenferro.interop.foreign`), checks it, orders
the session's stream after the producer's (`tenferro.interop.streams`) and makes a span
(`tenferro.spans`).

``s.launch(fn, config, args)`` goes to `tenferro.launch`: a Function launched again with its
last config and the very same argument objects takes the fast path; anything new is checked
first: the function (a `tenferro.numba_kernels` kernel is specialized to its Function of
`tenferro.module`), the config against the device and the function (`tenferro.launch_config`),
and every argument against the kernel's parameter list (`tenferro.signature`), packed into
the kernel's parameter block (`tenferro.args`). Then `SessionState.enqueue` (or its fast
variant) orders the stream after pending producers, calls the launcher
(`tenferro._driver.fast_launch`: an @njit ``cuLaunchKernel``), records and counts the launch,
and hands its spans to `tenferro._liveness`, which keeps their owners alive until the stream
has passed the launch. Bound launches and graph replay (`tenferro.graph`) end in the same
enqueue routine.
"""

from ._version import __version__
from .args import KernelArg, bf16, f16, f32, f64, i8, i16, i32, i64, u8, u16, u32, u64
from .compiler import CompiledCuda, cache_stats, compile_cuda
from .devices import device_count, is_available, local_device
from .errors import (
    BackendError,
    CompileError,
    KernelFault,
    RuntimeStateError,
    TenferroError,
    ValidationError,
)
from .events import Event
from .launch import build_fast_launcher
from .launch_config import LaunchConfig
from .module import Function, Module
from .session import Session, from_dlpack
from .spans import DeviceBytes, TensorMut, TensorRef
from .tensor import Tensor
from .tensor_maps import TensorMap, tensor_map

__all__ = [
    "BackendError",
    "CompileError",
    "CompiledCuda",
    "DeviceBytes",
    "Event",
    "Function",
    "KernelArg",
    "KernelFault",
    "LaunchConfig",
    "Module",
    "RuntimeStateError",
    "Session",
    "Tensor",
    "TenferroError",
    "TensorMap",
    "TensorMut",
    "TensorRef",
    "ValidationError",
    "bf16",
    "__version__",
    "build_fast_launcher",
    "cache_stats",
    "compile_cuda",
    "device_count",
    "f16",
    "f32",
    "f64",
    "from_dlpack",
    "i8",
    "i16",
    "i32",
    "i64",
    "is_available",
    "local_device",
    "tensor_map",
    "u8",
    "u16",
    "u32",
    "u64",
]

from ._checkout import find_checkout_kernels as _find_checkout_kernels

_find_checkout_kernels(__path__[0])  # a checkout's top-level kernels/ is tenferro.kernels


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext tenferro``: the ``%%cuda`` cell magic (`tenferro.jupyter`)."""
    from .jupyter import load_ipython_extension as load

    load(ipython)
