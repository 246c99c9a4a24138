"""Jupyter: ``%load_ext tenferro`` gives the ``%%cuda`` cell magic.

    %%cuda axpy_mod -D SCALE=2 -std=c++17 -e "fill<float>" --session s
    extern "C" __global__ void axpy(float* y, const float* x, float a, unsigned n) { ... }

The cell's CUDA C is compiled by NVRTC (disk-cached) into the notebook's open session and the
`Module` bound to the name on the magic line; the cell prints its kernels' C signatures.
Without an open session the cell is compiled for ``--arch`` (sm_90 unless given) and the
`CompiledCuda` bound instead, which needs no GPU. A compile error shows NVRTC's log, with the
cell's line numbers and the offending lines, instead of a traceback.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from .compiler import compile_cuda
from .errors import CompileError, ValidationError
from .session import Session
from .variables import by_c_name

__all__ = ["CellCompileError", "CellLineError", "CudaCell", "load_ipython_extension", "parse_line"]

_OP = "%%cuda"
_IDENT = re.compile(r"[A-Za-z_]\w*")
_STDS = ("c++11", "c++14", "c++17", "c++20")
_LOG_PLACE = re.compile(r"^[^\s()]+\.cu\((\d+)\)", re.M)


@dataclass(frozen=True)
class CudaCell:
    """The magic line read: the name to bind, the session's variable, and what NVRTC gets."""

    name: str = "cuda_module"
    session: str | None = None
    options: tuple[str, ...] = ()
    name_expressions: tuple[str, ...] = ()
    arch: str | None = None


def _value(tokens: list[str], i: int, flag: str) -> str:
    if i + 1 >= len(tokens):
        raise ValidationError(f"{_OP}: {flag} needs a value")
    return tokens[i + 1]


def _identifier(value: str, what: str) -> str:
    if not _IDENT.fullmatch(value):
        raise ValidationError(f"{_OP}: {what} {value!r} is not a Python identifier")
    return value


def parse_line(line: str) -> CudaCell:
    """Read the magic line; anything it does not take is a `ValidationError` naming it.

    ``[NAME] [-s SESSION] [-D MACRO[=VALUE]]... [-std=c++17] [-e NAME_EXPRESSION]...
    [--arch sm_NN]``
    """
    try:
        tokens = shlex.split(line)
    except ValueError as exc:
        raise ValidationError(f"{_OP}: the line does not read ({exc}): {line!r}") from None
    name = session = arch = None
    options: list[str] = []
    exprs: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in ("-s", "--session"):
            session = _identifier(_value(tokens, i, tok), f"{tok}")
            i += 1
        elif tok.startswith("-D"):
            macro = tok[2:]
            if not macro:
                macro = _value(tokens, i, "-D")
                i += 1
            _identifier(macro.split("=", 1)[0], "-D macro")
            options.append(f"-D{macro}")
        elif tok.startswith("-std="):
            if tok[5:] not in _STDS:
                raise ValidationError(
                    f"{_OP}: {tok} is not a standard NVRTC takes; one of "
                    f"{', '.join('-std=' + s for s in _STDS)}"
                )
            options.append(tok)
        elif tok in ("-e", "--expr"):
            exprs.append(_value(tokens, i, tok))
            i += 1
        elif tok == "--arch":
            arch = _value(tokens, i, tok)
            i += 1
        elif tok.startswith("-"):
            raise ValidationError(
                f"{_OP}: unknown option {tok!r}; the line takes a name, -s/"
                "--session NAME, -D MACRO[=VALUE], -std=c++NN, -e/--expr "
                "NAME_EXPRESSION and --arch sm_NN"
            )
        elif name is None:
            name = _identifier(tok, "the name to bind")
        else:
            raise ValidationError(f"{_OP}: {tok!r} is a second name; the line binds one ({name!r})")
        i += 1
    return CudaCell(name or CudaCell.name, session, tuple(options), tuple(exprs), arch)


class CellLineError(ValidationError):
    """A magic line or session the cell cannot use; Jupyter shows the message alone."""

    def _render_traceback_(self) -> list[str]:  # IPython's hook for a custom display
        return [f"ValidationError: {self}"]


class CellCompileError(CompileError):
    """A cell NVRTC refused; Jupyter shows the log with the cell's line numbers, no traceback."""

    def _render_traceback_(self) -> list[str]:  # IPython's hook for a custom display
        head = str(self).split("\n", 1)[0]
        return [f"CompileError: {head}", *_LOG_PLACE.sub(r"line \1", self.log).splitlines()]


def _session(ns: dict[str, Any], wanted: str | None) -> Session | None:
    """The session a cell compiles into: the one named, the only open one, or None."""
    if wanted is not None:
        if wanted not in ns:
            raise ValidationError(
                f"{_OP}: --session {wanted}: the notebook has no variable {wanted!r}"
            )
        s = ns[wanted]
        if not isinstance(s, Session):
            raise ValidationError(
                f"{_OP}: --session {wanted}: {wanted!r} is a {type(s).__name__}, not a tf.Session"
            )
        if not s.is_open:
            raise ValidationError(f"{_OP}: --session {wanted}: that session is closed")
        return s
    found: dict[int, tuple[str, Session]] = {}
    for key, value in ns.items():
        if isinstance(value, Session) and value.is_open and not key.startswith("_"):
            found.setdefault(id(value), (key, value))
    if len(found) > 1:
        names = sorted(k for k, _ in found.values())
        raise ValidationError(
            f"{_OP}: the notebook has {len(found)} open sessions ({names}); "
            "name one with --session NAME"
        )
    return next(iter(found.values()))[1] if found else None


def run_cell(shell: Any, line: str, cell: str) -> None:
    """The ``%%cuda`` magic: compile ``cell``, bind the result, print its kernels and variables."""
    try:
        spec = parse_line(line)
        s = _session(shell.user_ns, spec.session)
    except ValidationError as exc:
        raise CellLineError(str(exc)) from None
    opts, exprs = list(spec.options), list(spec.name_expressions)
    try:
        if s is None:
            result: Any = compile_cuda(
                cell,
                arch=spec.arch or "sm_90",
                options=opts,
                name_expressions=exprs,
                name="cell.cu",
            )
        else:  # once per session and text: re-running the cell finds the loaded module
            key = ("tenferro.jupyter", cell, tuple(opts), tuple(exprs), spec.arch)
            result = s.resource(key, lambda ss: ss.compile(cell, opts, exprs, arch=spec.arch))
    except CompileError as exc:
        raise CellCompileError(str(exc).split("\n", 1)[0], exc.log) from None
    shell.user_ns[spec.name] = result
    if s is None:
        where = f"compiled for {result.arch}; no open session to load it into"
    else:
        where = f"loaded into the session on device {s.device}"
    sigs = result.signatures
    print(f"{spec.name}: {len(sigs)} kernel(s), {where}")
    for entry in sorted(sigs):
        print(f"  {sigs[entry].declaration()}")
    variables = by_c_name(result.variables)
    if variables:
        print(f"  and {len(variables)} variable(s):")
        for v in variables:
            print(f"  {v.declaration()}")


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%%cuda`` with an IPython shell (what ``%load_ext tenferro`` calls).

    Args:
        ipython: The IPython shell (``InteractiveShell``) to register the cell magic with.
    """

    def cuda(line: str, cell: str) -> None:
        run_cell(ipython, line, cell)

    cuda.__doc__ = __doc__
    ipython.register_magic_function(cuda, magic_kind="cell", magic_name="cuda")
