"""`LaunchConfig`, a launch's geometry, and its checks against the device and the function.

What needs no device is checked when the config is made; the rest (the function's own thread
limit, shared memory, the device's grid limit, clusters and cooperative launch) by
`check_launch` when it is first launched with a function, and remembered for that function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from . import _driver
from .errors import KernelFault, ValidationError
from .signature import display_name

__all__ = [
    "LaunchConfig",
    "LaunchTarget",
    "check_against",
    "check_cluster",
    "check_launch",
    "choose_config",
]


class LaunchTarget(Protocol):
    """What the checks read of a kernel: a module's `Function` is one."""

    name: str
    max_threads_per_block: int
    static_shared_bytes: int
    dynamic_shared_limit: int
    device_shared_optin: int
    grid_sync: bool
    state: Any

    def raise_dynamic_shared(self, nbytes: int) -> None:
        """Let the kernel have ``nbytes`` of dynamic shared memory (above 48 KiB)."""

    def thread_limit_reason(self, threads: int) -> str:
        """Why a block of ``threads`` is past `max_threads_per_block`, with the numbers."""

    def compiled_cluster(self) -> tuple[int, int, int] | None:
        """The cluster shape the kernel was compiled with, or None."""

    def active_clusters(self, config: LaunchConfig, op: str) -> int:
        """How many clusters of ``config`` run at once."""

    def resident_blocks(self, config: LaunchConfig, op: str) -> int:
        """How many blocks of ``config`` run at once on the device."""

    def occupancy(self, block: int, shared_mem_bytes: int = 0) -> Any:
        """Blocks of this shape resident on one multiprocessor (`module.Occupancy`)."""


_MAX_GRID_X = (1 << 31) - 1
_MAX_GRID_YZ = 65535
_MAX_BLOCK = (1024, 1024, 64)
_MAX_SHARED_ARG = (1 << 32) - 1  # cuLaunchKernel's sharedMemBytes is an unsigned int
_MIN_INT32, _MAX_INT32 = -(1 << 31), (1 << 31) - 1  # the priority attribute is an int


