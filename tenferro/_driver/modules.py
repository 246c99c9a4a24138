"""Modules loaded into the current context, and what the driver says of their functions.

Loading a PTX or CUBIN image, finding a kernel or a variable by name, the CUfunction of a
library kernel (numba's CUkernel), and a function's attributes, parameter layout and occupancy,
each as ints: the module and function handles, the addresses, the counts.
"""

from __future__ import annotations

import struct
from typing import Any

from .fast_launch import launch_config
from .results import check, cu

__all__ = [
    "func_attribute",
    "func_param_layout",
    "func_set_attribute",
    "func_set_max_dynamic_shared",
    "kernel_function",
    "max_active_clusters",
    "module_function_names",
    "module_get_function",
    "module_get_global",
    "module_load_data",
    "module_unload",
    "occupancy_blocks",
    "tensor_map_encode",
]


def module_load_data(image: bytes, op: str) -> int:
    """Load a PTX (NUL-terminated) or CUBIN image into the current context."""
    return int(check(op, cu.cuModuleLoadData(image)))


def module_unload(module: int) -> None:
    """Unload a module."""
    check("cuModuleUnload", cu.cuModuleUnload(cu.CUmodule(module)))


def module_get_global(module: int, name: str, op: str) -> tuple[int, int]:
    """The address and size of the module's variable ``name`` (CUDA_ERROR_NOT_FOUND if none)."""
    ptr, nbytes = check(op, cu.cuModuleGetGlobal(cu.CUmodule(module), name.encode()))
    return int(ptr), int(nbytes)


def module_get_function(module: int, name: str) -> int | None:
    """The function ``name`` of a module, or None when the module has no such entry."""
    res = cu.cuModuleGetFunction(cu.CUmodule(module), name.encode())
    if res[0] == cu.CUresult.CUDA_ERROR_NOT_FOUND:
        return None
    return int(check("cuModuleGetFunction", res))


def module_function_names(module: int) -> list[str]:
    """The names of every kernel in a module."""
    mod = cu.CUmodule(module)
    count = check("cuModuleGetFunctionCount", cu.cuModuleGetFunctionCount(mod))
    funcs = check("cuModuleEnumerateFunctions", cu.cuModuleEnumerateFunctions(count, mod))
    return sorted(check("cuFuncGetName", cu.cuFuncGetName(f)).decode() for f in funcs)


_FA = cu.CUfunction_attribute if cu is not None else None


def kernel_function(kernel: int, op: str) -> int:
    """The CUfunction of a library kernel (CUkernel) in the current context."""
    return int(check(op, cu.cuKernelGetFunction(cu.CUkernel(kernel))))


def func_attribute(func: int, name: str) -> int:
    """A function attribute by its CU_FUNC_ATTRIBUTE_ suffix (``"MAX_THREADS_PER_BLOCK"``)."""
    attr = getattr(_FA, "CU_FUNC_ATTRIBUTE_" + name)
    return int(check("cuFuncGetAttribute", cu.cuFuncGetAttribute(attr, cu.CUfunction(func))))


def occupancy_blocks(func: int, threads: int, shared_mem_bytes: int, op: str) -> int:
    """Blocks of ``threads`` threads that fit on one multiprocessor at once (the occupancy API)."""
    return int(
        check(
            op,
            cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                cu.CUfunction(func), threads, shared_mem_bytes
            ),
        )
    )


def func_set_attribute(func: int, name: str, value: int, op: str) -> None:
    """Set a function attribute by its CU_FUNC_ATTRIBUTE_ suffix."""
    attr = getattr(_FA, "CU_FUNC_ATTRIBUTE_" + name)
    check(op, cu.cuFuncSetAttribute(cu.CUfunction(func), attr, value))


def max_active_clusters(func: int, dims: tuple, cluster: tuple, stream: int, op: str) -> int:
    """Clusters of this launch shape that can run at once on the device (0: none fits)."""
    config = launch_config(dims, stream, (cluster, False, False, None))
    return int(check(op, cu.cuOccupancyMaxActiveClusters(cu.CUfunction(func), config)))


def func_set_max_dynamic_shared(func: int, nbytes: int, op: str) -> None:
    """Allow ``nbytes`` of dynamic shared memory for ``func`` (needed above 48 KiB)."""
    func_set_attribute(func, "MAX_DYNAMIC_SHARED_SIZE_BYTES", nbytes, op)


def func_param_layout(func: int) -> list[tuple[int, int]]:
    """(offset, size) of each parameter, as the driver laid them out (cuFuncGetParamInfo).

    The count comes from cuFuncGetParamCount where the driver has it; an older driver is
    probed until cuFuncGetParamInfo refuses the index past the last (an API error that
    compute-sanitizer reports, so only where the count cannot be had).
    """
    f = cu.CUfunction(func)
    try:
        res = cu.cuFuncGetParamCount(f)
    except Exception:  # the bindings' entry point is missing from this driver
        res = (cu.CUresult.CUDA_ERROR_NOT_SUPPORTED,)
    if not res[0]:
        return [_param_info(f, i) for i in range(int(res[1]))]
    out: list[tuple[int, int]] = []
    while True:
        res = cu.cuFuncGetParamInfo(f, len(out))
        if res[0] == cu.CUresult.CUDA_ERROR_INVALID_VALUE:
            return out
        off, size = check("cuFuncGetParamInfo", res)
        out.append((int(off), int(size)))


def _param_info(f: Any, i: int) -> tuple[int, int]:
    off, size = check("cuFuncGetParamInfo", cu.cuFuncGetParamInfo(f, i))
    return int(off), int(size)


def tensor_map_encode(
    data_type: str,
    address: int,
    dims: tuple[int, ...],
    strides: tuple[int, ...],
    box: tuple[int, ...],
    element_strides: tuple[int, ...],
    swizzle: str,
    l2_promotion: str,
    oob_fill: str,
    op: str,
) -> bytes:
    """The 128 bytes of a tiled CUtensorMap (cuTensorMapEncodeTiled), dimensions innermost first.

    ``data_type``, ``swizzle``, ``l2_promotion`` and ``oob_fill`` are the suffixes of the
    driver's enums (``"FLOAT32"``, ``"128B"``, ``"L2_128B"``, ``"NONE"``); ``strides`` are
    the byte strides of every dimension but the innermost.
    """
    encoded = check(
        op,
        cu.cuTensorMapEncodeTiled(
            getattr(cu.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{data_type}"),
            len(dims),
            address,
            [cu.cuuint64_t(d) for d in dims],  # the bindings take their own integer types
            [cu.cuuint64_t(b) for b in strides],
            [cu.cuuint32_t(b) for b in box],
            [cu.cuuint32_t(e) for e in element_strides],
            cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            getattr(cu.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swizzle}"),
            getattr(cu.CUtensorMapL2promotion, f"CU_TENSOR_MAP_L2_PROMOTION_{l2_promotion}"),
            getattr(cu.CUtensorMapFloatOOBfill, f"CU_TENSOR_MAP_FLOAT_OOB_FILL_{oob_fill}"),
        ),
    )
    return struct.pack("<16Q", *(int(word) for word in encoded.opaque))
