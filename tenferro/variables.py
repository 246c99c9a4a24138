"""A module's ``__device__`` and ``__constant__`` variables, as typed spans of its session.

`ptx_variables` reads the variables a PTX image defines (``.global`` and ``.const``) with the
size and, where PTX says it, the element type. For CUDA C that tenferro compiles, `with_c_types`
gives each the type of its C declaration, read from the compiler: a template instantiated on
``decltype(&variable)`` in a second compile (`probe_expressions`), whose mangled name
`tenferro.mangling` reads, as for kernels. `module_variable` is ``module.variable(name)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from . import _driver, dtypes
from .dtypes import ScalarType
from .errors import BackendError, KernelFault, ValidationError
from .mangling import CType, demangle
from .spans import DeviceBytes, TensorMut, c_strides

__all__ = [
    "Variable",
    "by_c_name",
    "listed",
    "module_variable",
    "probe_expressions",
    "ptx_variables",
    "with_c_types",
]


@dataclass(frozen=True)
class Variable:
    """One variable of a module: ``name`` as the module knows it, its C name and type.

    ``scalar_type`` and ``shape`` are its elements (``float[4][8]``: f32, (4, 8); a scalar:
    shape ()), or None and ``(nbytes,)`` where they are not known (structs, vector types,
    pointers, ``.b8`` arrays of PTX loaded as is).
    """

    name: str
    space: str  # "global" (__device__) or "const" (__constant__)
    nbytes: int
    scalar_type: ScalarType | None
    shape: tuple[int, ...]
    c_type: str = ""  # as the declaration writes it, where the compiler gave it

    @property
    def c_name(self) -> str:
        """The name the source gives it (``ns::flags`` for ``_ZN2ns5flagsE``)."""
        return _c_name(self.name)

    def declaration(self) -> str:
        """``__device__ float table[256]`` (the C type where known, else its bytes).

        Returns:
            The declaration as C writes it (``__constant__`` for constant memory), or
                ``__device__ name (N bytes)`` where the C type is not known.
        """
        qualifier = "__constant__" if self.space == "const" else "__device__"
        if self.c_type:
            base, bracket, extents = self.c_type.partition("[")
            return f"{qualifier} {base} {self.c_name}{bracket}{extents}"
        return f"{qualifier} {self.c_name} ({self.nbytes} bytes)"


def _c_name(name: str) -> str:
    """The source's name of the variable PTX calls ``name``: demangled, where it is mangled."""
    if not name.startswith("_Z"):
        return name
    try:
        parts = demangle(name).name.split("::")
    except (ValueError, IndexError):
        return name
    # An anonymous namespace is mangled as _INTERNAL_<file>::_GLOBAL__N_<file>.
    return "::".join(
        "(anonymous namespace)" if p.startswith("_GLOBAL__N") else p
        for p in parts
        if not p.startswith("_INTERNAL_")
    )


def by_c_name(variables: dict[str, Variable]) -> list[Variable]:
    """The variables in the order of their source names, as listings show them."""
    return sorted(variables.values(), key=lambda v: v.c_name)


def listed(variables: dict[str, Variable]) -> str:
    """``"; 2 variable(s): __device__ float t[4]; ..."`` for a repr, or "" for none."""
    if not variables:
        return ""
    decls = "; ".join(v.declaration() for v in by_c_name(variables))
    return f"; {len(variables)} variable(s): {decls}"


_PTX_VARIABLE = re.compile(
    r"^[ \t]*(?:\.visible[ \t]+|\.weak[ \t]+)?\.(global|const)[ \t]+(?:\.align[ \t]+\d+[ \t]+)?"
    r"\.(\w+)[ \t]+([\w$]+)[ \t]*(?:\[(\d+)\])?",
    re.M,
)
_PTX_TYPES = {
    "u8": "u8",
    "s8": "i8",
    "u16": "u16",
    "s16": "i16",
    "u32": "u32",
    "s32": "i32",
    "u64": "u64",
    "s64": "i64",
    "f16": "f16",
    "f32": "f32",
    "f64": "f64",
}
_PTX_BITS = {"b8": 1, "b16": 2, "b32": 4, "b64": 8}


# What the compiler and CUDA's math library define (string literals, sinf's tables).
_NOT_THE_SOURCES = ("$", "__cudart_", "__nv_")
# The toolkit's headers define hundreds (CCCL's static members): not the source's own.
_TOOLKIT_NAMESPACES = ("cuda::", "std::", "cub::", "thrust::", "cooperative_groups::", "nvcuda::")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def ptx_variables(ptx: str, source: str | None = None) -> dict[str, Variable]:
    """The variables a PTX image defines, by name, less the compiler's and the math library's.

    With the CUDA C ``source`` it was compiled from, only the source's own: those whose name
    the source writes, outside the toolkit's namespaces and template instantiations.
    """
    words = None if source is None else set(_IDENTIFIER.findall(source))
    out = {}
    for space, ptx_type, name, count in _PTX_VARIABLE.findall(ptx):
        if name.startswith(_NOT_THE_SOURCES):
            continue
        if words is not None and not _the_sources(name, words):
            continue
        named = _PTX_TYPES.get(ptx_type)
        itemsize = dtypes.by_name(named).itemsize if named else _PTX_BITS.get(ptx_type)
        if itemsize is None:  # .texref and the like: not memory a span can cover
            continue
        n = int(count) if count else 1
        t = dtypes.by_name(named) if named else None
        shape = ((n,) if count else ()) if t is not None else (n * itemsize,)
        out[name] = Variable(name, space, n * itemsize, t, shape)
    return out


