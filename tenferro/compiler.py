"""CUDA C compilation through NVRTC with a disk cache: `compile_cuda` and `CompiledCuda`.

`compile_cuda` needs no GPU: it is what ``s.compile`` calls with the device's own architecture.
The cache key covers the source, options, name expressions, architecture, target, the
NVRTC and driver versions, and the contents of the files the source includes from the user's
``-I`` folders; entries are written atomically (a temporary file, then a rename), so
concurrent processes never read a half-written entry. The location is ``$TENFERRO_CACHE_DIR``,
else ``~/.cache/tenferro``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _driver
from .errors import BackendError, CompileError, ValidationError
from .signature import (
    Signature,
    kernels_html,
    parse_ptx,
    qualified_kernel_names,
    refine_with_source,
    with_c_types,
)
from .variables import PROBE_SOURCE, Variable, listed, probe_expressions, ptx_variables
from .variables import with_c_types as variables_with_c_types

__all__ = ["STD_HEADERS_DIR", "CompiledCuda", "cache_dir", "cache_stats", "compile_cuda"]

_CACHE_FORMAT = 6  # 6: the user's -I folders searched before the toolkit's
# What NVRTC lacks of the C and C++ library headers (<cstdint>, <cmath>, ...), from libcu++;
# searched after the user's own -I folders.
STD_HEADERS_DIR = str(Path(__file__).with_name("nvrtc_std"))
_log = logging.getLogger(__name__)  # compiles and cache hits at DEBUG; a cache left unwritten
_stats_lock = threading.Lock()
_stats = {"hits": 0, "misses": 0}


def cache_stats() -> dict[str, int]:
    """Hits and misses of the compile cache in this process, since import.

    Returns:
        ``{"hits": ..., "misses": ...}``, a copy: compiles served from the disk cache and
            compiles NVRTC ran (``cache=False`` ones included).
    """
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
        return (
            f"CompiledCuda({self._what()}; {len(self.signatures)} kernel(s): {kernels}"
            f"{listed(self.variables)})"
        )

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
        raise ValidationError(f"{op}: {name_expressions=} must be a str or a list of str") from None
    for e in exprs:
        if not isinstance(e, str) or not e or "\0" in e:
            raise ValidationError(
                f"{op}: name_expressions={exprs!r}: each must be a non-empty str, got {e!r}"
            )
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
            raise ValidationError(
                f"{op}: options={opts!r}: give the architecture as arch=, not in options"
            )
    return opts


def compile_cuda(
    source: str | os.PathLike[str],
    arch: str = "sm_90",
    target: str = "cubin",
    options: Any = None,
    name_expressions: Any = None,
    *,
    name: str = "tenferro.cu",
    cache: bool = True,
    _driver_version: int = 0,
    _op: str = "compile_cuda",
) -> CompiledCuda:
    """Compile CUDA C with NVRTC to a CUBIN or PTX for ``arch``; needs no GPU.

    ``source`` is CUDA C text, or a path (`pathlib.Path`) of a kernel file: its text is
    compiled under the file's name, with its folder searched for the headers it includes.
    Refused: a source that is neither, a file that cannot be read as UTF-8 text, an unknown
    target, an arch that is not ``sm_NN``/``compute_NN``, ``-arch`` inside ``options``. A
    failed compile raises `CompileError` carrying NVRTC's log.

    Args:
        source: CUDA C text, or a kernel file's path.
        arch: ``sm_NN`` or ``compute_NN``, with an optional ``a`` or ``f`` suffix
            (``"sm_90a"``); PTX is made for the matching ``compute_NN``.
        target: ``"cubin"`` (needs a real ``sm_NN`` arch) or ``"ptx"``.
        options: NVRTC options, a str or a list of str (``["-I/path", "-DN=4"]``); not
            ``-arch``. ``-std=c++17`` and the CUDA headers' folders are always given.
        name_expressions: C++ names to instantiate and lower (``"axpy<float>"``), a str or a
            list of str; their entries are in ``lowered_names``.
        name: The file name NVRTC reports in its log (a path's own name by default).
        cache: False to compile even where the disk cache holds the result, and leave
            the cache unwritten.

    Returns:
        A `CompiledCuda`: the image, the PTX, the log, the kernels' signatures and
            variables, and whether it came from the cache.

    Raises:
        ValidationError: ``source``, ``name``, ``target``, ``arch``, ``options`` or
            ``name_expressions`` is refused (above), or a source file cannot be read.
        CompileError: NVRTC refused the source; ``log`` is its log.
        RuntimeStateError: NVRTC is not installed.
        BackendError: An NVRTC call failed other than by refusing the source.
    """
    op = _op  # how refusals name the call: compile_cuda, or session.compile
    folder = None
    if isinstance(source, os.PathLike):
        path = Path(source)
        source, folder = _read_kernel_file(path, op), str(path.resolve().parent)
        if name == "tenferro.cu":  # NVRTC's log names the file
            name = path.name
    if not isinstance(source, str):
        raise ValidationError(f"{op}: source must be str, got {type(source).__name__}")
    nul = source.find("\0")
    if nul >= 0:
        raise ValidationError(
            f"{op}: source has a NUL character at offset {nul}; NVRTC would "
            "compile only what comes before it"
        )
    try:
        source_bytes = source.encode()
    except UnicodeEncodeError as exc:
        raise ValidationError(
            f"{op}: source cannot be encoded as UTF-8 at offset {exc.start} "
            f"({source[exc.start]!r}: {exc.reason})"
        ) from None
    if not isinstance(name, str) or not name or "\0" in name:
        raise ValidationError(
            f"{op}: {name=} must be a non-empty str (the file name NVRTC reports)"
        )
    if target not in ("cubin", "ptx"):
        raise ValidationError(f"{op}: {target=} must be 'cubin' or 'ptx'")
    m = _ARCH.match(arch) if isinstance(arch, str) else None
    if m is None:
        raise ValidationError(f"{op}: {arch=} must look like 'sm_90' or 'compute_90'")
    opts = _norm_options(options, op)
    if folder is not None:  # after the user's own folders
        opts.append(f"-I{folder}")
    exprs = _norm_name_expressions(name_expressions, op)
    real_arch, virt_arch = f"sm_{m.group(2)}{m.group(3)}", f"compute_{m.group(2)}{m.group(3)}"
    if target == "cubin" and arch.startswith("compute_"):
        raise ValidationError(
            f"{op}: target='cubin' needs a real architecture (sm_NN), got {arch=}"
        )
    arch_opt = f"-arch={real_arch if target == 'cubin' else virt_arch}"
    base_opts = [arch_opt, "-std=c++17"]
    toolkit_dirs = [f"-I{d}" for d in _driver.cuda_include_dirs()]
    nvrtc_ver = _driver.nvrtc_version()
    key = hashlib.sha256(
        json.dumps(
            [
                _CACHE_FORMAT,
                source,
                opts,
                exprs,
                base_opts,
                toolkit_dirs,
                target,
                nvrtc_ver,
                _driver_version,
                _user_headers(source, _include_dirs(opts)) if cache else None,
            ],
        ).encode()
    ).hexdigest()
    path = cache_dir() / f"{key}.tfmod"
    if cache:
        hit = _read_cache(path, key)
        if hit is not None:
            with _stats_lock:
                _stats["hits"] += 1
            _log.debug("compile cache hit: %r for %s (%s)", name, arch, path)
            return _finish(hit, source, target, arch, from_cache=True)
    with _stats_lock:
        _stats["misses"] += 1
    started = time.perf_counter()
    # NVRTC searches -I folders in order: the user's, the kernel file's, the toolkit's, libcu++'s.
    probe_opts = [*base_opts, *opts, *toolkit_dirs, f"-I{STD_HEADERS_DIR}"]
    early = _early_c_type_probes(source, name, probe_opts)  # beside the kernels' compile
    ok, log, ptx, cubin, lowered = _driver.nvrtc_compile(
        source_bytes,
        name.encode(),
        [o.encode() for o in probe_opts],
        [e.encode() for e in exprs],
        target == "cubin",
    )
    if not ok:
        raise CompileError(
            f"{op}: NVRTC failed to compile {name!r} for {arch}{_compile_hint(log, name)}", log
        )
    _log.debug(
        "compiled %r for %s with NVRTC %s in %.3f s",
        name,
        arch,
        nvrtc_ver,
        time.perf_counter() - started,
    )
    ptx_text = ptx.decode()
    entry = {
        "key": key,
        "ptx": ptx_text,
        "log": log,
        "lowered": lowered,
        "image_hex": (ptx + b"\0" if cubin is None else cubin).hex(),  # cubin: target "cubin"
        "probes": _c_type_probes(source, name, probe_opts, ptx_text, early),
        "variable_probes": _variable_probes(source, name, probe_opts, ptx_text),
    }
    if cache:
        _write_cache(path, entry)
    return _finish(entry, source, target, arch, from_cache=False)


def _read_kernel_file(path: Path, op: str) -> str:
    """The text of the kernel file ``path``; a `ValidationError` naming it where it has none."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValidationError(f"{op}: source={str(path)!r} does not exist") from None
    except UnicodeDecodeError as exc:
        raise ValidationError(
            f"{op}: source={str(path)!r} is not UTF-8 text (byte {exc.start}: {exc.reason})"
        ) from None
    except OSError as exc:
        raise ValidationError(
            f"{op}: source={str(path)!r} cannot be read: {exc.strerror or exc}"
        ) from None


_INCLUDE_LINE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.MULTILINE)


