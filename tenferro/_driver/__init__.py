"""The only package that calls ``cuda.bindings``; this module gathers what crosses its seam.

Every call is checked: a failing CUresult becomes a `BackendError` naming the operation and the
CUresult; an asynchronous kernel fault becomes a `KernelFault`. Handles cross this seam as plain
``int``s; nothing above it sees a binding object, and a launch's result code is an int that only
`raise_launch_error` reads. ``__all__`` lists exactly what the other modules use, and the work is
in private modules, each importing only ones listed before it: ``results`` (the binding, result
checking), ``devices`` (cuInit, device queries), ``context`` (primary contexts, pools, peer
access), ``streams`` (streams, events), ``memory`` (frees, copies), ``fast_launch`` (launch
records, the launchers, the compiled fast calls), ``modules`` (modules and their functions),
``graphs`` (capture and replay) and ``nvrtc`` (compiling CUDA C, which needs no driver).
"""

from .context import (
    PrimaryContext,
    default_pool_release_threshold,
    enable_peer_access,
    mem_get_info,
    set_current,
)
from .devices import (
    FORKED_WHY,
    device_count,
    device_summary,
    driver_version,
    ensure_init,
    forked_child,
)
from .fast_launch import (
    PLAIN_ATTRIBUTES,
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
    capture_last_node,
    graph_destroy,
    graph_node_count,
)
from .memory import (
    MEMORY_DEVICE,
    MEMORY_HOST,
    mem_free,
    mem_free_async,
    memcpy_dtod_async,
    memcpy_dtoh_async,
    memcpy_htod_async,
    memcpy_peer_async,
    memset_d8_async,
    pointer_info,
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
    tensor_map_encode,
)
from .nvrtc import cuda_include_dirs, nvrtc_compile, nvrtc_version
from .results import raise_launch_error
from .streams import (
    context_synchronize,
    event_create,
    event_destroy,
    event_elapsed_ms,
    event_query,
    event_record,
    event_synchronize,
    stream_context,
    stream_create,
    stream_destroy,
    stream_is_capturing,
    stream_is_non_blocking,
    stream_synchronize,
    stream_wait_event,
)

__all__ = [  # what the other modules use; nothing else crosses the seam
    "FORKED_WHY",
    "ExecutableGraph",
    "ExtendedLaunchRecord",
    "LaunchRecord",
    "MEMORY_DEVICE",
    "MEMORY_HOST",
    "PLAIN_ATTRIBUTES",
    "PrimaryContext",
    "build_fast_calls",
    "capture_begin",
    "capture_end",
    "capture_last_node",
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
    "forked_child",
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
    "tensor_map_encode",
    "wait_for_stream",
]