def _dim3(value: Any, name: str, op: str) -> tuple[int, int, int]:
    if value.__class__ is int and value >= 1:  # the usual 1-D case, before the general checks
        return (value, 1, 1)
    if isinstance(value, bool):
        raise ValidationError(f"{op}: {name}={value!r} must be an int or a tuple of 1-3 ints")
    given = value
    if isinstance(value, int):
        value = (value,)
    if (
        not isinstance(value, (tuple, list))
        or not 1 <= len(value) <= 3
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise ValidationError(f"{op}: {name}={value!r} must be an int or a tuple of 1-3 ints")
    dims = tuple(value) + (1,) * (3 - len(value))
    if any(d < 1 for d in dims):
        raise ValidationError(f"{op}: {name}={given!r}: every dimension must be >= 1")
    return dims


class LaunchConfig:
    """Grid and block dimensions and dynamic shared memory of one launch; immutable.

    ``grid`` always counts blocks, clusters or not (CUDA C's ``<<<grid, block>>>`` and
    cuLaunchKernelEx's meaning). ``cluster=(x, y, z)`` groups those blocks into thread-block
    clusters (sm_90 and later: blocks of a cluster share distributed shared memory;
    ``cluster_blocks`` is their number, 0 without clusters), so the grid must be a whole
    number of clusters: ``LaunchConfig(4, 128, cluster=2)`` is 4 blocks in 2 clusters.
    Porting from cuda.core: its ``LaunchConfig`` counts the grid in clusters when a cluster
    is given (the same arguments there launch 8 blocks); multiply its grid by the cluster
    shape. ``cooperative=True`` makes a launch whose blocks all run at once, as
    ``cooperative_groups::this_grid().sync()`` needs. ``pdl=True`` (programmatic dependent
    launch, sm_90 and later) lets the kernel start while the previous kernel on the stream
    finishes: it must call ``cudaGridDependencySynchronize()`` before it reads what that kernel
    wrote. ``priority`` is the launch's scheduling priority, in the device's range of stream
    priorities (lower numbers run first). These launch through cuLaunchKernelEx; a config with
    none of them takes the plain launch path.

    Refused at construction (`ValidationError`): a dimension below 1, more than 1024 threads a
    block (or a block dimension past 1024, 1024, 64), a grid x past 2**31-1 or y/z past 65535,
    negative shared memory, a grid that is not a whole number of clusters.
    """

    __slots__ = (
        "_hash",
        "block",
        "cluster",
        "cluster_blocks",
        "cooperative",
        "dims",
        "extended",
        "grid",
        "launch_attributes",
        "pdl",
        "priority",
        "shared_mem_bytes",
        "threads_per_block",
    )
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem_bytes: int
    threads_per_block: int
    dims: tuple[int, int, int, int, int, int, int]
    cluster: tuple[int, int, int] | None
    cluster_blocks: int
    cooperative: bool
    pdl: bool
    priority: int | None
    launch_attributes: tuple[tuple[int, int, int] | None, bool, bool, int | None]
    extended: bool
    _hash: int

    def __new__(
        cls,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        shared_mem_bytes: int = 0,
        *,
        cluster: int | tuple[int, ...] | None = None,
        cooperative: bool = False,
        pdl: bool = False,
        priority: int | None = None,
    ) -> LaunchConfig:
        """A checked config; a plain one made before from the same ints is given back.

        Configs are immutable, so a launch that writes its config in the call (``s.launch(f,
        tf.LaunchConfig.flat(n), ...)``) passes its Function's last config again.
        """
        key = None
        if (
            cls is LaunchConfig
            and cluster is None
            and cooperative is False
            and pdl is False
            and priority is None
            and shared_mem_bytes.__class__ is int
            and (grid.__class__ is int or _plain(grid))
            and (block.__class__ is int or _plain(block))
        ):
            key = (grid, block, shared_mem_bytes)
            config = _made.get(key)
            if config is not None:
                return config
        self = object.__new__(cls)
        self._build(grid, block, shared_mem_bytes, cluster, cooperative, pdl, priority)
        if key is not None:
            if len(_made) >= _KEPT_CONFIGS:
                _made.clear()
            _made[key] = self
        return self

    def _build(
        self,
        grid: Any,
        block: Any,
        shared_mem_bytes: Any,
        cluster: Any,
        cooperative: Any,
        pdl: Any,
        priority: Any,
    ) -> None:
        op = "LaunchConfig"
        g = _dim3(grid, "grid", op)
        b = _dim3(block, "block", op)
        if g[0] > _MAX_GRID_X or g[1] > _MAX_GRID_YZ or g[2] > _MAX_GRID_YZ:
            raise ValidationError(
                f"{op}: grid={g} exceeds the CUDA grid limits "
                f"({_MAX_GRID_X}, {_MAX_GRID_YZ}, {_MAX_GRID_YZ})"
            )
        if any(d > m for d, m in zip(b, _MAX_BLOCK, strict=True)):
            raise ValidationError(f"{op}: block={b} exceeds the per-dimension limit {_MAX_BLOCK}")
        threads = b[0] * b[1] * b[2]
        if threads > 1024:
            raise ValidationError(f"{op}: block={b} has {threads} threads; at most 1024")
        if (
            not isinstance(shared_mem_bytes, int)
            or isinstance(shared_mem_bytes, bool)
            or not 0 <= shared_mem_bytes <= _MAX_SHARED_ARG
        ):
            raise ValidationError(
                f"{op}: {shared_mem_bytes=} must be an int from 0 to "
                f"{_MAX_SHARED_ARG} (the driver takes 32 bits)"
            )
        c = None if cluster is None else _dim3(cluster, "cluster", op)
        if c is not None and any(gd % cd for gd, cd in zip(g, c, strict=True)):
            raise ValidationError(
                f"{op}: grid={g} is not a whole number of clusters of "
                f"cluster={c} in every dimension"
            )
        if cooperative is not True and cooperative is not False:
            raise ValidationError(f"{op}: {cooperative=} must be True or False")
        if pdl is not True and pdl is not False:
            raise ValidationError(f"{op}: {pdl=} must be True or False")
        if priority is not None and (
            not isinstance(priority, int)
            or isinstance(priority, bool)
            or not _MIN_INT32 <= priority <= _MAX_INT32
        ):
            raise ValidationError(
                f"{op}: {priority=} must be None or an int (the device's range is checked at "
                "launch)"
            )
        dims = (*g, *b, shared_mem_bytes)  # as the launcher takes them
        attributes = (c, cooperative, pdl, priority)
        for name, value in (
            ("grid", g),
            ("block", b),
            ("shared_mem_bytes", shared_mem_bytes),
            ("threads_per_block", threads),
            ("dims", dims),
            ("cluster", c),
            ("cluster_blocks", 0 if c is None else c[0] * c[1] * c[2]),
            ("cooperative", cooperative),
            ("pdl", pdl),
            ("priority", priority),
            ("launch_attributes", attributes),
            ("extended", attributes != _driver.PLAIN_ATTRIBUTES),
            ("_hash", hash((dims, attributes))),
        ):
            object.__setattr__(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_config, (self.grid, self.block, self.shared_mem_bytes, *self.launch_attributes))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("LaunchConfig is immutable")

    @classmethod
    def flat(cls, threads: int, block: int = 256, shared_mem_bytes: int = 0) -> LaunchConfig:
        """A 1-D launch covering ``threads`` threads with ``block`` threads a block.

        ``threads`` = 0 is refused: a launch of no threads is a bug the driver would also refuse.

        Args:
            threads: The threads to cover, an int >= 1; the grid is rounded up to whole
                blocks, so the kernel checks its index against the count.
            block: Threads a block, an int from 1 to 1024.
            shared_mem_bytes: Dynamic shared memory a block, in bytes.

        Returns:
            The config: ``ceil(threads / block)`` blocks of ``block`` threads.

        Raises:
            ValidationError: ``threads`` or ``block`` is not an int >= 1, or the config is
                refused as `LaunchConfig` refuses it (a block past 1024 threads, a grid past
                2**31-1 blocks, negative shared memory).
        """
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ValidationError(f"LaunchConfig.flat: {threads=} must be an int >= 1")
        if not isinstance(block, int) or isinstance(block, bool) or block < 1:
            raise ValidationError(f"LaunchConfig.flat: {block=} must be an int >= 1")
        return cls((threads + block - 1) // block, block, shared_mem_bytes)

    @classmethod
    def auto(
        cls, function: LaunchTarget, n: int, shared_mem_bytes: int | Callable[[int], int] = 0
    ) -> LaunchConfig:
        """A 1-D launch over ``n`` threads whose block size keeps the most threads resident.

        The candidates are the kernel's thread limit and the whole warps below it; the largest
        of those with the most resident threads a multiprocessor wins (`Function.occupancy`;
        the choice cuOccupancyMaxPotentialBlockSize makes). ``shared_mem_bytes`` is the
        launch's dynamic shared memory, or a function of the block size for kernels whose
        memory grows with it.

        Args:
            function: A `Function` of a module (a `NumbaKernel`'s specialization is one).
            n: The threads to cover, an int >= 1.
            shared_mem_bytes: Dynamic shared memory a block in bytes, or a function of the
                block size giving it.

        Returns:
            A plain 1-D config of ``ceil(n / block)`` blocks.

        Raises:
            ValidationError: ``function`` is not a module's Function, ``n`` is not an int >= 1,
                ``shared_mem_bytes`` (or what it returns) is not an int >= 0, no block size
                fits the kernel's shared memory, or the grid would pass 2**31-1 blocks.
            RuntimeStateError: The function's session is closed or used from another thread.
            KernelFault: A kernel fault has stopped the session.
        """
        op = "LaunchConfig.auto"
        _check_function(function, op)  # a NumbaKernel has one a specialization
        return choose_config(function, n, shared_mem_bytes, op)

    @classmethod
    def resident(
        cls, function: LaunchTarget, block: int | tuple[int, ...], shared_mem_bytes: int = 0
    ) -> LaunchConfig:
        """A cooperative launch of as many blocks as run at once on the device (1-D grid).

        The grid a kernel that synchronizes the whole grid (``this_grid().sync()``, numba's
        ``cuda.cg.this_grid().sync()``) can have: blocks a multiprocessor times their count.

        Args:
            function: A `Function` of a module (a `NumbaKernel`'s specialization is one).
            block: Threads a block, an int or a tuple of 1 to 3 ints.
            shared_mem_bytes: Dynamic shared memory a block, in bytes.

        Returns:
            A config with ``cooperative=True`` and the largest 1-D grid that is resident at
                once on the device.

        Raises:
            ValidationError: ``function`` is not a module's Function, ``block`` or
                ``shared_mem_bytes`` is refused (by `LaunchConfig`, or past the kernel's
                thread limit or the device's shared memory), or no such block fits on the
                device.
            RuntimeStateError: The function's session is closed or used from another thread.
            KernelFault: A kernel fault has stopped the session.
        """
        op = "LaunchConfig.resident"
        _check_function(function, op)
        function.state.check_use(op)
        probe = cls(1, block, shared_mem_bytes)
        check_against(probe, function, op)  # the shape alone: a grid-sync kernel's too
        try:
            blocks = function.resident_blocks(probe, op)
        except KernelFault as exc:
            raise function.state.record_fault(exc) from None
        if blocks < 1:
            raise ValidationError(
                f"{op}: no block of block={probe.block} with "
                f"shared_mem_bytes={shared_mem_bytes} of "
                f"{display_name(function.name)!r} fits on this device"
            )
        return cls(blocks, block, shared_mem_bytes, cooperative=True)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, LaunchConfig)
            and self.dims == other.dims
            and self.launch_attributes == other.launch_attributes
        )

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        extra = ""
        if self.cluster is not None:  # the grid counts blocks: say how many make the clusters
            blocks = self.grid[0] * self.grid[1] * self.grid[2]
            extra = (
                f", cluster={self.cluster}; {blocks} blocks in "
                f"{blocks // self.cluster_blocks} clusters"
            )
        if self.cooperative:
            extra += ", cooperative=True"
        if self.pdl:
            extra += ", pdl=True"
        if self.priority is not None:
            extra += f", priority={self.priority}"
        return (
            f"LaunchConfig(grid={self.grid}, block={self.block}, "
            f"shared_mem_bytes={self.shared_mem_bytes}{extra})"
        )


