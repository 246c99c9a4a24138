"""`Module` and `Function`; CUDA C compilation through NVRTC with a disk cache.

`compile_cuda` needs no GPU: it is what ``s.compile`` calls with the device's own architecture.
The cache key covers the source, options, name expressions, architecture, target, and the
NVRTC and driver versions; entries are written atomically (a temporary file, then a rename), so
concurrent processes never read a half-written entry. The location is ``$TENFERRO_CACHE_DIR``,
else ``~/.cache/tenferro``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _driver
from . import variables as variables_part
from .entries import find_entry
from .errors import BackendError, CompileError, KernelFault, ValidationError
from .signature import (
    Signature,
    display_name,
    from_driver_layout,
    kernels_html,
    parse_ptx,
    refine_with_source,
    with_c_types,
)
from .variables import Variable

__all__ = ["CompiledCuda", "Function", "KernelAttributes", "Module", "Occupancy", "cache_stats",
           "compile_cuda"]

_CACHE_FORMAT = 3  # 2: entries keep the C-type probes' names; 3: the variables' too
_stats_lock = threading.Lock()
_stats = {"hits": 0, "misses": 0}


def cache_stats() -> dict[str, int]:
    """Hits and misses of the compile cache in this process, since import."""
    with _stats_lock:
        return dict(_stats)


def cache_dir() -> Path:
    """Where compiled modules are cached: ``$TENFERRO_CACHE_DIR`` or ``~/.cache/tenferro``."""
    env = os.environ.get("TENFERRO_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "tenferro"


@dataclass(frozen=True)
class CompiledCuda:
    """What NVRTC made of a source: the image to load and what tenferro knows of its kernels.

    ``image`` is the CUBIN for ``target="cubin"`` or the PTX text (bytes) for ``"ptx"``;
    ``lowered_names`` maps each name expression to its mangled entry name.
    """

    image: bytes
    ptx: str
    target: str
    arch: str
    log: str
    lowered_names: dict[str, str] = field(default_factory=dict)
    signatures: dict[str, Signature] = field(default_factory=dict)
    from_cache: bool = False
    variables: dict[str, Variable] = field(default_factory=dict)  # __device__, __constant__

    def _what(self) -> str:
        cached = ", from the cache" if self.from_cache else ""
        return f"{self.target} for {self.arch}, {len(self.image)} bytes{cached}"

    def __repr__(self) -> str:
        kernels = "; ".join(sig.declaration() for sig in self.signatures.values())
        return (f"CompiledCuda({self._what()}; {len(self.signatures)} kernel(s): {kernels}"
                f"{variables_part.listed(self.variables)})")

    def _repr_html_(self) -> str:
        return kernels_html(f"CompiledCuda: {self._what()}", self.signatures)


_ARCH = re.compile(r"^(sm|compute)_(\d+)([af]?)$")


def _norm_name_expressions(name_expressions: Any, op: str) -> list[str]:
    if name_expressions is None:
        return []
    if isinstance(name_expressions, str):
        name_expressions = [name_expressions]
    try:
        exprs = list(name_expressions)
    except TypeError:
        raise ValidationError(f"{op}: {name_expressions=} must be a str or a list of str") \
            from None
    for e in exprs:
        if not isinstance(e, str) or not e or "\0" in e:
            raise ValidationError(f"{op}: name_expressions={exprs!r}: each must be a non-empty "
                                  f"str, got {e!r}")
    return exprs


def _norm_options(options: Any, op: str) -> list[str]:
    if options is None:
        return []
    if isinstance(options, str):
        options = [options]
    opts = list(options)
    for o in opts:
        if not isinstance(o, str):
            raise ValidationError(f"{op}: options must be strings, got {o!r}")
        if o.startswith(("-arch", "--gpu-architecture")):
            raise ValidationError(f"{op}: options={opts!r}: give the architecture as arch=, "
                                  "not in options")
    return opts


def compile_cuda(source: str, arch: str = "sm_90", target: str = "cubin",
                 options: Any = None, name_expressions: Any = None,
                 *, name: str = "tenferro.cu", cache: bool = True,
                 _driver_version: int = 0) -> CompiledCuda:
    """Compile CUDA C with NVRTC to a CUBIN or PTX for ``arch``; needs no GPU.

    Refused: a non-str source, an unknown target, an arch that is not ``sm_NN``/``compute_NN``,
    ``-arch`` inside ``options``. A failed compile raises `CompileError` carrying NVRTC's log.
    """
    op = "compile_cuda"
    if not isinstance(source, str):
        raise ValidationError(f"{op}: source must be str, got {type(source).__name__}")
    nul = source.find("\0")
    if nul >= 0:
        raise ValidationError(f"{op}: source has a NUL character at offset {nul}; NVRTC would "
                              "compile only what comes before it")
    try:
        source_bytes = source.encode()
    except UnicodeEncodeError as exc:
        raise ValidationError(f"{op}: source cannot be encoded as UTF-8 at offset {exc.start} "
                              f"({source[exc.start]!r}: {exc.reason})") from None
    if not isinstance(name, str) or not name or "\0" in name:
        raise ValidationError(f"{op}: {name=} must be a non-empty str (the file name NVRTC "
                              "reports)")
    if target not in ("cubin", "ptx"):
        raise ValidationError(f"{op}: {target=} must be 'cubin' or 'ptx'")
    m = _ARCH.match(arch) if isinstance(arch, str) else None
    if m is None:
        raise ValidationError(f"{op}: {arch=} must look like 'sm_90' or 'compute_90'")
    opts = _norm_options(options, op)
    exprs = _norm_name_expressions(name_expressions, op)
    real_arch, virt_arch = f"sm_{m.group(2)}{m.group(3)}", f"compute_{m.group(2)}{m.group(3)}"
    if target == "cubin" and arch.startswith("compute_"):
        raise ValidationError(f"{op}: target='cubin' needs a real architecture (sm_NN), got "
                              f"{arch=}")
    arch_opt = f"-arch={real_arch if target == 'cubin' else virt_arch}"
    base_opts = [arch_opt, "-std=c++17", *(f"-I{d}" for d in _driver.cuda_include_dirs())]
    nvrtc_ver = _driver.nvrtc_version()
    key = hashlib.sha256(json.dumps(
        [_CACHE_FORMAT, source, opts, exprs, base_opts, target, nvrtc_ver, _driver_version],
    ).encode()).hexdigest()
    path = cache_dir() / f"{key}.tfmod"
    if cache:
        hit = _read_cache(path, key)
        if hit is not None:
            with _stats_lock:
                _stats["hits"] += 1
            return _finish(hit, source, target, arch, from_cache=True)
    with _stats_lock:
        _stats["misses"] += 1
    probe_opts = [*base_opts, *opts]
    early = _early_c_type_probes(source, name, probe_opts)  # beside the kernels' compile
    ok, log, ptx, cubin, lowered = _driver.nvrtc_compile(
        source_bytes, name.encode(), [o.encode() for o in (*base_opts, *opts)],
        [e.encode() for e in exprs], target == "cubin")
    if not ok:
        raise CompileError(f"{op}: NVRTC failed to compile {name!r} for {arch}", log)
    ptx_text = ptx.decode()
    entry = {"key": key, "ptx": ptx_text, "log": log, "lowered": lowered,
             "image_hex": (cubin if target == "cubin" else ptx + b"\0").hex(),
             "probes": _c_type_probes(source, name, probe_opts, ptx_text, early),
             "variable_probes": _variable_probes(source, name, probe_opts, ptx_text)}
    if cache:
        _write_cache(path, entry)
    return _finish(entry, source, target, arch, from_cache=False)


# Instantiated on ``decltype(&kernel)`` for each extern "C" kernel, in a second compile, so that
# NVRTC's lowered name spells the kernel's C parameter types (tenferro.mangling reads them).
_PROBE = "__tenferro_c_types_of"
_PROBE_SOURCE = f"\ntemplate <typename T> __global__ void {_PROBE}() {{}}\n"
_ENTRY_NAME = re.compile(r"\.entry\s+([\w$]+)")


def _c_type_probes(source: str, name: str, options: list[str], ptx: str,
                   early: _Early | None = None) -> dict[str, str]:
    """For each extern "C" entry, the lowered name of the probe instantiated on its type.

    Only what compiles: an entry whose name does not resolve at the end of the source (one
    declared inside a namespace) leaves every probe out, and the signatures keep PTX's view.
    ``early`` is the probe started from the source's text (`_early_c_type_probes`); its
    answer serves where it has every entry, else the probe runs now on PTX's entries.
    """
    entries = [e for e in _ENTRY_NAME.findall(ptx) if not e.startswith("_Z")]
    if not entries:
        return {}
    got = early.result() if early is not None else None
    if got and all(e in got for e in entries):
        return {e: got[e] for e in entries}
    return _lowered_probes(source + _PROBE_SOURCE, name, options, _probe_exprs(entries))


def _probe_exprs(kernels: list[str]) -> dict[str, str]:
    """Each extern "C" kernel's probe: the template instantiated on the kernel's type."""
    return {k: f"{_PROBE}<decltype(&{k})>" for k in kernels}


# An extern "C" kernel as people write it; a guess from the text, which PTX's entries confirm.
_EXTERN_C_KERNEL = re.compile(
    r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+'
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")


class _Early:
    """A call on a thread of its own; `result` waits for it (None where it raised)."""

    __slots__ = ("_thread", "_value")

    def __init__(self, fn: Any, *args: Any) -> None:
        self._value: Any = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True,
                                        name="tenferro-c-type-probe")
        self._thread.start()

    def _run(self, fn: Any, args: tuple) -> None:
        try:
            self._value = fn(*args)
        except Exception:  # the probe is an aid: where it fails, the one after the compile runs
            self._value = None

    def result(self) -> Any:
        self._thread.join()
        return self._value


def _early_c_type_probes(source: str, name: str, options: list[str]) -> _Early | None:
    """The C-type probe of the extern "C" kernels the text declares, started now.

    NVRTC lets go of the interpreter while it compiles, so the probe and the kernels' own
    compile run at once instead of one after the other (the first compile of a new source is
    on the way to a fresh process's first result). A guess the text gets wrong (a kernel made
    by a macro, one inside ``#if 0``) costs only the wait: `_c_type_probes` probes again.
    """
    guessed = list(dict.fromkeys(_EXTERN_C_KERNEL.findall(source)))
    if not guessed:
        return None
    return _Early(_lowered_probes, source + _PROBE_SOURCE, name, options, _probe_exprs(guessed))


def _variable_probes(source: str, name: str, options: list[str], ptx: str) -> dict[str, str]:
    """For each of the source's variables, the lowered name of the probe on its type.

    Where one of them cannot be named at the end of the source, which spoils the compile of
    them all, each is probed alone, so only it keeps PTX's view.
    """
    exprs = variables_part.probe_expressions(variables_part.ptx_variables(ptx, source))
    probe_source = source + variables_part.PROBE_SOURCE
    lowered = _lowered_probes(probe_source, name, options, exprs)
    if len(exprs) > 1 and not lowered:
        lowered = {k: one for k, x in exprs.items()
                   for one in _lowered_probes(probe_source, name, options, {k: x}).values()}
    return lowered


def _lowered_probes(source: str, name: str, options: list[str],
                    exprs: dict[str, str]) -> dict[str, str]:
    """Each key's name expression, lowered by a compile of ``source``; {} if that fails."""
    if not exprs:
        return {}
    try:
        ok, _log, _ptx, _cubin, lowered = _driver.nvrtc_compile(
            source.encode(), name.encode(), [o.encode() for o in options],
            [x.encode() for x in exprs.values()], False)
    except BackendError:
        return {}
    if not ok:
        return {}
    return {k: lowered[x] for k, x in exprs.items() if x in lowered}


def _finish(entry: dict, source: str, target: str, arch: str, from_cache: bool) -> CompiledCuda:
    sigs = with_c_types(parse_ptx(entry["ptx"], "compile_cuda", require_entry=False),
                        entry.get("probes") or {})
    sigs = refine_with_source(sigs, source)  # names; the text's types where the compiler's lack
    variables = variables_part.with_c_types(variables_part.ptx_variables(entry["ptx"], source),
                                            entry["variable_probes"])
    image = bytes.fromhex(entry["image_hex"])  # _read_cache made sure it is hex
    return CompiledCuda(image, entry["ptx"], target, arch, entry["log"], dict(entry["lowered"]),
                        sigs, from_cache, variables)


def _read_cache(path: Path, key: str) -> dict | None:
    """The entry at ``path`` if it is whole and was written for ``key``; else None (recompile).

    An entry that does not check (another key, a field of the wrong type, an image that is not
    hex) is treated as missing, and the compile that follows overwrites it.
    """
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
    except (OSError, ValueError):
        return None  # missing or unreadable: compile again and overwrite
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    ptx, log, lowered, image, probes, variable_probes = (entry.get(k) for k in (
        "ptx", "log", "lowered", "image_hex", "probes", "variable_probes"))
    if not (isinstance(ptx, str) and isinstance(log, str) and isinstance(image, str)
            and all(isinstance(d, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in d.items())
                    for d in (lowered, probes, variable_probes))):
        return None
    try:
        bytes.fromhex(image)
    except ValueError:
        return None
    return entry


def _write_cache(path: Path, entry: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".tfmod")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entry, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only or full cache directory costs a recompile, never a failure


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
        "session",
        "signatures",
        "variables",
    )

    def __init__(self, session: Any, image: bytes, kind: str,
                 signatures: dict[str, Signature], lowered_names: dict[str, str] | None = None,
                 op: str = "session.load_module", compile_log: str = "",
                 variables: dict[str, Variable] | None = None) -> None:
        self.session = session
        self.compile_log = compile_log
        self.variables = variables or {}
        self.kind = kind
        self.signatures = signatures
        self.lowered_names = lowered_names or {}
        self._functions: dict[str, Function] = {}
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
                    exc.result_name, exc.result_code) from None
            raise

    def _names(self) -> list[str]:
        return sorted(set(self.signatures) | set(_driver.module_function_names(self.handle)))

    variable = variables_part.module_variable  # module.variable(name, dtype=None): a span

    @property
    def function_names(self) -> list[str]:
        """The kernel entries this module holds."""
        self.session.check_use("module.function_names")
        try:
            return self._names()
        except KernelFault as exc:
            raise self.session.fault_seen(exc) from None

    def function(self, name: str) -> Function:
        """The kernel ``name``, as a user knows it.

        An ``extern "C"`` name, a name expression given to compile, an entry (PTX or mangled),
        or a C++ kernel's name as its source writes it (`tenferro.entries.find_entry`). A
        name the module lacks is a `ValidationError` listing the entries there; an overloaded
        or templated C++ name one listing the kernels it could mean.
        """
        op = "module.function"
        self.session.check_use(op)
        if not isinstance(name, str):
            raise ValidationError(f"{op}: name must be str, got {type(name).__name__} {name!r}")
        fn = self._functions.get(name)
        if fn is not None:
            return fn
        try:
            fn = self._functions[name] = self._load_function(name, op)
        except KernelFault as exc:  # the first call to see an earlier launch's fault
            raise self.session.fault_seen(exc) from None
        return fn

    def _load_function(self, name: str, op: str) -> Function:
        entry = self.lowered_names.get(name, name)
        handle = _driver.module_get_function(self.handle, entry)
        if handle is None:
            found = find_entry(name, self._names(), self.lowered_names, op)
            if found is not None:
                entry, handle = found, _driver.module_get_function(self.handle, found)
        if handle is None:
            raise ValidationError(f"{op}: no kernel named {name!r} in this module; it has "
                                  f"{[display_name(e) for e in self._names()]}")
        sig = self.signatures.get(entry)
        if sig is None:
            sig = from_driver_layout(entry, _driver.func_param_layout(handle))
        return Function(self, entry, handle, sig)

    def _what(self) -> str:
        return self.kind if self.handle else f"{self.kind}, unloaded"

    def __repr__(self) -> str:
        kernels = "; ".join(self.signatures[e].declaration() for e in sorted(self.signatures))
        return (f"Module({self._what()}; {len(self.signatures)} kernel(s): {kernels}"
                f"{variables_part.listed(self.variables)})")

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


