"""`LaunchConfig` and its checks against the device; `BoundLaunch`, the pre-packed relaunch.

What needs no device is checked when the config is made; the rest (the function's own thread
limit, shared memory, the device's grid limit) when it is first launched with a function, and
remembered for that function. A `BoundLaunch` does every check and the packing once, in
``s.bind``; calling it is the driver call and the liveness bookkeeping, nothing else.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from . import _driver
from .errors import KernelFault, ValidationError
from .module import Function
from .numba_kernels import NumbaKernel
from .signature import display_name
from .spans import Span

__all__ = ["BoundLaunch", "LaunchConfig", "check_against", "check_launch", "choose_config",
           "launch_checked", "launchable"]

_MAX_GRID_X = (1 << 31) - 1
_MAX_GRID_YZ = 65535
_MAX_BLOCK = (1024, 1024, 64)
_MAX_SHARED_ARG = (1 << 32) - 1  # cuLaunchKernel's sharedMemBytes is an unsigned int


def _dim3(value: Any, name: str, op: str) -> tuple[int, int, int]:
    if value.__class__ is int and value >= 1:  # the usual 1-D case, before the general checks
        return (value, 1, 1)
    if isinstance(value, bool):
        raise ValidationError(f"{op}: {name}={value!r} must be an int or a tuple of 1-3 ints")
    given = value
    if isinstance(value, int):
        value = (value,)
    if not isinstance(value, (tuple, list)) or not 1 <= len(value) <= 3 or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValidationError(f"{op}: {name}={value!r} must be an int or a tuple of 1-3 ints")
    dims = tuple(value) + (1,) * (3 - len(value))
    if any(d < 1 for d in dims):
        raise ValidationError(f"{op}: {name}={given!r}: every dimension must be >= 1")
    return dims  # type: ignore[return-value]


class LaunchConfig:
    """Grid and block dimensions and dynamic shared memory of one launch; immutable.

    ``cluster=(x, y, z)`` groups blocks into thread-block clusters (sm_90 and later: blocks of
    a cluster share distributed shared memory; ``cluster_blocks`` is their number, 0 without
    clusters); ``cooperative=True`` makes a launch whose blocks all run at once, as
    ``cooperative_groups::this_grid().sync()`` needs. Both launch through cuLaunchKernelEx; a
    config with neither takes the plain launch path.

    Refused at construction (`ValidationError`): a dimension below 1, more than 1024 threads a
    block (or a block dimension past 1024, 1024, 64), a grid x past 2**31-1 or y/z past 65535,
    negative shared memory, a grid that is not a whole number of clusters.
    """

    __slots__ = ("_hash", "block", "cluster", "cluster_blocks", "cooperative", "dims",
                 "extended", "grid", "shared_mem_bytes", "threads_per_block")

    def __new__(cls, grid: int | tuple[int, ...], block: int | tuple[int, ...],
                shared_mem_bytes: int = 0, *, cluster: int | tuple[int, ...] | None = None,
                cooperative: bool = False) -> LaunchConfig:
        """A checked config; a plain one made before from the same ints is given back.

        Configs are immutable, so a launch that writes its config in the call (``s.launch(f,
        tf.LaunchConfig.flat(n), ...)``) passes its Function's last config again.
        """
        key = None
        if cls is LaunchConfig and cluster is None and cooperative is False and \
                shared_mem_bytes.__class__ is int and (grid.__class__ is int or _plain(grid)) \
                and (block.__class__ is int or _plain(block)):
            key = (grid, block, shared_mem_bytes)
            config = _made.get(key)
            if config is not None:
                return config
        self = object.__new__(cls)
        self._build(grid, block, shared_mem_bytes, cluster, cooperative)
        if key is not None:
            if len(_made) >= _KEPT_CONFIGS:
                _made.clear()
            _made[key] = self
        return self

    def _build(self, grid: Any, block: Any, shared_mem_bytes: Any, cluster: Any,
               cooperative: Any) -> None:
        op = "LaunchConfig"
        g = _dim3(grid, "grid", op)
        b = _dim3(block, "block", op)
        if g[0] > _MAX_GRID_X or g[1] > _MAX_GRID_YZ or g[2] > _MAX_GRID_YZ:
            raise ValidationError(f"{op}: grid={g} exceeds the CUDA grid limits "
                                  f"({_MAX_GRID_X}, {_MAX_GRID_YZ}, {_MAX_GRID_YZ})")
        if any(d > m for d, m in zip(b, _MAX_BLOCK, strict=True)):
            raise ValidationError(f"{op}: block={b} exceeds the per-dimension limit {_MAX_BLOCK}")
        threads = b[0] * b[1] * b[2]
        if threads > 1024:
            raise ValidationError(f"{op}: block={b} has {threads} threads; at most 1024")
        if not isinstance(shared_mem_bytes, int) or isinstance(shared_mem_bytes, bool) or \
                not 0 <= shared_mem_bytes <= _MAX_SHARED_ARG:
            raise ValidationError(f"{op}: {shared_mem_bytes=} must be an int from 0 to "
                                  f"{_MAX_SHARED_ARG} (the driver takes 32 bits)")
        c = None if cluster is None else _dim3(cluster, "cluster", op)
        if c is not None and any(gd % cd for gd, cd in zip(g, c, strict=True)):
            raise ValidationError(f"{op}: grid={g} is not a whole number of clusters of "
                                  f"cluster={c} in every dimension")
        if cooperative is not True and cooperative is not False:
            raise ValidationError(f"{op}: {cooperative=} must be True or False")
        dims = (*g, *b, shared_mem_bytes)  # as the launcher takes them
        for name, value in (("grid", g), ("block", b), ("shared_mem_bytes", shared_mem_bytes),
                            ("threads_per_block", threads), ("dims", dims), ("cluster", c),
                            ("cluster_blocks", 0 if c is None else c[0] * c[1] * c[2]),
                            ("cooperative", cooperative),
                            ("extended", c is not None or cooperative),
                            ("_hash", hash((dims, c, cooperative)))):
            object.__setattr__(self, name, value)

    def __reduce__(self) -> tuple:
        return (_config, (self.grid, self.block, self.shared_mem_bytes, self.cluster,
                          self.cooperative))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("LaunchConfig is immutable")

    @classmethod
    def flat(cls, threads: int, block: int = 256, shared_mem_bytes: int = 0) -> LaunchConfig:
        """A 1-D launch covering ``threads`` threads with ``block`` threads a block.

        ``threads`` = 0 is refused: a launch of no threads is a bug the driver would also refuse.
        """
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ValidationError(f"LaunchConfig.flat: {threads=} must be an int >= 1")
        if not isinstance(block, int) or isinstance(block, bool) or block < 1:
            raise ValidationError(f"LaunchConfig.flat: {block=} must be an int >= 1")
        return cls((threads + block - 1) // block, block, shared_mem_bytes)

    @classmethod
    def auto(cls, function: Function, n: int,
             shared_mem_bytes: int | Callable[[int], int] = 0) -> LaunchConfig:
        """A 1-D launch over ``n`` threads whose block size keeps the most threads resident.

        The candidates are the kernel's thread limit and the whole warps below it; the largest
        of those with the most resident threads a multiprocessor wins (`Function.occupancy`;
        the choice cuOccupancyMaxPotentialBlockSize makes). ``shared_mem_bytes`` is the
        launch's dynamic shared memory, or a function of the block size for kernels whose
        memory grows with it.
        """
        op = "LaunchConfig.auto"
        if type(function) is not Function:  # a NumbaKernel has one a specialization
            raise ValidationError(f"{op}: function must be a Function of a module, got "
                                  f"{type(function).__name__}")
        return choose_config(function, n, shared_mem_bytes, op)

    @classmethod
    def resident(cls, function: Function, block: int | tuple[int, ...],
                 shared_mem_bytes: int = 0) -> LaunchConfig:
        """A cooperative launch of as many blocks as run at once on the device (1-D grid).

        The grid a kernel that synchronizes the whole grid (``this_grid().sync()``, numba's
        ``cuda.cg.this_grid().sync()``) can have: blocks a multiprocessor times their count.
        """
        op = "LaunchConfig.resident"
        if type(function) is not Function:
            raise ValidationError(f"{op}: function must be a Function of a module, got "
                                  f"{type(function).__name__}")
        function.session.check_use(op)
        probe = cls(1, block, shared_mem_bytes)
        check_against(probe, function, op)  # the shape alone: a grid-sync kernel's too
        try:
            blocks = function.resident_blocks(probe, op)
        except KernelFault as exc:
            raise function.session.fault_seen(exc) from None
        if blocks < 1:
            raise ValidationError(f"{op}: no block of block={probe.block} with "
                                  f"shared_mem_bytes={shared_mem_bytes} of "
                                  f"{display_name(function.name)!r} fits on this device")
        return cls(blocks, block, shared_mem_bytes, cooperative=True)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LaunchConfig) and self.dims == other.dims and \
            self.cluster == other.cluster and self.cooperative == other.cooperative

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        extra = "" if self.cluster is None else f", cluster={self.cluster}"
        if self.cooperative:
            extra += ", cooperative=True"
        return (f"LaunchConfig(grid={self.grid}, block={self.block}, "
                f"shared_mem_bytes={self.shared_mem_bytes}{extra})")


_KEPT_CONFIGS = 4096  # plain configs kept by their arguments (then it starts again)
_made: dict[tuple, LaunchConfig] = {}


def _plain(dims: Any) -> bool:
    """An int or a tuple of ints, none a bool: arguments that name one config as a key."""
    cls = dims.__class__
    return cls is int or (cls is tuple and all(d.__class__ is int for d in dims))


def _config(grid: Any, block: Any, shared_mem_bytes: int, cluster: Any,
            cooperative: bool) -> LaunchConfig:
    """`LaunchConfig` from its fields, for pickle and copy."""
    return LaunchConfig(grid, block, shared_mem_bytes, cluster=cluster, cooperative=cooperative)


def check_against(config: LaunchConfig, fn: Any, op: str) -> None:
    """Check ``config`` against the function's and device's limits; raise shared memory if needed.

    ``fn`` provides ``max_threads_per_block``, ``static_shared_bytes``, ``dynamic_shared_limit``
    (what is currently allowed), ``device_shared_optin`` and ``raise_dynamic_shared(n)``.
    """
    if config.threads_per_block > fn.max_threads_per_block:
        raise ValidationError(
            f"{op}: block={config.block} has {config.threads_per_block} threads but "
            f"{fn.name!r} allows at most {fn.max_threads_per_block} (its registers or "
            f"__launch_bounds__)")
    dyn = config.shared_mem_bytes
    if dyn > fn.dynamic_shared_limit:
        optin = fn.device_shared_optin - fn.static_shared_bytes
        if dyn > optin:
            raise ValidationError(
                f"{op}: shared_mem_bytes={dyn} exceeds what {fn.name!r} can have on this device "
                f"({optin} bytes dynamic beside {fn.static_shared_bytes} static)")
        fn.raise_dynamic_shared(dyn)


def check_launch(config: LaunchConfig, fn: Any, op: str) -> None:
    """`check_against`, and clusters and grid-wide sync against the device and the kernel.

    ``fn`` provides also ``compiled_cluster()``, ``grid_sync``, ``active_clusters(config, op)``,
    ``resident_blocks(config, op)`` and ``session.context`` (its device's attributes).
    """
    check_against(config, fn, op)
    name = display_name(fn.name)
    compiled = fn.compiled_cluster()
    if compiled is not None:
        if config.cluster is not None and config.cluster != compiled:
            raise ValidationError(f"{op}: cluster={config.cluster} but {name!r} was compiled "
                                  f"with __cluster_dims__{compiled}; give that cluster or none")
        if any(g % c for g, c in zip(config.grid, compiled, strict=True)):
            raise ValidationError(f"{op}: grid={config.grid} is not a whole number of the "
                                  f"clusters {compiled} that {name!r} was compiled with")
    if fn.grid_sync and not config.cooperative:
        raise ValidationError(f"{op}: {name!r} synchronizes the whole grid; launch it with "
                              "LaunchConfig(..., cooperative=True) (LaunchConfig.resident "
                              "gives the largest such grid)")
    if not config.extended:
        return
    ctx = fn.session.context
    if config.cluster is not None:
        if not ctx.attribute("CLUSTER_LAUNCH"):
            major, minor = ctx.compute_capability
            raise ValidationError(f"{op}: cluster={config.cluster} needs thread-block clusters "
                                  f"(sm_90 or later); this device is sm_{major}{minor}")
        if config.cluster_blocks > 16 or not fn.active_clusters(config, op):
            raise ValidationError(
                f"{op}: clusters of {config.cluster_blocks} blocks of block={config.block} with "
                f"shared_mem_bytes={config.shared_mem_bytes} cannot run {name!r} on this "
                "device: a cluster's blocks must fit on one group of multiprocessors at once "
                "(at most 8 blocks portably, up to 16 on sm_90, with their shared memory)")
    if config.cooperative:
        if not ctx.attribute("COOPERATIVE_LAUNCH"):
            raise ValidationError(f"{op}: cooperative=True: this device cannot launch "
                                  "cooperatively")
        blocks = config.grid[0] * config.grid[1] * config.grid[2]
        most = fn.resident_blocks(config, op)
        if blocks > most:
            raise ValidationError(
                f"{op}: cooperative grid={config.grid} has {blocks} blocks but at most "
                f"{most} of block={config.block} with shared_mem_bytes="
                f"{config.shared_mem_bytes} run at once on this device; every block of a "
                "cooperative launch must (LaunchConfig.resident gives the largest grid)")


def choose_config(fn: Any, n: int, shared_mem_bytes: int | Callable[[int], int],
                  op: str) -> LaunchConfig:
    """`LaunchConfig.auto` for ``fn``: what `check_against` reads, and ``fn.occupancy``."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValidationError(f"{op}: {n=} must be an int >= 1")
    if callable(shared_mem_bytes):
        smem_for = shared_mem_bytes
    elif isinstance(shared_mem_bytes, int) and not isinstance(shared_mem_bytes, bool) and \
            shared_mem_bytes >= 0:
        def smem_for(block: int) -> int:
            return shared_mem_bytes
    else:
        raise ValidationError(f"{op}: {shared_mem_bytes=} must be an int >= 0 or a function of "
                              "the block size")
    most_threads = fn.max_threads_per_block
    most_shared = fn.device_shared_optin - fn.static_shared_bytes
    best, best_resident, too_big = None, 0, None
    for whole_warps in range(-(-most_threads // 32) * 32, 0, -32):  # as CUDA's own search
        block = min(most_threads, whole_warps)
        smem = smem_for(block)
        if not isinstance(smem, int) or isinstance(smem, bool) or smem < 0:
            raise ValidationError(f"{op}: shared_mem_bytes({block}) returned {smem!r}; it must "
                                  "be an int >= 0")
        if smem > most_shared:
            too_big = too_big or (block, smem)
            continue
        resident = fn.occupancy(block, smem).blocks_per_multiprocessor * block
        if resident > best_resident:
            best, best_resident = (block, smem), resident
    if best is None:
        detail = (f": shared_mem_bytes({too_big[0]}) = {too_big[1]} exceeds the {most_shared} "
                  f"bytes it can have" if too_big else "")
        raise ValidationError(f"{op}: no block size lets {display_name(fn.name)!r} run on this "
                              f"device{detail}")
    block, smem = best
    grid = -(-n // block)
    if grid > _MAX_GRID_X:
        raise ValidationError(f"{op}: {n=} needs {grid} blocks of {block}; the grid holds at "
                              f"most {_MAX_GRID_X}")
    return LaunchConfig(grid, block, smem)


_get_ident = threading.get_ident


def launchable(s: Any, fn: Any, config: Any, args: list | tuple, op: str) -> Function:
    """The Function to launch, with the session, fn, config and args checked."""
    s.check_use(op)
    if not isinstance(args, (list, tuple)):
        raise ValidationError(f"{op}: args must be a list or tuple of kernel arguments, got "
                              f"{type(args).__name__}")
    if type(fn) is not Function:
        if type(fn) is not NumbaKernel:
            raise ValidationError(f"{op}: fn must be a Function of this session, got "
                                  f"{type(fn).__name__}")
        if fn.session is not s:
            raise ValidationError(f"{op}: fn is a NumbaKernel of another session")
        fn = fn.function_for(args, op)
    if fn.session is not s:
        raise ValidationError(f"{op}: fn is a Function of another session")
    if type(config) is not LaunchConfig:  # before the set lookup: a list would not hash
        raise ValidationError(f"{op}: config must be a LaunchConfig, got "
                              f"{type(config).__name__}")
    if config not in fn.checked_configs:
        check_launch(config, fn, op)
        fn.checked_configs.add(config)
    if fn.record_config is not config:
        fn.use_config(config, s.stream)
    return fn


def launch_checked(s: Any, fn: Any, config: Any, args: list | tuple) -> None:
    """`launch` when anything is new: a function, a config, a capture, another thread."""
    op = "session.launch"
    fn = launchable(s, fn, config, args, op)
    param_block = fn.param_block
    replaced = param_block.last_spans
    spans = param_block.pack(args, s, op)
    if s.ordering.pending:
        s.ordering.flush(op)
    timed = s.active_timeline  # set only inside s.timeline(), which keeps launches here
    if timed is not None:
        timed.before_launch(op)
    err = (_driver.launcher(True) if config.extended else s.launcher)(fn.record_address)
    if err:
        _driver.raise_launch_error(err, op)
    if timed is not None:
        timed.after_launch(fn.name, config, op)
    live = s.liveness
    if replaced and replaced is not spans:
        live.hold(replaced)
    live.hold(spans)  # always: a capture's graph takes its owners from here
    s.recent_launches.append(fn.name)
    if not live.capturing:  # a captured launch runs when its graph does
        s.launch_count += 1


class BoundLaunch:
    """One kernel, one config, one argument list: checked and packed once by ``s.bind``.

    ``bound()`` enqueues it on the session's stream; ``bound.update(i, arg)`` re-checks and
    repacks argument ``i`` alone. Holds its spans (and so their owners) while it exists, and
    the session holds it until the stream has passed each launch. Refuses use from another
    thread, after the session closed, and after a kernel fault.
    """

    __slots__ = (
        "__weakref__",
        "_held_generation",
        "_launch",
        "_name",
        "_param_block",
        "_record",
        "_record_address",
        "args",
        "config",
        "fn",
        "session",
        "spans",
    )

    def __init__(self, session: Any, fn: Any, config: LaunchConfig, args: list | tuple,
                 op: str) -> None:
        self.session = session
        self.fn = fn
        self.config = config
        self._param_block = fn.param_block.fresh()
        self.args = list(args)
        self.spans = self._param_block.pack(self.args, session, op)
        self._record = _driver.launch_record(fn.handle, config.dims, session.stream,
                                             self._param_block.address, config.cluster,
                                             config.cooperative)
        self._record_address = self._record.address
        self._name = fn.name
        self._launch = _driver.launcher(config.extended)
        self._held_generation = -1  # the session's holds generation this launch is held in

    def __call__(self) -> None:
        """Enqueue the launch on the session's stream."""
        s = self.session
        try:
            if not s.fast_path_ok or _get_ident() != s.thread:
                self._call_checked()
                return
            if s.ordering.pending:
                s.ordering.flush("bound_launch")
            err = self._launch(self._record_address)
            if err:
                _driver.raise_launch_error(err, "bound_launch")
            s.recent_launches.append(self._name)
            s.launch_count += 1
            live = s.liveness
            if self._held_generation != live.generation:  # once per holds list, not per call
                self._held_generation = live.generation  # before: a fence in hold moves it on
                live.hold(self)
                self._launch = _driver.launcher(self.config.extended)  # @njit once built
        except KernelFault as exc:  # the launch or a fence query saw a fault
            raise s.fault_seen(exc) from None

    def _call_checked(self) -> None:
        s = self.session
        s.check_use("bound_launch")
        if s.ordering.pending:
            s.ordering.flush("bound_launch")
        timed = s.active_timeline
        if timed is not None:
            timed.before_launch("bound_launch")
        err = self._launch(self._record_address)
        if err:
            _driver.raise_launch_error(err, "bound_launch")
        if timed is not None:
            timed.after_launch(self._name, self.config, "bound_launch")
        s.recent_launches.append(self._name)
        live = s.liveness
        if not live.capturing:  # a captured launch runs when its graph does
            s.launch_count += 1
        live.hold(self)  # always: during a capture the graph takes its owners from them

    def update(self, index: int, arg: Any) -> None:
        """Replace argument ``index``; only that slot is checked (and overlaps against the rest).

        A refused update changes nothing: the packed bytes, ``args`` and ``spans`` stay those of
        the launch as it was bound. The spans replaced stay held by the session until the
        stream has passed the launches that used them.
        """
        from .args import check_overlaps

        op = "bound_launch.update"
        s = self.session
        s.check_use(op)
        if not isinstance(index, int) or isinstance(index, bool) or \
                not 0 <= index < len(self.args):
            raise ValidationError(f"{op}: {index=} is out of range for {len(self.args)} "
                                  "argument(s)")
        param_block = self._param_block
        saved = param_block.snapshot()
        try:
            span = param_block.pack_slot(index, arg, s, op)
            args = list(self.args)
            args[index] = arg
            spans = [sp for sp in map(_span_of, args) if sp is not None]
            if span is not None and len(spans) > 1:
                check_overlaps(spans, args, op)
        except BaseException:
            param_block.restore(saved)
            raise
        s.liveness.hold(self.spans)  # a launch already enqueued may still read the old ones
        self.args, self.spans = args, spans

    def __repr__(self) -> str:
        return f"BoundLaunch({display_name(self.fn.name)}, {self.config})"


def _span_of(a: Any) -> Any:
    """The span an argument passes, or None for a value."""
    from .args import KernelArg

    if type(a) is KernelArg:
        return a.span
    return a if isinstance(a, Span) else None