def _check_function(function: Any, op: str) -> None:
    """Refuse what is not a module's `Function` (which knows its limits and occupancy).

    Asked of the object, not its class: `tenferro.module` sits above this module.
    """
    if not callable(getattr(function, "resident_blocks", None)):
        raise ValidationError(
            f"{op}: function must be a Function of a module, got {type(function).__name__}"
        )


_KEPT_CONFIGS = 4096  # plain configs kept by their arguments (then it starts again)
_made: dict[tuple, LaunchConfig] = {}


def _plain(dims: Any) -> bool:
    """An int or a tuple of ints, none a bool: arguments that name one config as a key."""
    cls = dims.__class__
    return cls is int or (cls is tuple and all(d.__class__ is int for d in dims))


def _config(
    grid: Any,
    block: Any,
    shared_mem_bytes: int,
    cluster: Any,
    cooperative: bool,
    pdl: bool = False,
    priority: int | None = None,
) -> LaunchConfig:
    """`LaunchConfig` from its fields, for pickle and copy."""
    return LaunchConfig(
        grid,
        block,
        shared_mem_bytes,
        cluster=cluster,
        cooperative=cooperative,
        pdl=pdl,
        priority=priority,
    )


def check_against(config: LaunchConfig, fn: LaunchTarget, op: str) -> None:
    """Check ``config`` against the function's and device's limits; raise shared memory if needed.

    ``fn`` provides ``max_threads_per_block``, ``static_shared_bytes``, ``dynamic_shared_limit``
    (what is currently allowed), ``device_shared_optin`` and ``raise_dynamic_shared(n)``.
    """
    if config.threads_per_block > fn.max_threads_per_block:
        raise ValidationError(
            f"{op}: block={config.block} has {config.threads_per_block} threads but "
            f"{fn.name!r} allows at most {fn.max_threads_per_block}: "
            f"{fn.thread_limit_reason(config.threads_per_block)}"
        )
    dyn = config.shared_mem_bytes
    if dyn > fn.dynamic_shared_limit:
        optin = fn.device_shared_optin - fn.static_shared_bytes
        if dyn > optin:
            raise ValidationError(
                f"{op}: shared_mem_bytes={dyn} exceeds what {fn.name!r} can have on this device "
                f"({optin} bytes dynamic beside {fn.static_shared_bytes} static)"
            )
        fn.raise_dynamic_shared(dyn)