def _include_dirs(opts: list[str]) -> list[str]:
    """The folders the user's options add to the include path, in order."""
    dirs = []
    items = iter(opts)
    for o in items:
        if o in ("-I", "--include-path"):
            following = next(items, None)
            if following is not None:
                dirs.append(following)
        elif o.startswith("--include-path="):
            dirs.append(o.split("=", 1)[1])
        elif o.startswith("-I"):
            dirs.append(o[2:])
    return dirs


def _user_headers(source: str, dirs: list[str]) -> list[list[str]]:
    """Each file of the user's folders the source includes, directly or not, with its digest.

    Part of the cache key, so a header edited since is compiled again. Every ``#include``
    line counts, also under an ``#if`` that is false (a file more, never one less); an
    include NVRTC would find elsewhere (its own headers) is not a file of these folders.
    """
    if not dirs:
        return []
    found: dict[str, str] = {}
    todo = [(source, "")]  # a text and the folder of the file it came from
    while todo:
        text, here = todo.pop()
        for quote, name in _INCLUDE_LINE.findall(text):
            for folder in ([here] if quote == '"' and here else []) + dirs:
                path = os.path.normpath(os.path.join(folder, name))
                if path in found:
                    break
                try:
                    with open(path, "rb") as f:
                        data = f.read()
                except OSError:  # not there (or not a file): the next folder
                    continue
                found[path] = hashlib.sha256(data).hexdigest()
                todo.append((data.decode("utf-8", "replace"), os.path.dirname(path)))
                break
    return sorted([path, digest] for path, digest in found.items())


