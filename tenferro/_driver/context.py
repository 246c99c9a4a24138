"""Primary contexts: one retained a device for the process, its pool, and peer access.

`PrimaryContext.get` is how a session takes a device: the context numba, torch and CuPy use,
its device attributes, making it current (or pushing it for work off the session's thread),
and allocation from tenferro's own stream-ordered pool, which leaves the device's default pool
as other libraries set it. `enable_peer_access` lets one context reach another device's memory
directly, once a pair, where the hardware allows it.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from ..errors import RuntimeStateError, ValidationError
from .devices import device_count, ensure_init
from .results import check, cu, fail

__all__ = [
    "PrimaryContext",
    "default_pool_release_threshold",
    "enable_peer_access",
    "mem_get_info",
    "set_current",
]

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
        self._context = check("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(self._device))
        self.handle = int(self._context)
        name = check("cuDeviceGetName", cu.cuDeviceGetName(256, self._device))
        self.name = name.split(b"\0", 1)[0].decode()
        self._attrs: dict[str, int] = {}
        self._priorities: tuple[int, int] | None = None
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
            attr = getattr(_A, f"CU_DEVICE_ATTRIBUTE_{name}", None) if type(name) is str else None
            if attr is None:
                raise ValidationError(
                    f"context.attribute: {name=} is not a CU_DEVICE_ATTRIBUTE_ suffix "
                    "(such as 'MAX_GRID_DIM_X')"
                )
            v = self._attrs[name] = check(
                "cuDeviceGetAttribute", cu.cuDeviceGetAttribute(attr, self._device)
            )
        return v

    @property
    def compute_capability(self) -> tuple[int, int]:
        """(major, minor) of the device."""
        return (
            self.attribute("COMPUTE_CAPABILITY_MAJOR"),
            self.attribute("COMPUTE_CAPABILITY_MINOR"),
        )

    @property
    def stream_priority_range(self) -> tuple[int, int]:
        """(lowest, highest) stream and launch priority; lower numbers run first (0, -5)."""
        if self._priorities is None:
            self.make_current()
            lowest, highest = check("cuCtxGetStreamPriorityRange", cu.cuCtxGetStreamPriorityRange())
            self._priorities = (int(lowest), int(highest))
        return self._priorities

    def make_current(self) -> int:
        """Make this context current on the calling thread; return the previous one."""
        prev = check("cuCtxGetCurrent", cu.cuCtxGetCurrent())
        if int(prev) != self.handle:
            check("cuCtxSetCurrent", cu.cuCtxSetCurrent(self._context))
        return int(prev)

    def alloc_async(self, nbytes: int, stream: int, op: str) -> int:
        """Stream-ordered allocation of ``nbytes`` (at least 1) from tenferro's pool."""
        return int(
            check(op, cu.cuMemAllocFromPoolAsync(max(nbytes, 1), self._pool, cu.CUstream(stream)))
        )

    def pool_stats(self) -> dict[str, int]:
        """Bytes the pool holds from the device (reserved) and hands out (used), now and peak."""
        out = {}
        for key, attr in _POOL_STATS.items():
            v = check(
                "cuMemPoolGetAttribute",
                cu.cuMemPoolGetAttribute(self._pool, getattr(cu.CUmemPool_attribute, attr)),
            )
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
    check(
        "cuMemPoolSetAttribute",
        cu.cuMemPoolSetAttribute(
            pool, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, threshold
        ),
    )
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
    return int(
        check(
            "cuMemPoolGetAttribute",
            cu.cuMemPoolGetAttribute(
                pool, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
            ),
        )
    )


def set_current(handle: int) -> None:
    """Make the context ``handle`` (0: none) current on the calling thread."""
    check("cuCtxSetCurrent", cu.cuCtxSetCurrent(cu.CUcontext(handle)))


_peer_enabled: set[tuple[int, int]] = set()


def enable_peer_access(ctx: PrimaryContext, peer: PrimaryContext, op: str) -> bool:
    """Let ``ctx`` (current) reach ``peer``'s memory directly where the hardware allows it.

    Returns whether direct access is on; False means copies are staged by the driver.
    """
    key = (ctx.ordinal, peer.ordinal)
    if ctx.ordinal == peer.ordinal or key in _peer_enabled:
        return True
    can = check(
        "cuDeviceCanAccessPeer",
        cu.cuDeviceCanAccessPeer(cu.CUdevice(ctx.device_handle), cu.CUdevice(peer.device_handle)),
    )
    if not can:
        return False
    err = cu.cuCtxEnablePeerAccess(cu.CUcontext(peer.handle), 0)[0]
    if err not in (cu.CUresult.CUDA_SUCCESS, cu.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED):
        raise fail(op, err)
    _peer_enabled.add(key)
    return True
