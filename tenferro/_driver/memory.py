"""Device memory operations on a stream: frees, copies, byte fills, and what a pointer is.

Copies go host to device, device to host, device to device, and between the memory of two
contexts (the driver stages those where peer access is off). Allocation is the context's
(`PrimaryContext.alloc_async`, from its pool). `pointer_info` says whether CUDA knows a pointer
as device memory (managed memory counts), host memory or neither, and on which device.
"""

from __future__ import annotations

from .results import check, cu

__all__ = [
    "MEMORY_DEVICE",
    "MEMORY_HOST",
    "MEMORY_UNKNOWN",
    "mem_free",
    "mem_free_async",
    "memcpy_dtod_async",
    "memcpy_dtoh_async",
    "memcpy_htod_async",
    "memcpy_peer_async",
    "memset_d8_async",
    "pointer_info",
]


def mem_free_async(ptr: int, stream: int) -> None:
    """Stream-ordered free on ``stream``."""
    check("cuMemFreeAsync", cu.cuMemFreeAsync(cu.CUdeviceptr(ptr), cu.CUstream(stream)))


def mem_free(ptr: int) -> None:
    """Free after all work of the current context (for a stream that no longer exists).

    The context is synchronized, then the memory goes back to its pool on the legacy stream:
    cuMemFree would not synchronize for pool memory, and the pool would count it used for good.
    """
    check("cuCtxSynchronize", cu.cuCtxSynchronize())
    check(
        "cuMemFreeAsync", cu.cuMemFreeAsync(cu.CUdeviceptr(ptr), cu.CUstream(cu.CU_STREAM_LEGACY))
    )


def memcpy_htod_async(dst: int, src_host: int, nbytes: int, stream: int, op: str) -> None:
    """Copy host -> device on ``stream``."""
    check(op, cu.cuMemcpyHtoDAsync(cu.CUdeviceptr(dst), src_host, nbytes, cu.CUstream(stream)))


def memcpy_dtoh_async(dst_host: int, src: int, nbytes: int, stream: int, op: str) -> None:
    """Copy device -> host on ``stream``."""
    check(op, cu.cuMemcpyDtoHAsync(dst_host, cu.CUdeviceptr(src), nbytes, cu.CUstream(stream)))


def memcpy_dtod_async(dst: int, src: int, nbytes: int, stream: int, op: str) -> None:
    """Copy device -> device on ``stream``."""
    check(
        op,
        cu.cuMemcpyDtoDAsync(cu.CUdeviceptr(dst), cu.CUdeviceptr(src), nbytes, cu.CUstream(stream)),
    )


def memcpy_peer_async(
    dst: int, dst_ctx: int, src: int, src_ctx: int, nbytes: int, stream: int, op: str
) -> None:
    """Copy between the memory of two contexts (devices) on ``stream``.

    The driver copies directly where peer access is enabled and stages the copy otherwise.
    """
    check(
        op,
        cu.cuMemcpyPeerAsync(
            cu.CUdeviceptr(dst),
            cu.CUcontext(dst_ctx),
            cu.CUdeviceptr(src),
            cu.CUcontext(src_ctx),
            nbytes,
            cu.CUstream(stream),
        ),
    )


def memset_d8_async(dst: int, value: int, nbytes: int, stream: int, op: str) -> None:
    """Set ``nbytes`` bytes to ``value`` on ``stream``."""
    check(op, cu.cuMemsetD8Async(cu.CUdeviceptr(dst), value, nbytes, cu.CUstream(stream)))


_POINTER_ATTRS = (
    [
        cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED,
    ]
    if cu is not None
    else []
)

MEMORY_HOST, MEMORY_DEVICE, MEMORY_UNKNOWN = "host", "device", "unknown"


def pointer_info(ptr: int) -> tuple[str, int]:
    """(memory kind, device ordinal) of a pointer; ``"unknown"`` for memory CUDA does not know.

    Managed memory counts as device memory of its preferred device.
    """
    res = cu.cuPointerGetAttributes(len(_POINTER_ATTRS), _POINTER_ATTRS, ptr)
    if res[0]:
        return MEMORY_UNKNOWN, -1
    mem_type, ordinal, managed = res[1]
    mem_type = int(mem_type or 0)
    if managed:
        return MEMORY_DEVICE, int(ordinal)
    if mem_type == int(cu.CUmemorytype.CU_MEMORYTYPE_DEVICE):
        return MEMORY_DEVICE, int(ordinal)
    if mem_type == int(cu.CUmemorytype.CU_MEMORYTYPE_HOST):
        return MEMORY_HOST, int(ordinal)
    return MEMORY_UNKNOWN, -1