def _the_sources(name: str, words: set[str]) -> bool:
    c_name = _c_name(name)
    return (
        "<" not in c_name
        and not c_name.startswith(_TOOLKIT_NAMESPACES)
        and c_name.rsplit("::", 1)[-1] in words
    )


# Instantiated on ``decltype(&variable)``: its lowered name spells the variable's C type.
PROBE = "__tenferro_c_type_of_variable"
PROBE_SOURCE = f"\ntemplate <typename T> __global__ void {PROBE}() {{}}\n"


def probe_expressions(variables: dict[str, Variable]) -> dict[str, str]:
    """The name expression that asks the compiler for each variable's type, by name.

    Variables the end of the source cannot name (an anonymous namespace) are left out.
    """
    out = {}
    for name, v in variables.items():
        c_name = v.c_name
        if c_name.startswith("_Z") or "(anonymous namespace)" in c_name:
            continue
        out[name] = f"{PROBE}<decltype(&{c_name})>"
    return out


def _elements(c: CType) -> tuple[ScalarType | None, tuple[int, ...]]:
    shape = []
    t = c.unqualified()
    while t.kind == "array" and t.inner is not None:
        shape.append(int(t.name))
        t = t.inner.unqualified()
    if t.kind not in ("builtin", "class"):
        return None, ()
    return dtypes.from_c_name(t.name), tuple(shape)


def with_c_types(variables: dict[str, Variable], probes: dict[str, str]) -> dict[str, Variable]:
    """``variables`` with the C type of each that ``probes`` (mangled names) give.

    A variable's elements are typed where its C element type is a scalar tenferro knows and the
    sizes agree with PTX's; others keep their bytes, with the C type spelled.
    """
    out = dict(variables)
    for name, lowered in probes.items():
        v = variables.get(name)
        if v is None:
            continue
        try:
            pointee = demangle(lowered).template_args[0].pointee
        except (ValueError, IndexError):
            continue
        if pointee is None:
            continue
        spelled = pointee.spell()
        t, shape = _elements(pointee)
        n = 1
        for d in shape:
            n *= d
        if t is not None and n * t.itemsize == v.nbytes:
            out[name] = replace(v, scalar_type=t, shape=shape, c_type=spelled)
        else:
            out[name] = replace(v, scalar_type=None, shape=(v.nbytes,), c_type=spelled)
    return out


def _find(module: Any, name: str, op: str) -> Variable | None:
    """The variable ``name`` means: its entry, its qualified name, or the end of one.

    ``::x`` means the global ``x`` only; ``x`` or ``ns::x`` also the one variable whose
    qualified name ends with it.
    """
    variables = module.variables
    if name in variables:
        return variables[name]
    wanted = name.removeprefix("::")
    found = [v for v in variables.values() if v.c_name == wanted]
    if not found and not name.startswith("::"):
        found = [v for v in variables.values() if v.c_name.endswith("::" + wanted)]
    if len(found) > 1:
        raise ValidationError(
            f"{op}: {name!r} names several variables of this module: "
            f"{', '.join(sorted(v.c_name for v in found))}; give the "
            "qualified name"
        )
    return found[0] if found else None


def module_variable(module: Any, name: str, dtype: Any = None) -> TensorMut | DeviceBytes:
    """A writable span over the module's variable ``name``, in its session, while it is open.

    ``name`` as the source writes it (``table``, ``ns::flags``) or as PTX does. Typed from its
    C declaration (``__device__ float table[256]``: f32, shape (256,)); where the type is not
    known (a struct, PTX loaded as is, a CUBIN) it is a `DeviceBytes`, or ``dtype`` gives its
    elements. Read it with ``s.download``, write it with ``s.copy``, pass it to kernels; a
    ``__constant__`` variable is written by copies and read by kernels by its name.
    """
    op = "module.variable"
    st = module.state
    st.check_use(op)
    if not isinstance(name, str):
        raise ValidationError(f"{op}: name must be a str, got {type(name).__name__}")
    want = None if dtype is None else dtypes.as_scalar_type(dtype, op)
    declared = _find(module, name, op)
    entry = declared.name if declared is not None else name
    try:
        ptr, nbytes = _driver.module_get_global(module.handle, entry, op)
    except KernelFault as exc:  # the first call to see an earlier launch's fault
        raise st.record_fault(exc) from None
    except BackendError as exc:
        if exc.result_name != "CUDA_ERROR_NOT_FOUND":
            raise
        have = ", ".join(v.c_name for v in by_c_name(module.variables)) or "none known"
        raise ValidationError(
            f"{op}: {name!r} is not a variable of this module (it has: {have})"
        ) from None
    if declared is not None and declared.scalar_type is not None:
        t = declared.scalar_type
        if want is not None and want is not t:
            raise ValidationError(
                f"{op}: dtype={want.name} was asked but {name!r} is {declared.c_type or t.name}"
            )
        if nbytes != declared.nbytes:
            raise BackendError(
                f"{op}: the driver gives {name!r} {nbytes} bytes; its "
                f"declaration {declared.declaration()} has {declared.nbytes}"
            )
        return TensorMut(
            ptr, declared.shape, c_strides(declared.shape, t.itemsize), t, st.device, module, st
        )
    if want is None:
        return DeviceBytes(ptr, (nbytes,), (1,), dtypes.by_name("u8"), st.device, module, st)
    t = want
    if nbytes % t.itemsize:
        raise ValidationError(
            f"{op}: {name!r} has {nbytes} bytes, not a whole number of {t.name} elements"
        )
    if ptr % t.alignment:
        raise ValidationError(
            f"{op}: {name!r} is not aligned to {t.alignment} bytes, as {t.name} elements must be"
        )
    return TensorMut(ptr, (nbytes // t.itemsize,), (t.itemsize,), t, st.device, module, st)
