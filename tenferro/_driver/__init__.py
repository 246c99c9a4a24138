"""The only module that calls ``cuda.bindings``.

Every call is checked here: a failing CUresult becomes a `BackendError` naming the operation and
the CUresult; an asynchronous kernel fault becomes a `KernelFault`. Handles cross this seam as
plain ``int``s; nothing above it sees a binding object, and a launch's result code is an int that
only `raise_launch_error` reads. ``__all__`` lists what the other modules use.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from ..errors import RuntimeStateError
from .devices import device_count, device_summary, driver_version, ensure_init
from .fast_launch import (
    ExtendedLaunchRecord,
    LaunchRecord,
    build_fast_calls,
    launch_record,
    launcher,
    wait_for_stream,
)
from .graphs import (
    ExecutableGraph,
    capture_begin,
    capture_end,
    graph_destroy,
    graph_node_count,
)
from .modules import (
    func_attribute,
    func_param_layout,
    func_set_attribute,
    func_set_max_dynamic_shared,
    kernel_function,
    max_active_clusters,
    module_function_names,
    module_get_function,
    module_get_global,
    module_load_data,
    module_unload,
    occupancy_blocks,
)
from .nvrtc import cuda_include_dirs, nvrtc_compile, nvrtc_version
from .results import check, cu, fail, raise_launch_error

__all__ = [  # what the other modules use; nothing else crosses the seam
    "ExecutableGraph",
    "ExtendedLaunchRecord",
    "LaunchRecord",
    "MEMORY_DEVICE",
    "MEMORY_HOST",
    "PrimaryContext",
    "build_fast_calls",
    "capture_begin",
    "capture_end",
    "context_synchronize",
    "cuda_include_dirs",
    "default_pool_release_threshold",
    "device_count",
    "device_summary",
    "driver_version",
    "enable_peer_access",
    "ensure_init",
    "event_create",
    "event_destroy",
    "event_elapsed_ms",
    "event_query",
    "event_record",
    "event_synchronize",
    "func_attribute",
    "func_param_layout",
    "func_set_attribute",
    "func_set_max_dynamic_shared",
    "graph_destroy",
    "graph_node_count",
    "kernel_function",
    "launch_record",
    "launcher",
    "max_active_clusters",
    "mem_free",
    "mem_free_async",
    "mem_get_info",
    "memcpy_dtod_async",
    "memcpy_dtoh_async",
    "memcpy_htod_async",
    "memcpy_peer_async",
    "memset_d8_async",
    "module_function_names",
    "module_get_function",
    "module_get_global",
    "module_load_data",
    "module_unload",
    "nvrtc_compile",
    "nvrtc_version",
    "occupancy_blocks",
    "pointer_info",
    "raise_launch_error",
    "set_current",
    "stream_context",
    "stream_create",
    "stream_destroy",
    "stream_is_capturing",
    "stream_is_non_blocking",
    "stream_synchronize",
    "stream_wait_event",
    "wait_for_stream",
]

# --- contexts ---------------------------------------------------------------------------------

_A = cu.CUdevice_attribute if cu is not None else None


class PrimaryContext:
    """A device's primary context (the one numba, torch and cupy use), retained once.

    One instance a device for the life of the process, so that memory handed out by a session
    (a `Tensor` exported to torch) stays valid after the session closes.
    """

    _instances: ClassVar[dict[int, PrimaryContext]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, ordinal: int) -> None:
        self.ordinal = ordinal
        self._device = check("cuDeviceGet", cu.cuDeviceGet(ordinal))
        self.device_handle = int(self._device)
        self._context = check("cuDevicePrimaryCtxRetain",
                               cu.cuDevicePrimaryCtxRetain(self._device))
        self.handle = int(self._context)
        name = check("cuDeviceGetName", cu.cuDeviceGetName(256, self._device))
        self.name = name.split(b"\0", 1)[0].decode()
        self._attrs: dict[str, int] = {}
        self._pool = _create_pool(ordinal)

    @classmethod
    def get(cls, ordinal: int, op: str = "session") -> PrimaryContext:
        """The primary context of device ``ordinal``; refuses an ordinal the driver lacks."""
        ensure_init(op)
        inst = cls._instances.get(ordinal)
        if inst is not None:
            return inst
        with cls._lock:
            count = device_count()
            if not 0 <= ordinal < count:
                raise RuntimeStateError(
                    f"{op}: device={ordinal} does not exist; the driver sees {count} device(s)"
                )
            inst = cls._instances.get(ordinal)
            if inst is None:
                inst = cls._instances[ordinal] = PrimaryContext(ordinal)
            return inst

    def attribute(self, name: str) -> int:
        """A device attribute by its CU_DEVICE_ATTRIBUTE_ suffix (``"MAX_GRID_DIM_X"``)."""
        v = self._attrs.get(name)
        if v is None:
            attr = getattr(_A, "CU_DEVICE_ATTRIBUTE_" + name)
            v = self._attrs[name] = check(
                "cuDeviceGetAttribute", cu.cuDeviceGetAttribute(attr, self._device))
        return v

    @property
    def compute_capability(self) -> tuple[int, int]:
        """(major, minor) of the device."""
        return (self.attribute("COMPUTE_CAPABILITY_MAJOR"),
                self.attribute("COMPUTE_CAPABILITY_MINOR"))


    def make_current(self) -> int:
        """Make this context current on the calling thread; return the previous one."""
        prev = check("cuCtxGetCurrent", cu.cuCtxGetCurrent())
        if int(prev) != self.handle:
            check("cuCtxSetCurrent", cu.cuCtxSetCurrent(self._context))
        return int(prev)

    def alloc_async(self, nbytes: int, stream: int, op: str) -> int:
        """Stream-ordered allocation of ``nbytes`` (at least 1) from tenferro's pool."""
        return int(check(op, cu.cuMemAllocFromPoolAsync(max(nbytes, 1), self._pool,
                                                          cu.CUstream(stream))))

    def pool_stats(self) -> dict[str, int]:
        """Bytes the pool holds from the device (reserved) and hands out (used), now and peak."""
        out = {}
        for key, attr in _POOL_STATS.items():
            v = check("cuMemPoolGetAttribute", cu.cuMemPoolGetAttribute(
                self._pool, getattr(cu.CUmemPool_attribute, attr)))
            out[key] = int(v)
        return out

    def trim_pool(self, keep_bytes: int, op: str) -> None:
        """Give the device back the pool's unused memory, keeping at least ``keep_bytes``."""
        check(op, cu.cuMemPoolTrimTo(self._pool, keep_bytes))

    def push(self) -> None:
        """Push this context on the calling thread (for work off the session's thread)."""
        check("cuCtxPushCurrent", cu.cuCtxPushCurrent(self._context))

    @staticmethod
    def pop() -> None:
        """Pop the context pushed by `push`."""
        check("cuCtxPopCurrent", cu.cuCtxPopCurrent())