def check_cluster(config: LaunchConfig, fn: LaunchTarget, op: str) -> None:
    """A config's cluster against the kernel's compiled one and the device, the grid aside.

    What `check_launch` asks of a cluster before the driver is asked how many fit, and what
    `Function.max_active_clusters` asks before it asks.
    """
    compiled = fn.compiled_cluster()
    if compiled is not None and config.cluster is not None and config.cluster != compiled:
        raise ValidationError(
            f"{op}: cluster={config.cluster} but {display_name(fn.name)!r} was compiled "
            f"with __cluster_dims__{compiled}; give that cluster or none"
        )
    if config.cluster is None:
        return
    ctx = fn.state.context
    if not ctx.attribute("CLUSTER_LAUNCH"):
        major, minor = ctx.compute_capability
        raise ValidationError(
            f"{op}: cluster={config.cluster} needs thread-block clusters "
            f"(sm_90 or later); this device is sm_{major}{minor}"
        )
    if config.cluster_blocks > 16:
        raise _cluster_cannot_run(config, fn, op)


def _cluster_cannot_run(config: LaunchConfig, fn: LaunchTarget, op: str) -> ValidationError:
    return ValidationError(
        f"{op}: clusters of {config.cluster_blocks} blocks of block={config.block} with "
        f"shared_mem_bytes={config.shared_mem_bytes} cannot run {display_name(fn.name)!r} on "
        "this device: a cluster's blocks must fit on one group of multiprocessors at once "
        "(at most 8 blocks portably, up to 16 on sm_90, with their shared memory)"
    )


