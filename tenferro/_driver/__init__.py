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
    launch_config,
    launch_record,
    launcher,
    wait_for_stream,
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


# --- modules and functions --------------------------------------------------------------------


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
    return int(check(op, cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        cu.CUfunction(func), threads, shared_mem_bytes)))


def func_set_attribute(func: int, name: str, value: int, op: str) -> None:
    """Set a function attribute by its CU_FUNC_ATTRIBUTE_ suffix."""
    attr = getattr(_FA, "CU_FUNC_ATTRIBUTE_" + name)
    check(op, cu.cuFuncSetAttribute(cu.CUfunction(func), attr, value))


def max_active_clusters(func: int, dims: tuple, cluster: tuple, stream: int, op: str) -> int:
    """Clusters of this launch shape that can run at once on the device (0: none fits)."""
    config = launch_config(dims, stream, cluster, False)
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


# --- graphs -----------------------------------------------------------------------------------


def capture_begin(stream: int, op: str) -> None:
    """Begin capturing ``stream`` into a graph (thread-local mode: other threads unaffected)."""
    mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    check(op, cu.cuStreamBeginCapture(cu.CUstream(stream), mode))


def capture_end(stream: int, op: str) -> int:
    """End the capture of ``stream``; the captured graph's handle (0 when none was made)."""
    return int(check(op, cu.cuStreamEndCapture(cu.CUstream(stream))) or 0)


def graph_node_count(graph: int) -> int:
    """How many nodes a graph has."""
    res = cu.cuGraphGetNodes(cu.CUgraph(graph), 0)
    return int(check("cuGraphGetNodes", res)[1])


def graph_destroy(graph: int) -> None:
    """Destroy a graph."""
    check("cuGraphDestroy", cu.cuGraphDestroy(cu.CUgraph(graph)))


class ExecutableGraph:
    """An instantiated graph bound to the stream it replays on; destroyed by `destroy`."""

    __slots__ = ("_exec", "_stream", "handle")

    def __init__(self, graph: int, stream: int, op: str) -> None:
        self._exec = check(op, cu.cuGraphInstantiate(cu.CUgraph(graph), 0))
        self._stream = cu.CUstream(stream)
        self.handle = int(self._exec)

    def launch(self, op: str) -> None:
        """Enqueue the graph on its stream."""
        err = cu.cuGraphLaunch(self._exec, self._stream)[0]
        if err:
            raise fail(op, err)

    def update(self, graph: int, op: str) -> str | None:
        """Take ``graph``'s node parameters in place (cuGraphExecUpdate); None when it did.

        Otherwise the reason, the CUgraphExecUpdateResult's name (the topology changed, a node's
        function changed, ...), and this executable graph may be left part-updated: the caller
        makes a new one from its own graph.
        """
        err, info = cu.cuGraphExecUpdate(self._exec, cu.CUgraph(graph))
        if err == cu.CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE:
            # cuda.bindings returns no result info with an error: the error's name is the reason
            return info.result.name if info is not None else err.name
        check(op, (err,))
        return None

    def destroy(self) -> None:
        """Destroy the executable graph (once; later calls do nothing)."""
        if self.handle:
            self.handle = 0
            check("cuGraphExecDestroy", cu.cuGraphExecDestroy(self._exec))