# C++ library headers libcu++ has as <cuda/std/NAME>, with its names in cuda::std.
_IN_LIBCUXX = frozenset(
    (
        "array",
        "atomic",
        "bit",
        "complex",
        "functional",
        "numeric",
        "optional",
        "span",
        "tuple",
        "type_traits",
        "utility",
        "variant",
    )
)
# Host library headers with no device counterpart.
_HOST_ONLY = frozenset(
    (
        "ctime",
        "time.h",
        "iostream",
        "memory",
        "string",
        "vector",
        "map",
        "unordered_map",
        "set",
        "sstream",
        "fstream",
        "stdexcept",
        "exception",
        "chrono",
        "thread",
        "mutex",
    )
)
# NVRTC's line for it: "<includer>(<line>): catastrophic error: cannot open source file "<h>""
_MISSING_HEADER = re.compile(
    r'^(?:(.*)\((\d+)\): )?.*cannot open source file "([^"]+)"', re.MULTILINE
)


_FIRST_ERROR = re.compile(r"^.*\(\d+\): (?:catastrophic )?error", re.MULTILINE)
# NVRTC's line for a host function it met: in a header, the header is not for device code
_HOST_FUNCTION = re.compile(
    r"^(.*)\((\d+)\): error: A function without execution space "
    r"annotations",
    re.MULTILINE,
)