def check_launch(config: LaunchConfig, fn: LaunchTarget, op: str) -> None:
    """`check_against`, and clusters and grid-wide sync against the device and the kernel.

    ``fn`` provides also ``compiled_cluster()``, ``grid_sync``, ``active_clusters(config, op)``,
    ``resident_blocks(config, op)`` and ``state.context`` (its device's attributes).
    """
    check_against(config, fn, op)
    check_cluster(config, fn, op)
    name = display_name(fn.name)
    compiled = fn.compiled_cluster()
    if compiled is not None and any(g % c for g, c in zip(config.grid, compiled, strict=True)):
        raise ValidationError(
            f"{op}: grid={config.grid} is not a whole number of the "
            f"clusters {compiled} that {name!r} was compiled with"
        )
    if fn.grid_sync and not config.cooperative:
        raise ValidationError(
            f"{op}: {name!r} synchronizes the whole grid; launch it with "
            "LaunchConfig(..., cooperative=True) (LaunchConfig.resident "
            "gives the largest such grid)"
        )
    if not config.extended:
        return
    ctx = fn.state.context
    if config.cluster is not None and not fn.active_clusters(config, op):
        raise _cluster_cannot_run(config, fn, op)
    if config.pdl and ctx.compute_capability < (9, 0):
        major, minor = ctx.compute_capability
        raise ValidationError(
            f"{op}: pdl=True needs programmatic dependent launch (sm_90 or later); this device "
            f"is sm_{major}{minor}"
        )
    if config.priority is not None:
        lowest, highest = ctx.stream_priority_range
        if not highest <= config.priority <= lowest:
            raise ValidationError(
                f"{op}: priority={config.priority} is out of this device's range: {highest} "
                f"(the highest) to {lowest} (the lowest)"
            )
    if config.cooperative:
        if not ctx.attribute("COOPERATIVE_LAUNCH"):
            raise ValidationError(
                f"{op}: cooperative=True: this device cannot launch cooperatively"
            )
        blocks = config.grid[0] * config.grid[1] * config.grid[2]
        most = fn.resident_blocks(config, op)
        if blocks > most:
            raise ValidationError(
                f"{op}: cooperative grid={config.grid} has {blocks} blocks but at most "
                f"{most} of block={config.block} with shared_mem_bytes="
                f"{config.shared_mem_bytes} run at once on this device; every block of a "
                "cooperative launch must (LaunchConfig.resident gives the largest grid)"
            )


