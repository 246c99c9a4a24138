"""Launch records and the launchers that read them, down to a compiled (@njit) call into libcuda.

A launch's driver arguments are written once into a record: a `LaunchRecord` (ten native words,
for cuLaunchKernel) or, with thread-block clusters or a cooperative launch, an
`ExtendedLaunchRecord` (cuLaunchKernelEx). A launcher takes the record's address, one int, and
returns the CUresult as an int; `raise_launch_error` reads it. Launches and the event waits that
order a stream after another's (`wait_for_stream`) start on cuda.bindings and switch to numba
@njit functions calling libcuda once the process is hot.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from .results import cu, fail

__all__ = [
    "PLAIN_ATTRIBUTES",
    "ExtendedLaunchRecord",
    "LaunchRecord",
    "build_fast_calls",
    "launch_config",
    "launch_record",
    "launcher",
    "wait_for_stream",
]


# Launches and producer-stream waits go through cuda.bindings until numba has compiled two small
# @njit functions that call libcuda's C entry points (about a microsecond less a call). numba's
# CPU target takes seconds to start, so a process pays for it only once it is hot: the build
# runs in a background thread after HOT_CALLS calls (or at once: `build_fast_calls`), and the
# calls switch over when it is done. TENFERRO_FAST_LAUNCH=0 never builds them.
HOT_CALLS = 4096
_fast_launch: Any = None
_fast_wait: Any = None
_calls = 0
_build_lock = threading.Lock()
_build_thread: threading.Thread | None = None
_record_calls: dict[int, tuple] = {}  # LaunchRecord address -> its cuLaunchKernel arguments
_launch_kernel: Any = cu.cuLaunchKernel if cu is not None else None


class LaunchRecord:
    """One launch's driver arguments in ten native words, which the launcher reads itself.

    (function, grid x/y/z, block x/y/z, dynamic shared bytes, stream, parameter-array address),
    written once; `address` is what the launcher takes, so the hot call passes a single int.
    """

    __slots__ = ("__weakref__", "_call", "_words", "address")

    def __init__(self, func: int, dims: tuple, stream: int, params: int) -> None:
        import ctypes

        self._words = (ctypes.c_uint64 * 10)(func, *dims, stream, params)
        self.address = ctypes.addressof(self._words)
        self._call = (cu.CUfunction(func), *dims, cu.CUstream(stream), params, 0)
        _record_calls[self.address] = self._call

    def __del__(self) -> None:
        try:  # a newer record at the same address keeps its entry
            if _record_calls.get(self.address) is self._call:
                del _record_calls[self.address]
        except Exception:  # never raise from a finaliser (at exit the dict may be gone)
            pass


def launch_config(dims: tuple, stream: int, attributes: tuple) -> Any:
    """The CUlaunchConfig of cuLaunchKernelEx: ``dims`` (grid, block, shared memory), attributes.

    ``attributes`` is (cluster, cooperative, pdl, priority), as `LaunchConfig` keeps them.
    """
    cluster, cooperative, pdl, priority = attributes
    config = cu.CUlaunchConfig()
    (
        config.gridDimX,
        config.gridDimY,
        config.gridDimZ,
        config.blockDimX,
        config.blockDimY,
        config.blockDimZ,
        config.sharedMemBytes,
    ) = dims
    config.hStream = cu.CUstream(stream)
    attrs = []
    if cluster is not None:
        a = cu.CUlaunchAttribute()
        a.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = cluster
        attrs.append(a)
    if cooperative:
        a = cu.CUlaunchAttribute()
        a.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        a.value.cooperative = 1
        attrs.append(a)
    if pdl:
        a = cu.CUlaunchAttribute()
        a.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        a.value.programmaticStreamSerializationAllowed = 1
        attrs.append(a)
    if priority is not None:
        a = cu.CUlaunchAttribute()
        a.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PRIORITY
        a.value.priority = priority
        attrs.append(a)
    config.attrs = attrs
    config.numAttrs = len(attrs)
    return config


class ExtendedLaunchRecord:
    """A launch with launch attributes (clusters, cooperative, PDL, priority): cuLaunchKernelEx.

    Read by `launcher(extended=True)` only; the plain launchers, the @njit one included, never
    see it (its address is not among theirs).
    """

    __slots__ = ("__weakref__", "_call", "address")

    def __init__(
        self,
        func: int,
        dims: tuple,
        stream: int,
        params: int,
        attributes: tuple,
    ) -> None:
        self._call = (
            launch_config(dims, stream, attributes),
            cu.CUfunction(func),
            params,
            0,
        )
        self.address = id(self._call)
        _extended_calls[self.address] = self._call

    def __del__(self) -> None:
        try:
            if _extended_calls.get(self.address) is self._call:
                del _extended_calls[self.address]
        except Exception:  # never raise from a finaliser (at exit the dict may be gone)
            pass


_extended_calls: dict[int, tuple] = {}  # ExtendedLaunchRecord address -> its call's arguments


def launch_record(
    func: int, dims: tuple, stream: int, params: int, attributes: tuple
) -> LaunchRecord | ExtendedLaunchRecord:
    """The record a launcher takes: extended (cuLaunchKernelEx) where attributes are set.

    ``attributes`` is (cluster, cooperative, pdl, priority); ``launcher(extended=True)`` reads
    an extended record, as `LaunchConfig.extended` says.
    """
    if attributes != PLAIN_ATTRIBUTES:
        return ExtendedLaunchRecord(func, dims, stream, params, attributes)
    return LaunchRecord(func, dims, stream, params)


# No cluster, not cooperative, no PDL, no priority: a plain cuLaunchKernel.
PLAIN_ATTRIBUTES: tuple[None, bool, bool, None] = (None, False, False, None)


def _extended_launcher(record: int) -> int:
    return int(cu.cuLaunchKernelEx(*_extended_calls[record])[0])


def launcher(extended: bool = False) -> Any:
    """The kernel launcher now: ``f(record_address) -> CUresult as int`` (0: success).

    For a `LaunchRecord`, the @njit launcher once it is built, else the cuda.bindings one,
    which hands over to it as soon as it is ready (callers that keep a launcher ask again at
    their next synchronize); for an `ExtendedLaunchRecord` (``extended``), cuLaunchKernelEx.
    `raise_launch_error` makes the exception.
    """
    if extended:
        return _extended_launcher
    return _fast_launch or _bindings_launcher


def build_fast_calls(wait: bool = True) -> bool:
    """Build the @njit launcher and stream wait now (``wait``) or in the background.

    True when they are ready: not with ``TENFERRO_FAST_LAUNCH=0``, without numba, or where
    libcuda cannot be opened by name.
    """
    global _build_thread
    if os.environ.get("TENFERRO_FAST_LAUNCH", "1") != "0":
        with _build_lock:
            if _build_thread is None:
                import atexit

                _build_thread = threading.Thread(
                    target=_build, name="tenferro-fast-calls", daemon=True
                )
                _build_thread.start()
                atexit.register(_build_thread.join)  # never end the process mid-compile
        if wait:
            _build_thread.join()
    return _fast_launch is not None


def _build() -> None:
    global _fast_launch, _fast_wait
    wait, launch = _make_njit_wait(), _make_njit_launcher()
    _fast_wait = wait
    _fast_launch = launch


def _hot_call() -> None:
    global _calls
    _calls += 1
    if _calls == HOT_CALLS:
        build_fast_calls(wait=False)


def _bindings_launcher(record: int) -> int:
    fast = _fast_launch
    if fast is not None:
        return fast(record)
    if _calls < HOT_CALLS:
        _hot_call()
    return int(_launch_kernel(*_record_calls[record])[0])


def wait_for_stream(waiter: int, producer: int, event: int, op: str) -> None:
    """Record ``event`` on ``producer`` and make ``waiter`` wait for it (host unblocked).

    One @njit call into libcuda once the fast calls are built (about a microsecond, where the
    two binding calls cost three).
    """
    fast = _fast_wait
    if fast is not None:
        err = fast(waiter, producer, event)
    else:
        if _calls < HOT_CALLS:
            _hot_call()
        err = _bindings_wait(waiter, producer, event)
    if err:
        raise fail(op, err)


def _make_njit_launcher() -> Any:
    try:
        import ctypes

        from numba import njit, types
        from numba.core.extending import intrinsic

        lib = ctypes.CDLL("libcuda.so.1")
        c_launch = lib.cuLaunchKernel
        c_launch.restype = ctypes.c_int
        c_launch.argtypes = [
            ctypes.c_uint64,
            *([ctypes.c_uint] * 7),
            ctypes.c_uint64,
            ctypes.c_uint64,
            ctypes.c_uint64,
        ]

        @intrinsic
        def words(typingctx, addr):  # pragma: no cover - compiled by numba
            sig = types.CPointer(types.uint64)(types.int64)

            def codegen(context, builder, signature, args):
                return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

            return sig, codegen

        def launch(record):  # pragma: no cover - compiled by numba
            w = words(record)
            return c_launch(w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8], w[9], 0)

        return njit(types.int32(types.int64), cache=False)(launch)
    except Exception:  # no numba, or no libcuda under that name: the bindings path works
        return None


def _bindings_wait(waiter: int, producer: int, event: int) -> int:
    err = cu.cuEventRecord(cu.CUevent(event), cu.CUstream(producer))[0]
    if err:
        return int(err)
    return int(cu.cuStreamWaitEvent(cu.CUstream(waiter), cu.CUevent(event), 0)[0])


def _make_njit_wait() -> Any:
    try:
        import ctypes

        from numba import njit, types

        lib = ctypes.CDLL("libcuda.so.1")
        c_record, c_wait = lib.cuEventRecord, lib.cuStreamWaitEvent
        c_record.restype = c_wait.restype = ctypes.c_int
        c_record.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
        c_wait.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint]

        def wait(waiter, producer, event):  # pragma: no cover - compiled by numba
            err = c_record(event, producer)
            if err != 0:
                return err
            return c_wait(waiter, event, 0)

        return njit(types.int32(types.uint64, types.uint64, types.uint64), cache=False)(wait)
    except Exception:  # no numba, or no libcuda under that name: the bindings path works
        return None
