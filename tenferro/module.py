"""`Module` and `Function`: loaded PTX or CUBIN images of a session, and their kernels.

Sources are compiled by `compiler.compile_cuda` (``s.compile``); `load_ptx_module` and
`load_cubin_module` take images made elsewhere. A Function knows its parameters (from the
compile, the PTX, or the driver), its limits, and the launch record of its last config.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import _driver
from .compiler import compile_cuda
from .entries import find_entry
from .errors import BackendError, KernelFault, ValidationError
from .launch_config import LaunchConfig, check_against, check_cluster
from .signature import Signature, display_name, from_driver_layout, kernels_html, parse_ptx
from .spans import DeviceBytes, TensorMut
from .variables import Variable, listed, module_variable, ptx_variables

if TYPE_CHECKING:  # args is imported where a Function is made (see Function.__init__)
    from .args import ParamBlockBase

__all__ = ["Function", "KernelAttributes", "Module", "Occupancy"]


DEFAULT_SHARED_LIMIT = 48 * 1024  # dynamic shared memory a launch has without opting in
_NO_CONFIG = object()  # Function.last_config before any config was checked
_UNREAD = object()  # a fact the driver has not been asked for yet
_PTX_VERSION = re.compile(r"^\s*\.version\s+(\d+)\.(\d+)", re.M)


class Module:
    """A loaded PTX or CUBIN image in a session's context; unloaded when the session closes.

    ``signatures`` are the parameter lists tenferro knows (from PTX, refined by CUDA C source);
    ``variables`` its ``__device__`` and ``__constant__`` variables as far as known (none for a
    CUBIN); ``compile_log`` is NVRTC's log of a compile that succeeded (its warnings), or "".
    """

    __slots__ = (
        "__weakref__",
        "_functions",
        "compile_log",
        "handle",
        "kind",
        "lowered_names",
        "signatures",
        "state",
        "variables",
    )
    state: Any
    compile_log: str
    variables: dict[str, Variable]
    kind: str
    signatures: dict[str, Signature]
    lowered_names: dict[str, str]
    _functions: dict[str, Function]
    handle: int

    @property
    def session(self) -> Any:
        """The `tenferro.Session` this module belongs to."""
        return self.state.session

    def __init__(
        self,
        state: Any,
        image: bytes,
        kind: str,
        signatures: dict[str, Signature],
        lowered_names: dict[str, str] | None = None,
        op: str = "session.load_module",
        compile_log: str = "",
        variables: dict[str, Variable] | None = None,
    ) -> None:
        self.state = state
        self.compile_log = compile_log
        self.variables = variables or {}
        self.kind = kind
        self.signatures = signatures
        self.lowered_names = lowered_names or {}
        self._functions = {}
        try:
            self.handle = _driver.module_load_data(image, op)
        except BackendError as exc:
            if exc.result_name == "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" and kind == "ptx":
                m = _PTX_VERSION.search(image.decode(errors="replace"))
                ver = f"{m.group(1)}.{m.group(2)}" if m else "unknown"
                dv = _driver.driver_version()
                raise BackendError(
                    f"{op}: the PTX is ISA version {ver}, newer than this driver "
                    f"(CUDA {dv // 1000}.{dv % 1000 // 10}) can load; compile to CUBIN for the "
                    f"device (the default of s.compile) or lower the PTX .version",
                    exc.result_name,
                    exc.result_code,
                ) from None
            raise

    def _names(self) -> list[str]:
        return sorted(set(self.signatures) | set(_driver.module_function_names(self.handle)))

    def variable(self, name: str, dtype: Any = None) -> TensorMut | DeviceBytes:
        """A writable span over the module's ``__device__`` or ``__constant__`` variable ``name``.

        Args:
            name: The name as the source writes it (``table``, ``ns::flags``) or as PTX does.
            dtype: The elements' dtype where the C declaration does not say (a struct, PTX
                loaded as is, a CUBIN); None gives the declared type, or `DeviceBytes`.

        Returns:
            A `TensorMut` typed from the C declaration, or `DeviceBytes`.

        Raises:
            ValidationError: No such variable, or ``dtype`` disagrees with its declaration.
        """
        return module_variable(self, name, dtype)

    @property
    def function_names(self) -> list[str]:
        """The kernel entries this module holds."""
        self.state.check_use("module.function_names")
        try:
            return self._names()
        except KernelFault as exc:
            raise self.state.record_fault(exc) from None

    def function(self, name: str) -> Function:
        """The kernel ``name``, as a user knows it.

        An ``extern "C"`` name, a name expression given to compile, an entry (PTX or mangled),
        or a C++ kernel's name as its source writes it (`tenferro.entries.find_entry`). A
        name the module lacks is a `ValidationError` listing the entries there; an overloaded
        or templated C++ name one listing the kernels it could mean.

        Args:
            name: The kernel's name, as above.

        Returns:
            The `Function`, the same object for the same name each time.

        Raises:
            ValidationError: ``name`` is not a str, the module has no such kernel, or the
                name could mean more than one.
            RuntimeStateError: The session is closed or used from another thread.
            KernelFault: A kernel fault has stopped the session.
        """
        op = "module.function"
        self.state.check_use(op)
        if not isinstance(name, str):
            raise ValidationError(f"{op}: name must be str, got {type(name).__name__} {name!r}")
        fn = self._functions.get(name)
        if fn is not None:
            return fn
        try:
            fn = self._functions[name] = self._load_function(name, op)
        except KernelFault as exc:  # the first call to see an earlier launch's fault
            raise self.state.record_fault(exc) from None
        return fn

    def _load_function(self, name: str, op: str) -> Function:
        # The entry is found among the module's names before the driver is asked for it, so a
        # name that is not there costs no failing driver call (a sanitizer reports each one).
        entry: str | None = self.lowered_names.get(name, name)
        handle = None
        if entry not in self.signatures:
            names = self._names()
            if entry not in names:
                entry = find_entry(name, names, self.lowered_names, op)
        if entry is not None:
            handle = _driver.module_get_function(self.handle, entry)
        if handle is None:
            raise ValidationError(
                f"{op}: no kernel named {name!r} in this module; it has "
                f"{[display_name(e) for e in self._names()]}"
            )
        assert entry is not None  # a handle was found for it
        sig = self.signatures.get(entry)
        if sig is None:
            sig = from_driver_layout(entry, _driver.func_param_layout(handle))
        return Function(self, entry, handle, sig)

    def _what(self) -> str:
        return self.kind if self.handle else f"{self.kind}, unloaded"

    def __repr__(self) -> str:
        kernels = "; ".join(self.signatures[e].declaration() for e in sorted(self.signatures))
        return (
            f"Module({self._what()}; {len(self.signatures)} kernel(s): {kernels}"
            f"{listed(self.variables)})"
        )

    def _repr_html_(self) -> str:
        return kernels_html(f"Module: {self._what()}", self.signatures)

    def unload(self) -> None:
        """Unload now; called by the session after its stream has drained."""
        if self.handle:
            h, self.handle = self.handle, 0
            _driver.module_unload(h)


@dataclass(frozen=True)
class KernelAttributes:
    """What the driver says of a compiled kernel (`Function.attributes`); sizes in bytes.

    ``ptx_version`` and ``binary_version`` are major * 10 + minor (90: sm_90).
    """

    registers: int  # per thread
    local_bytes: int  # per thread (spills, local arrays)
    static_shared_bytes: int
    const_bytes: int
    max_threads_per_block: int  # what its registers and __launch_bounds__ allow
    ptx_version: int
    binary_version: int


_KERNEL_ATTRIBUTES = {
    "registers": "NUM_REGS",
    "local_bytes": "LOCAL_SIZE_BYTES",
    "static_shared_bytes": "SHARED_SIZE_BYTES",
    "const_bytes": "CONST_SIZE_BYTES",
    "max_threads_per_block": "MAX_THREADS_PER_BLOCK",
    "ptx_version": "PTX_VERSION",
    "binary_version": "BINARY_VERSION",
}


@dataclass(frozen=True)
class Occupancy:
    """How many blocks of one launch shape a multiprocessor runs at once (`Function.occupancy`)."""

    blocks_per_multiprocessor: int
    threads_per_block: int
    max_threads_per_multiprocessor: int

    @property
    def warps_per_multiprocessor(self) -> int:
        """Resident warps: each block's threads rounded up to whole warps."""
        return self.blocks_per_multiprocessor * -(-self.threads_per_block // 32)

    @property
    def fraction(self) -> float:
        """Resident warps over the most a multiprocessor can hold (0 to 1)."""
        return self.warps_per_multiprocessor / (self.max_threads_per_multiprocessor // 32)


class Function:
    """One kernel of a loaded module, with its parameter list and launch limits.

    Keeps its module loaded; usable only in the module's session, while it is open.
    """

    __slots__ = (
        "__weakref__",
        "_compiled_cluster",
        "checked_configs",
        "device_shared_optin",
        "dynamic_shared_limit",
        "grid_sync",
        "handle",
        "last_config",
        "max_threads_per_block",
        "module",
        "name",
        "param_block",
        "record",
        "record_address",
        "record_config",
        "signature",
        "state",
        "static_shared_bytes",
    )
    module: Any
    state: Any
    name: str
    handle: int
    signature: Signature
    param_block: ParamBlockBase
    max_threads_per_block: int
    static_shared_bytes: int
    dynamic_shared_limit: int
    device_shared_optin: int
    checked_configs: set[LaunchConfig]
    last_config: Any
    record: Any
    record_address: int
    record_config: Any
    grid_sync: bool
    _compiled_cluster: Any

    @property
    def session(self) -> Any:
        """The `tenferro.Session` this function belongs to."""
        return self.state.session

    def __init__(
        self,
        module: Any,
        name: str,
        handle: int,
        sig: Signature,
        param_block: Any = None,
        *,
        grid_sync: bool = False,
    ) -> None:
        from .args import ParamBlock  # args sits above signature; imported once here

        self.module = module
        self.state = module.state
        self.name = name
        self.handle = handle
        self.signature = sig
        self.param_block = ParamBlock(sig) if param_block is None else param_block
        self.max_threads_per_block = _driver.func_attribute(handle, "MAX_THREADS_PER_BLOCK")
        self.static_shared_bytes = _driver.func_attribute(handle, "SHARED_SIZE_BYTES")
        self.dynamic_shared_limit = DEFAULT_SHARED_LIMIT - self.static_shared_bytes
        self.device_shared_optin = self.state.context.attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
        self.checked_configs = set()
        # The launcher's record for the last config checked (handle, grid, block, shared
        # memory, stream, parameter block) and its address, rebuilt when the config changes.
        # Until a config has been checked, `last_config` is a private object no caller can
        # pass, so `session.launch` never takes its fast path with an unset record.
        self.last_config = _NO_CONFIG
        self.record = None
        self.record_address = 0
        self.record_config = _NO_CONFIG  # the config `record` was made for
        self.grid_sync = grid_sync  # synchronizes the whole grid: launched cooperatively only
        self._compiled_cluster = _UNREAD
        # The session makes the parameter block forget its last arguments when it synchronizes.
        self.state.liveness.add_cache(self.param_block)

    def use_config(self, config: Any, stream: int) -> None:
        """Make the launcher's record for ``config`` (checked by the caller) on ``stream``.

        A config with clusters or a cooperative launch gets an extended record, which only
        the checked launch path reads: `last_config`, what the fast path compares, stays unset.
        A config equal to the record's (made anew with the same values) keeps the record.
        """
        if config != self.record_config:
            self.record = _driver.launch_record(
                self.handle,
                config.dims,
                stream,
                self.param_block.address,
                config.launch_attributes,
            )
            self.record_address = self.record.address
        self.record_config = config
        self.last_config = _NO_CONFIG if config.extended else config

    def compiled_cluster(self) -> tuple[int, int, int] | None:
        """The cluster shape the kernel was compiled with (``__cluster_dims__``), or None.

        Returns:
            ``(x, y, z)`` blocks, or None: no ``__cluster_dims__``, or a device before sm_90.
        """
        if self._compiled_cluster is _UNREAD:
            dims = None
            if self.state.context.compute_capability >= (9, 0):  # no clusters before sm_90
                dims = tuple(
                    _driver.func_attribute(self.handle, "REQUIRED_CLUSTER_" + d)
                    for d in ("WIDTH", "HEIGHT", "DEPTH")
                )
            self._compiled_cluster = dims if dims and dims[0] else None
        return self._compiled_cluster

    def resident_blocks(self, config: Any, op: str) -> int:
        """Blocks of ``config``'s shape that run at once on the whole device (checked config)."""
        per_sm = _driver.occupancy_blocks(
            self.handle, config.threads_per_block, config.shared_mem_bytes, op
        )
        return per_sm * self.state.context.attribute("MULTIPROCESSOR_COUNT")

    def active_clusters(self, config: Any, op: str) -> int:
        """Clusters of ``config``'s shape that run at once on the device (0: none fits).

        Above 8 blocks a cluster (the portable size) the kernel is opted in first, as a launch
        above 48 KiB of shared memory is.
        """
        if config.cluster_blocks > 8:
            _driver.func_set_attribute(self.handle, "NON_PORTABLE_CLUSTER_SIZE_ALLOWED", 1, op)
        return _driver.max_active_clusters(
            self.handle, config.dims, config.cluster, self.state.stream, op
        )

    def thread_limit_reason(self, threads: int) -> str:
        """Why a block of ``threads`` is past `max_threads_per_block`, with the numbers.

        Asked only for a refusal: the registers the block would need against the device's,
        else the kernel's own bound.

        Args:
            threads: The threads of the refused block.

        Returns:
            The reason, as the refusal words it.
        """
        regs = _driver.func_attribute(self.handle, "NUM_REGS")
        per_block = self.state.context.attribute("MAX_REGISTERS_PER_BLOCK")
        allocated = -(-regs // 8) * 8  # a thread's registers are given in units of 8
        warps = -(-threads // 32)  # and to whole warps
        need = allocated * 32 * warps
        if need > per_block:
            held = f" (allocated as {allocated})" if allocated != regs else ""
            return (
                f"it uses {regs} registers a thread{held}, {need} for the block's {warps} "
                f"warps, past the {per_block} a block has on this device"
            )
        return (
            f"its __launch_bounds__ (or PTX .maxntid) caps a block at "
            f"{self.max_threads_per_block} threads"
        )

    def raise_dynamic_shared(self, nbytes: int) -> None:
        """Allow ``nbytes`` of dynamic shared memory (cuFuncSetAttribute)."""
        _driver.func_set_max_dynamic_shared(self.handle, nbytes, "session.launch")
        self.dynamic_shared_limit = nbytes

    @property
    def attributes(self) -> KernelAttributes:
        """Registers, local, shared and constant bytes, thread limit and versions (the driver's)."""
        self.state.check_use("function.attributes")
        try:
            return KernelAttributes(
                **{
                    field_name: _driver.func_attribute(self.handle, attr)
                    for field_name, attr in _KERNEL_ATTRIBUTES.items()
                }
            )
        except KernelFault as exc:
            raise self.state.record_fault(exc) from None

    def occupancy(self, block: int | tuple[int, ...], shared_mem_bytes: int = 0) -> Occupancy:
        """How many blocks of this shape and dynamic shared memory run at once on one SM.

        Checked as a launch is (the kernel's thread limit, the device's shared memory), with
        the same refusals; like a launch, asking for more than 48 KiB of shared memory opts
        the kernel in to it.

        Args:
            block: Threads a block, an int or a tuple of 1 to 3 ints.
            shared_mem_bytes: Dynamic shared memory a block, in bytes.

        Returns:
            An `Occupancy`: blocks resident a multiprocessor, and the warp fraction.

        Raises:
            ValidationError: ``block`` or ``shared_mem_bytes`` is refused, by
                `LaunchConfig` or past the kernel's thread limit or the device's shared
                memory.
            RuntimeStateError: The session is closed or used from another thread.
            BackendError: The driver refused the query or the shared-memory opt-in.
            KernelFault: A kernel fault has stopped the session.
        """
        op = "function.occupancy"
        self.state.check_use(op)
        try:
            config = LaunchConfig(1, block, shared_mem_bytes)
        except ValidationError as exc:
            raise ValidationError(f"{op}: {str(exc).removeprefix('LaunchConfig: ')}") from None
        try:
            check_against(config, self, op)
            blocks = _driver.occupancy_blocks(
                self.handle, config.threads_per_block, config.shared_mem_bytes, op
            )
        except KernelFault as exc:
            raise self.state.record_fault(exc) from None
        return Occupancy(
            blocks,
            config.threads_per_block,
            self.state.context.attribute("MAX_THREADS_PER_MULTIPROCESSOR"),
        )

    def max_active_clusters(self, config: LaunchConfig) -> int:
        """How many clusters of ``config``'s shape run on the device at once (0: none fits).

        What a persistent kernel with clusters sizes its grid by: the device's groups of
        multiprocessors may hold fewer clusters than its multiprocessor count suggests, and a
        grid past them runs in a second wave. Checked as a launch is (the kernel's thread
        limit, the device's shared memory, which is opted in to past 48 KiB); the grid is not
        counted.

        Args:
            config: A `LaunchConfig` with a cluster.

        Returns:
            The clusters resident at once (cuOccupancyMaxActiveClusters).

        Raises:
            ValidationError: ``config`` is not a `LaunchConfig`, has no cluster or one past
                16 blocks or other than the kernel's ``__cluster_dims__``, the device has no
                clusters, or the block is past the kernel's or the device's limits.
            RuntimeStateError: The session is closed or used from another thread.
            BackendError: The driver refused the query or the shared-memory opt-in.
            KernelFault: A kernel fault has stopped the session.
        """
        op = "function.max_active_clusters"
        self.state.check_use(op)
        if not isinstance(config, LaunchConfig):
            raise ValidationError(
                f"{op}: config must be a LaunchConfig, got {type(config).__name__}"
            )
        if config.cluster is None:
            raise ValidationError(
                f"{op}: config={config!r} has no cluster; give LaunchConfig(..., cluster=...)"
            )
        try:
            check_against(config, self, op)
            check_cluster(config, self, op)
            return self.active_clusters(config, op)
        except KernelFault as exc:
            raise self.state.record_fault(exc) from None

    def __repr__(self) -> str:
        return f"Function({self.signature.declaration()})"


# --- loading into a session, which the session delegates to; it unloads them at its end ------


def compile_module(
    st: Any,
    source: str | os.PathLike[str],
    options: Any = None,
    name_expressions: Any = None,
    arch: str | None = None,
) -> Module:
    """Compile CUDA C to CUBIN for this device's architecture (disk-cached) and load it.

    ``source`` is CUDA C text or a kernel file's `pathlib.Path` (see `compile_cuda`).

    ``arch`` may name the device's own architecture with its ``a`` suffix (``"sm_90a"``:
    architecture-specific instructions such as wgmma) or ``f`` suffix; any other
    architecture is refused, since its CUBIN would not load here.
    """
    op = "session.compile"
    st.check_use(op)
    major, minor = st.context.compute_capability
    own = f"sm_{major}{minor}"
    if arch is None:
        arch = own
    elif arch not in (own, own + "a", own + "f"):
        raise ValidationError(
            f"{op}: {arch=} is not this device's architecture ({own}, {own}a or {own}f)"
        )
    r = compile_cuda(
        source,
        arch=arch,
        options=options,
        name_expressions=name_expressions,
        _driver_version=_driver.driver_version(),
        _op=op,
    )
    return st.add_module(
        Module(
            st,
            r.image,
            "cubin",
            r.signatures,
            r.lowered_names,
            op,
            compile_log=r.log,
            variables=r.variables,
        )
    )


def load_ptx_module(st: Any, text: str | bytes) -> Module:
    """Load PTX text; its ``.entry`` parameter lists become the functions' signatures."""
    op = "session.load_ptx"
    st.check_use(op)
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode()
        except UnicodeDecodeError as exc:
            raise ValidationError(
                f"{op}: text is not UTF-8 at byte {exc.start}; PTX is ASCII text"
            ) from None
    if not isinstance(text, str):
        raise ValidationError(f"{op}: text must be str or bytes, got {type(text).__name__}")
    text = text.rstrip("\0")  # a C string's terminator is fine; an inner NUL is not
    if "\0" in text:
        raise ValidationError(
            f"{op}: text has a NUL character at offset {text.find(chr(0))}; "
            "the driver would load only what comes before it"
        )
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise ValidationError(f"{op}: text cannot be encoded at offset {exc.start}") from None
    sigs = parse_ptx(text, op)
    image = text.encode() + b"\0"
    return st.add_module(Module(st, image, "ptx", sigs, None, op, variables=ptx_variables(text)))


def load_cubin_module(st: Any, image: bytes) -> Module:
    """Load a CUBIN; parameter sizes come from the driver (cuFuncGetParamInfo).

    A CUBIN says only each parameter's size, so any 8-byte argument fits an 8-byte slot:
    prefer `compile` or `load_ptx` where the types should be checked.
    """
    op = "session.load_cubin"
    st.check_use(op)
    if not isinstance(image, (bytes, bytearray, memoryview)):
        raise ValidationError(f"{op}: image must be bytes, got {type(image).__name__}")
    return st.add_module(Module(st, bytes(image), "cubin", {}, None, op))