def choose_config(
    fn: LaunchTarget, n: int, shared_mem_bytes: int | Callable[[int], int], op: str
) -> LaunchConfig:
    """`LaunchConfig.auto` for ``fn``: what `check_against` reads, and ``fn.occupancy``."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValidationError(f"{op}: {n=} must be an int >= 1")
    if callable(shared_mem_bytes):
        smem_for = shared_mem_bytes
    elif (
        isinstance(shared_mem_bytes, int)
        and not isinstance(shared_mem_bytes, bool)
        and shared_mem_bytes >= 0
    ):

        def smem_for(block: int) -> int:
            return shared_mem_bytes
    else:
        raise ValidationError(
            f"{op}: {shared_mem_bytes=} must be an int >= 0 or a function of the block size"
        )
    most_threads = fn.max_threads_per_block
    most_shared = fn.device_shared_optin - fn.static_shared_bytes
    best, best_resident, too_big = None, 0, None
    for whole_warps in range(-(-most_threads // 32) * 32, 0, -32):  # as CUDA's own search
        block = min(most_threads, whole_warps)
        smem = smem_for(block)
        if not isinstance(smem, int) or isinstance(smem, bool) or smem < 0:
            raise ValidationError(
                f"{op}: shared_mem_bytes({block}) returned {smem!r}; it must be an int >= 0"
            )
        if smem > most_shared:
            too_big = too_big or (block, smem)
            continue
        resident = fn.occupancy(block, smem).blocks_per_multiprocessor * block
        if resident > best_resident:
            best, best_resident = (block, smem), resident
    if best is None:
        detail = (
            f": shared_mem_bytes({too_big[0]}) = {too_big[1]} exceeds the {most_shared} "
            f"bytes it can have"
            if too_big
            else ""
        )
        raise ValidationError(
            f"{op}: no block size lets {display_name(fn.name)!r} run on this device{detail}"
        )
    block, smem = best
    grid = -(-n // block)
    if grid > _MAX_GRID_X:
        raise ValidationError(
            f"{op}: {n=} needs {grid} blocks of {block}; the grid holds at most {_MAX_GRID_X}"
        )
    return LaunchConfig(grid, block, smem)