def _create_pool(ordinal: int) -> Any:
    """Tenferro's own stream-ordered memory pool on device ``ordinal``.

    Its own, so the device's default pool (which torch, CuPy and numba may use) keeps its
    settings. Freed memory stays in it between synchronizes (allocation then costs
    microseconds, as in torch's caching allocator) until `PrimaryContext.trim_pool` gives it
    back; sessions trim it when they close.
    """
    props = cu.CUmemPoolProps()
    props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.handleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
    props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = ordinal
    pool = check("cuMemPoolCreate", cu.cuMemPoolCreate(props))
    threshold = cu.cuuint64_t(0xFFFFFFFFFFFFFFFF)
    check("cuMemPoolSetAttribute", cu.cuMemPoolSetAttribute(
        pool, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, threshold))
    return pool


_POOL_STATS = {
    "reserved_bytes": "CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT",
    "reserved_bytes_high": "CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH",
    "used_bytes": "CU_MEMPOOL_ATTR_USED_MEM_CURRENT",
    "used_bytes_high": "CU_MEMPOOL_ATTR_USED_MEM_HIGH",
}


def mem_get_info() -> tuple[int, int]:
    """(free, total) bytes of the current context's device."""
    free, total = check("cuMemGetInfo", cu.cuMemGetInfo())
    return int(free), int(total)