def _compile_hint(log: str, name: str) -> str:
    """What to do about a header in NVRTC's failure, or '' where no header is to blame.

    The first header NVRTC could not open; where a header (not the source ``name``) included
    it, that header and line are named: the user's file never mentions it. Else a header that
    declares host functions (cuda.h, the driver API's), which NVRTC does not compile, or
    the source's own host code (a file written for nvcc, with main).
    """
    m = _MISSING_HEADER.search(log)
    if m is None:
        h = _HOST_FUNCTION.search(log)
        first = _FIRST_ERROR.search(log)
        if h is None or first is None or first.start() != h.start():
            return ""  # another error came first: the host function may only follow from it
        if os.path.basename(h.group(1)) == os.path.basename(name):  # a file written for nvcc
            return (
                f": line {h.group(2)} is a host function, and NVRTC compiles device code "
                "only: mark a helper the kernels call __device__, and keep host code "
                "(main, cudaMalloc, <<<...>>>) inside #ifndef __CUDACC_RTC__ ... #endif"
            )
        return (
            f": {os.path.basename(h.group(1))} declares host functions (line {h.group(2)}), "
            "which NVRTC does not compile; a kernel file cannot include it"
        )
    includer, line, header = m.groups()
    by = ""
    if includer and os.path.basename(includer) != os.path.basename(name):
        by = f", included by {os.path.basename(includer)}({line}),"
    if header in _IN_LIBCUXX:
        return (
            f": <{header}>{by} is a host C++ library header; include "
            f"<cuda/std/{header}> and write cuda::std:: where the source writes std::"
        )
    if header.startswith("crt/"):  # the toolkit's, wanted by mma.h and others
        return (
            f": <{header}>{by} is one of the CUDA toolkit's crt/ headers, not installed "
            'here: pip install "cuda-toolkit[crt]==13.*" (CUDA 13) or '
            '"cuda-toolkit[nvcc]==12.*" (CUDA 12)'
        )
    if header in _HOST_ONLY:
        return (
            f": <{header}>{by} is a host C/C++ library header, which device code cannot "
            "use (libcu++ has device versions of many as <cuda/std/...>)"
        )
    return (
        f": it could not open {header!r}{by.rstrip(',')}; give the folder that holds it "
        "with options=['-I/path/to/folder']"
    )


# Instantiated on ``decltype(&kernel)`` for each extern "C" kernel, in a second compile, so that
# NVRTC's lowered name spells the kernel's C parameter types (tenferro.mangling reads them).
_PROBE = "__tenferro_c_types_of"
_PROBE_SOURCE = f"\ntemplate <typename T> __global__ void {_PROBE}() {{}}\n"
_ENTRY_NAME = re.compile(r"\.entry\s+([\w$]+)")


def _c_type_probes(
    source: str, name: str, options: list[str], ptx: str, early: _Early | None = None
) -> dict[str, str]:
    """For each extern "C" entry, the lowered name of the probe instantiated on its type.

    A kernel declared inside a namespace is named with it (`qualified_kernel_names`). Only
    what compiles: where the probe of them all fails, each is probed alone, so an entry whose
    name still does not resolve (one a macro declares in a namespace) keeps PTX's view alone.
    ``early`` is the probe started from the source's text (`_early_c_type_probes`); its
    answer serves where it has every entry, else the probe runs now on PTX's entries.
    """
    entries = [e for e in _ENTRY_NAME.findall(ptx) if not e.startswith("_Z")]
    if not entries:
        return {}
    got = early.result() if early is not None else None
    if got and all(e in got for e in entries):
        return {e: got[e] for e in entries}
    return _lowered_probes_apart(
        source + _PROBE_SOURCE, name, options, _probe_exprs(entries, qualified_kernel_names(source))
    )


def _probe_exprs(kernels: list[str], qualified: dict[str, str]) -> dict[str, str]:
    """Each extern "C" kernel's probe: the template instantiated on the kernel's type."""
    return {k: f"{_PROBE}<decltype(&{qualified.get(k, k)})>" for k in kernels}