_KERNEL_ATTRIBUTES = {"registers": "NUM_REGS", "local_bytes": "LOCAL_SIZE_BYTES",
                      "static_shared_bytes": "SHARED_SIZE_BYTES",
                      "const_bytes": "CONST_SIZE_BYTES",
                      "max_threads_per_block": "MAX_THREADS_PER_BLOCK",
                      "ptx_version": "PTX_VERSION", "binary_version": "BINARY_VERSION"}


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
        "session",
        "signature",
        "static_shared_bytes",
    )

    def __init__(self, module: Any, name: str, handle: int, sig: Signature,
                 param_block: Any = None, *, grid_sync: bool = False) -> None:
        from .args import ParamBlock  # args sits above signature; imported once here

        self.module = module
        self.session = module.session
        self.name = name
        self.handle = handle
        self.signature = sig
        self.param_block = ParamBlock(sig) if param_block is None else param_block
        self.max_threads_per_block = _driver.func_attribute(handle, "MAX_THREADS_PER_BLOCK")
        self.static_shared_bytes = _driver.func_attribute(handle, "SHARED_SIZE_BYTES")
        self.dynamic_shared_limit = DEFAULT_SHARED_LIMIT - self.static_shared_bytes
        self.device_shared_optin = self.session.context.attribute(
            "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
        self.checked_configs: set = set()
        # The launcher's record for the last config checked (handle, grid, block, shared
        # memory, stream, parameter block) and its address, rebuilt when the config changes.
        # Until a config has been checked, `last_config` is a private object no caller can
        # pass, so `session.launch` never takes its fast path with an unset record.
        self.last_config: Any = _NO_CONFIG
        self.record: Any = None
        self.record_address: int = 0
        self.record_config: Any = _NO_CONFIG  # the config `record` was made for
        self.grid_sync = grid_sync  # synchronizes the whole grid: launched cooperatively only
        self._compiled_cluster: Any = _UNREAD
        # The session makes the parameter block forget its last arguments when it synchronizes.
        self.session.liveness.add_cache(self.param_block)

    def use_config(self, config: Any, stream: int) -> None:
        """Make the launcher's record for ``config`` (checked by the caller) on ``stream``.

        A config with clusters or a cooperative launch gets an extended record, which only
        the checked launch path reads: `last_config`, what the fast path compares, stays unset.
        A config equal to the record's (made anew with the same values) keeps the record.
        """
        if config != self.record_config:
            self.record = _driver.launch_record(self.handle, config.dims, stream,
                                                self.param_block.address, config.cluster,
                                                config.cooperative)
            self.record_address = self.record.address
        self.record_config = config
        self.last_config = _NO_CONFIG if config.extended else config

    def compiled_cluster(self) -> tuple[int, int, int] | None:
        """The cluster shape the kernel was compiled with (``__cluster_dims__``), or None."""
        if self._compiled_cluster is _UNREAD:
            dims = None
            if self.session.context.compute_capability >= (9, 0):  # no clusters before sm_90
                dims = tuple(_driver.func_attribute(self.handle, "REQUIRED_CLUSTER_" + d)
                             for d in ("WIDTH", "HEIGHT", "DEPTH"))
            self._compiled_cluster = dims if dims and dims[0] else None
        return self._compiled_cluster

    def resident_blocks(self, config: Any, op: str) -> int:
        """Blocks of ``config``'s shape that run at once on the whole device (checked config)."""
        per_sm = _driver.occupancy_blocks(self.handle, config.threads_per_block,
                                          config.shared_mem_bytes, op)
        return per_sm * self.session.context.attribute("MULTIPROCESSOR_COUNT")

    def active_clusters(self, config: Any, op: str) -> int:
        """Clusters of ``config``'s shape that run at once on the device (0: none fits).

        Above 8 blocks a cluster (the portable size) the kernel is opted in first, as a launch
        above 48 KiB of shared memory is.
        """
        if config.cluster_blocks > 8:
            _driver.func_set_attribute(self.handle, "NON_PORTABLE_CLUSTER_SIZE_ALLOWED", 1, op)
        return _driver.max_active_clusters(self.handle, config.dims, config.cluster,
                                           self.session.stream, op)

    def raise_dynamic_shared(self, nbytes: int) -> None:
        """Allow ``nbytes`` of dynamic shared memory (cuFuncSetAttribute)."""
        _driver.func_set_max_dynamic_shared(self.handle, nbytes, "session.launch")
        self.dynamic_shared_limit = nbytes

    @property
    def attributes(self) -> KernelAttributes:
        """Registers, local, shared and constant bytes, thread limit and versions (the driver's)."""
        self.session.check_use("function.attributes")
        try:
            return KernelAttributes(**{field_name: _driver.func_attribute(self.handle, attr)
                                       for field_name, attr in _KERNEL_ATTRIBUTES.items()})
        except KernelFault as exc:
            raise self.session.fault_seen(exc) from None

    def occupancy(self, block: int | tuple[int, ...], shared_mem_bytes: int = 0) -> Occupancy:
        """How many blocks of this shape and dynamic shared memory run at once on one SM.

        Checked as a launch is (the kernel's thread limit, the device's shared memory), with
        the same refusals; like a launch, asking for more than 48 KiB of shared memory opts
        the kernel in to it.
        """
        from .launch import LaunchConfig, check_against  # launch sits above this module

        op = "function.occupancy"
        self.session.check_use(op)
        try:
            config = LaunchConfig(1, block, shared_mem_bytes)
        except ValidationError as exc:
            raise ValidationError(f"{op}: {str(exc).removeprefix('LaunchConfig: ')}") from None
        try:
            check_against(config, self, op)
            blocks = _driver.occupancy_blocks(self.handle, config.threads_per_block,
                                              config.shared_mem_bytes, op)
        except KernelFault as exc:
            raise self.session.fault_seen(exc) from None
        return Occupancy(blocks, config.threads_per_block,
                         self.session.context.attribute("MAX_THREADS_PER_MULTIPROCESSOR"))

    def __repr__(self) -> str:
        return f"Function({self.signature.declaration()})"



# --- loading into a session, which the session delegates to; it unloads them at its end ------


def compile_module(s: Any, source: str, options: Any = None, name_expressions: Any = None,
                   arch: str | None = None) -> Module:
    """Compile CUDA C to CUBIN for this device's architecture (disk-cached) and load it.

    ``arch`` may name the device's own architecture with its ``a`` suffix (``"sm_90a"``:
    architecture-specific instructions such as wgmma) or ``f`` suffix; any other
    architecture is refused, since its CUBIN would not load here.
    """
    op = "session.compile"
    s.check_use(op)
    major, minor = s.context.compute_capability
    own = f"sm_{major}{minor}"
    if arch is None:
        arch = own
    elif arch not in (own, own + "a", own + "f"):
        raise ValidationError(f"{op}: {arch=} is not this device's architecture ({own}, "
                              f"{own}a or {own}f)")
    r = compile_cuda(source, arch=arch, options=options,
                     name_expressions=name_expressions,
                     _driver_version=_driver.driver_version())
    return s.add_module(Module(s, r.image, "cubin", r.signatures, r.lowered_names, op,
                               compile_log=r.log, variables=r.variables))


def load_ptx_module(s: Any, text: str | bytes) -> Module:
    """Load PTX text; its ``.entry`` parameter lists become the functions' signatures."""
    op = "session.load_ptx"
    s.check_use(op)
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode()
        except UnicodeDecodeError as exc:
            raise ValidationError(f"{op}: text is not UTF-8 at byte {exc.start}; PTX is "
                                  "ASCII text") from None
    if not isinstance(text, str):
        raise ValidationError(f"{op}: text must be str or bytes, got {type(text).__name__}")
    text = text.rstrip("\0")  # a C string's terminator is fine; an inner NUL is not
    if "\0" in text:
        raise ValidationError(f"{op}: text has a NUL character at offset {text.find(chr(0))}; "
                              "the driver would load only what comes before it")
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise ValidationError(f"{op}: text cannot be encoded at offset {exc.start}") from None
    sigs = parse_ptx(text, op)
    image = text.encode() + b"\0"
    return s.add_module(Module(s, image, "ptx", sigs, None, op,
                               variables=variables_part.ptx_variables(text)))


def load_cubin_module(s: Any, image: bytes) -> Module:
    """Load a CUBIN; parameter sizes come from the driver (cuFuncGetParamInfo).

    A CUBIN says only each parameter's size, so any 8-byte argument fits an 8-byte slot:
    prefer `compile` or `load_ptx` where the types should be checked.
    """
    op = "session.load_cubin"
    s.check_use(op)
    if not isinstance(image, (bytes, bytearray, memoryview)):
        raise ValidationError(f"{op}: image must be bytes, got {type(image).__name__}")
    return s.add_module(Module(s, bytes(image), "cubin", {}, None, op))