def default_pool_release_threshold(ordinal: int) -> int:
    """The release threshold of device ``ordinal``'s default pool (other libraries use it)."""
    dev = check("cuDeviceGet", cu.cuDeviceGet(ordinal))
    pool = check("cuDeviceGetDefaultMemPool", cu.cuDeviceGetDefaultMemPool(dev))
    return int(check("cuMemPoolGetAttribute", cu.cuMemPoolGetAttribute(
        pool, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)))


def set_current(handle: int) -> None:
    """Make the context ``handle`` (0: none) current on the calling thread."""
    check("cuCtxSetCurrent", cu.cuCtxSetCurrent(cu.CUcontext(handle)))


# --- streams and events -----------------------------------------------------------------------


def stream_create() -> int:
    """A new blocking stream in the current context: ordered with the legacy default stream."""
    flags = cu.CUstream_flags.CU_STREAM_DEFAULT
    return int(check("cuStreamCreate", cu.cuStreamCreate(flags)))


def stream_is_non_blocking(stream: int, op: str) -> bool:
    """True for a stream made non-blocking: the legacy default stream does not wait for it."""
    flags = check(op, cu.cuStreamGetFlags(cu.CUstream(stream)))
    return bool(int(flags) & int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))


def stream_destroy(stream: int) -> None:
    """Destroy a stream made by `stream_create`."""
    check("cuStreamDestroy", cu.cuStreamDestroy(cu.CUstream(stream)))


def stream_context(stream: int) -> int:
    """The context a stream belongs to."""
    return int(check("cuStreamGetCtx", cu.cuStreamGetCtx(cu.CUstream(stream))))


def stream_is_capturing(stream: int, op: str) -> bool:
    """True while another library (or this one) captures ``stream`` into a graph."""
    status = check(op, cu.cuStreamIsCapturing(cu.CUstream(stream)))
    return status != cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def context_synchronize(op: str = "cuCtxSynchronize") -> None:
    """Wait for all work of the current context."""
    check(op, cu.cuCtxSynchronize())


def stream_synchronize(stream: int, op: str) -> None:
    """Block until the stream is idle; a kernel fault raises `KernelFault`."""
    check(op, cu.cuStreamSynchronize(cu.CUstream(stream)))


def event_create(timing: bool = False) -> int:
    """A new event; ``timing`` enables elapsed-time queries (and costs a little)."""
    flags = 0 if timing else cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
    return int(check("cuEventCreate", cu.cuEventCreate(flags)))


def event_destroy(event: int) -> None:
    """Destroy an event."""
    check("cuEventDestroy", cu.cuEventDestroy(cu.CUevent(event)))


def event_record(event: int, stream: int, op: str = "cuEventRecord") -> None:
    """Record ``event`` at the current tail of ``stream``."""
    check(op, cu.cuEventRecord(cu.CUevent(event), cu.CUstream(stream)))


def event_query(event: int, op: str = "cuEventQuery") -> bool:
    """True when the work before the event has completed."""
    err = cu.cuEventQuery(cu.CUevent(event))[0]
    if err == cu.CUresult.CUDA_ERROR_NOT_READY:
        return False
    if err:
        raise fail(op, err)
    return True


def event_synchronize(event: int, op: str = "cuEventSynchronize") -> None:
    """Block until the event has completed."""
    check(op, cu.cuEventSynchronize(cu.CUevent(event)))


def event_elapsed_ms(start: int, end: int, op: str = "event.elapsed_ms") -> float:
    """Milliseconds between two completed, timing-enabled events."""
    return float(check(op, cu.cuEventElapsedTime(cu.CUevent(start), cu.CUevent(end))))