# An extern "C" kernel as people write it; a guess from the text, which PTX's entries confirm.
_EXTERN_C_KERNEL = re.compile(
    r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+'
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\("
)


class _Early:
    """A call on a thread of its own; `result` waits for it (None where it raised)."""

    __slots__ = ("_thread", "_value")

    def __init__(self, fn: Any, *args: Any) -> None:
        self._value: Any = None
        self._thread = threading.Thread(
            target=self._run, args=(fn, args), daemon=True, name="tenferro-c-type-probe"
        )
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
    return _Early(
        _lowered_probes,
        source + _PROBE_SOURCE,
        name,
        options,
        _probe_exprs(guessed, qualified_kernel_names(source)),
    )


def _variable_probes(source: str, name: str, options: list[str], ptx: str) -> dict[str, str]:
    """For each of the source's variables, the lowered name of the probe on its type.

    Where one of them cannot be named at the end of the source, which spoils the compile of
    them all, each is probed alone, so only it keeps PTX's view.
    """
    exprs = probe_expressions(ptx_variables(ptx, source))
    return _lowered_probes_apart(source + PROBE_SOURCE, name, options, exprs)


def _lowered_probes_apart(
    source: str, name: str, options: list[str], exprs: dict[str, str]
) -> dict[str, str]:
    """`_lowered_probes` of them all, else of each alone where that compile failed.

    One expression that cannot be named at the end of the source spoils the compile of them
    all; apart, only it is left out.
    """
    lowered = _lowered_probes(source, name, options, exprs)
    if len(exprs) > 1 and not lowered:
        lowered = {
            k: one
            for k, x in exprs.items()
            for one in _lowered_probes(source, name, options, {k: x}).values()
        }
    return lowered


def _lowered_probes(
    source: str, name: str, options: list[str], exprs: dict[str, str]
) -> dict[str, str]:
    """Each key's name expression, lowered by a compile of ``source``; {} if that fails."""
    if not exprs:
        return {}
    try:
        ok, _log, _ptx, _cubin, lowered = _driver.nvrtc_compile(
            source.encode(),
            name.encode(),
            [o.encode() for o in options],
            [x.encode() for x in exprs.values()],
            False,
        )
    except BackendError:
        return {}
    if not ok:
        return {}
    return {k: lowered[x] for k, x in exprs.items() if x in lowered}


def _finish(entry: dict, source: str, target: str, arch: str, from_cache: bool) -> CompiledCuda:
    sigs = with_c_types(
        parse_ptx(entry["ptx"], "compile_cuda", require_entry=False), entry.get("probes") or {}
    )
    sigs = refine_with_source(sigs, source)  # names; the text's types where the compiler's lack
    variables = variables_with_c_types(
        ptx_variables(entry["ptx"], source), entry["variable_probes"]
    )
    image = bytes.fromhex(entry["image_hex"])  # _read_cache made sure it is hex
    return CompiledCuda(
        image,
        entry["ptx"],
        target,
        arch,
        entry["log"],
        dict(entry["lowered"]),
        sigs,
        from_cache,
        variables,
    )


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
    ptx, log, lowered, image, probes, variable_probes = (
        entry.get(k) for k in ("ptx", "log", "lowered", "image_hex", "probes", "variable_probes")
    )
    if not (
        isinstance(ptx, str)
        and isinstance(log, str)
        and isinstance(image, str)
        and all(
            isinstance(d, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in d.items())
            for d in (lowered, probes, variable_probes)
        )
    ):
        return None
    try:
        bytes.fromhex(image)
    except ValueError:
        return None
    return entry


def _write_cache(path: Path, entry: dict) -> None:
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".tfmod")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entry, f)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:  # a read-only or full cache directory costs a recompile, never a failure
        _log.warning(
            "the compile cache could not be written (%s); the next run compiles again", exc
        )
    finally:
        if tmp is not None:  # not renamed into place (an error, or Ctrl-C): the file goes
            with contextlib.suppress(OSError):
                os.unlink(tmp)