def stream_wait_event(stream: int, event: int, op: str = "cuStreamWaitEvent") -> None:
    """Order later work on ``stream`` after ``event``, without blocking the host."""
    check(op, cu.cuStreamWaitEvent(cu.CUstream(stream), cu.CUevent(event), 0))


# --- memory -----------------------------------------------------------------------------------


def mem_free_async(ptr: int, stream: int) -> None:
    """Stream-ordered free on ``stream``."""
    check("cuMemFreeAsync", cu.cuMemFreeAsync(cu.CUdeviceptr(ptr), cu.CUstream(stream)))


def mem_free(ptr: int) -> None:
    """Free after all work on the device that uses it (for a stream that no longer exists)."""
    check("cuMemFree", cu.cuMemFree(cu.CUdeviceptr(ptr)))


def memcpy_htod_async(dst: int, src_host: int, nbytes: int, stream: int, op: str) -> None:
    """Copy host -> device on ``stream``."""
    check(op, cu.cuMemcpyHtoDAsync(cu.CUdeviceptr(dst), src_host, nbytes, cu.CUstream(stream)))


def memcpy_dtoh_async(dst_host: int, src: int, nbytes: int, stream: int, op: str) -> None:
    """Copy device -> host on ``stream``."""
    check(op, cu.cuMemcpyDtoHAsync(dst_host, cu.CUdeviceptr(src), nbytes, cu.CUstream(stream)))


def memcpy_dtod_async(dst: int, src: int, nbytes: int, stream: int, op: str) -> None:
    """Copy device -> device on ``stream``."""
    check(op, cu.cuMemcpyDtoDAsync(
        cu.CUdeviceptr(dst), cu.CUdeviceptr(src), nbytes, cu.CUstream(stream)))


def memcpy_peer_async(dst: int, dst_ctx: int, src: int, src_ctx: int, nbytes: int,
                      stream: int, op: str) -> None:
    """Copy between the memory of two contexts (devices) on ``stream``.

    The driver copies directly where peer access is enabled and stages the copy otherwise.
    """
    check(op, cu.cuMemcpyPeerAsync(cu.CUdeviceptr(dst), cu.CUcontext(dst_ctx),
                                     cu.CUdeviceptr(src), cu.CUcontext(src_ctx), nbytes,
                                     cu.CUstream(stream)))


_peer_enabled: set[tuple[int, int]] = set()


def enable_peer_access(ctx: PrimaryContext, peer: PrimaryContext, op: str) -> bool:
    """Let ``ctx`` (current) reach ``peer``'s memory directly where the hardware allows it.

    Returns whether direct access is on; False means copies are staged by the driver.
    """
    key = (ctx.ordinal, peer.ordinal)
    if ctx.ordinal == peer.ordinal or key in _peer_enabled:
        return True
    can = check("cuDeviceCanAccessPeer", cu.cuDeviceCanAccessPeer(
        cu.CUdevice(ctx.device_handle), cu.CUdevice(peer.device_handle)))
    if not can:
        return False
    err = cu.cuCtxEnablePeerAccess(cu.CUcontext(peer.handle), 0)[0]
    if err not in (cu.CUresult.CUDA_SUCCESS,
                   cu.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED):
        raise fail(op, err)
    _peer_enabled.add(key)
    return True


def memset_d8_async(dst: int, value: int, nbytes: int, stream: int, op: str) -> None:
    """Set ``nbytes`` bytes to ``value`` on ``stream``."""
    check(op, cu.cuMemsetD8Async(cu.CUdeviceptr(dst), value, nbytes, cu.CUstream(stream)))


_PA = cu.CUpointer_attribute if cu is not None else None
_POINTER_ATTRS = (
    [_PA.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, _PA.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
     _PA.CU_POINTER_ATTRIBUTE_IS_MANAGED] if cu is not None else [])

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
