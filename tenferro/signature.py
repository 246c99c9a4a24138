"""A kernel's parameter list, and the ABI check of one argument against one parameter.

A parameter list comes from the PTX ``.entry`` (`parse_ptx`), is refined by the CUDA C
declaration where the source is at hand (`refine_with_source`: PTX cannot tell a pointer from a
64-bit integer, nor a signed from an unsigned int), or is asked of the driver for a bare CUBIN
(`from_driver_layout`: sizes only).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, replace

from . import dtypes
from .dtypes import ScalarType
from .errors import ValidationError
from .mangling import CType, demangle

__all__ = [
    "Param",
    "Signature",
    "display_name",
    "element_types",
    "from_driver_layout",
    "kernels_html",
    "parse_ptx",
    "qualified_kernel_names",
    "refine_with_source",
    "value_types",
    "with_c_types",
]

# Parameter kinds.
PTR = "ptr"  # a device pointer
INT = "int"  # an integer of `size` bytes (signedness in `scalar` when known)
FLOAT = "float"  # a float of `size` bytes
PTR_OR_INT = "ptr_or_int64"  # PTX .u64/.b64: a pointer or a 64-bit integer; PTX cannot say
BYTES = "bytes"  # a by-value aggregate (.b8 array): raw bytes of exactly `size`
OPAQUE = "opaque"  # only the size is known (driver layout of a CUBIN)


@dataclass(frozen=True, slots=True)
class Param:
    """One kernel parameter: its kind, size and alignment in bytes, and exact type if known.

    ``writes`` is True / False where the compiler says whether the kernel stores through the
    pointer (numba kernels), None where nothing says (PTX, CUDA C). ``c_type`` is the C type
    the compiler gave the parameter (CUDA C compiled by tenferro), None where it is not known.
    """

    kind: str
    size: int
    align: int
    scalar: ScalarType | None = None
    name: str = ""
    writes: bool | None = None
    c_type: CType | None = None

    def describe(self) -> str:
        """A short human description (``"u32"``, ``"pointer"``, ``"16-byte struct"``)."""
        if self.kind == PTR:
            return "pointer"
        if self.kind == PTR_OR_INT:
            return "pointer or 64-bit integer"
        if self.kind in (BYTES, OPAQUE):
            return f"{self.size}-byte {'struct' if self.kind == BYTES else 'value'}"
        if self.scalar is not None:
            return self.scalar.name
        return f"{self.size * 8}-bit {self.kind}"

    def declaration(self) -> str:
        """The parameter as a declaration reads: ``const float* x``, ``u32 n``, ``pointer``.

        The C type where the compiler gave one, else `describe`; numba parameters say whether
        the kernel writes through them.
        """
        name = f" {self.name}" if self.name else ""
        access = "" if self.writes is None else " (written)" if self.writes else " (read)"
        what = self.c_type.spell() if self.c_type is not None else self.describe()
        return f"{what}{name}{access}"

    def __repr__(self) -> str:
        return f"<{self.declaration()}>"


@dataclass(frozen=True, slots=True)
class Signature:
    """The parameter list of one kernel entry; ``origin`` says where it was read."""

    name: str
    params: tuple[Param, ...]
    origin: str

    def __len__(self) -> int:
        return len(self.params)

    def declaration(self) -> str:
        """The kernel as its declaration reads: ``axpy(float* y, const float* x, float a)``."""
        return f"{display_name(self.name)}({', '.join(p.declaration() for p in self.params)})"

    def __repr__(self) -> str:
        return f"Signature({self.declaration()}, from {self.origin})"


def display_name(entry: str) -> str:
    """A kernel's name as its source writes it: a C++ entry demangled (``ns::fill<float>``)."""
    if not entry.startswith("_Z"):
        return entry
    try:
        return demangle(entry).spell_name()
    except (ValueError, IndexError):
        return entry


def kernels_html(title: str, signatures: dict[str, Signature]) -> str:
    """An HTML table of kernels, one row each: its name and its parameters' declarations.

    For notebooks (the ``_repr_html_`` of modules and compile results).
    """
    named = sorted(
        ((display_name(entry), sig) for entry, sig in signatures.items()),
        key=lambda named_sig: named_sig[0],
    )  # overloads share a name
    rows = "".join(
        f"<tr><td><code>{html.escape(name)}</code></td><td><code>"
        f"{html.escape(', '.join(p.declaration() for p in sig.params)) or '(none)'}"
        f"</code></td></tr>"
        for name, sig in named
    )
    return (
        f"<b>{html.escape(title)}</b><table><tr><th>kernel</th><th>parameters</th></tr>"
        f"{rows}</table>"
    )


_ENTRY = re.compile(r"\.entry\s+([\w$.]+)\s*\(([^)]*)\)", re.S)
_PARAM = re.compile(
    r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s*"
    r"((?:\.ptr\s*)?(?:\.(?:global|const|shared|local)\s*)?(?:\.align\s+\d+\s*)?)"
    r"([\w$]+)\s*(?:\[(\d+)\])?"
)

_PTX_INT = {"u8": 1, "s8": 1, "u16": 2, "s16": 2, "u32": 4, "s32": 4, "b8": 1, "b16": 2, "b32": 4}
_PTX_64 = {"u64", "s64", "b64"}
_PTX_FLOAT = {"f32": 4, "f64": 8, "f16": 2}


def _ptx_param(m: re.Match[str], entry: str, op: str) -> Param:
    align_s, ty, annot, name, count = m.groups()
    if count is not None:  # .b8 name[N]: a by-value aggregate
        elem = _PTX_INT.get(ty) or _PTX_FLOAT.get(ty) or 8
        size = elem * int(count)
        return Param(BYTES, size, int(align_s or elem), None, name)
    if ty in _PTX_64:
        kind = PTR if ".ptr" in annot else PTR_OR_INT
        return Param(kind, 8, int(align_s or 8), None, name)
    if ty in _PTX_FLOAT:
        size = _PTX_FLOAT[ty]
        return Param(
            FLOAT,
            size,
            int(align_s or size),
            dtypes.by_name({"f32": "f32", "f64": "f64", "f16": "f16"}[ty]),
            name,
        )
    if ty in _PTX_INT:
        size = _PTX_INT[ty]
        return Param(INT, size, int(align_s or size), None, name)
    raise ValidationError(
        f"{op}: entry {entry!r} has a parameter of PTX type .{ty} that tenferro does not know"
    )


def parse_ptx(
    text: str, op: str = "signature.parse_ptx", *, require_entry: bool = True
) -> dict[str, Signature]:
    """Every ``.entry`` of a PTX text, by name, with its typed parameters in order.

    Refuses (`ValidationError`, naming ``op``) a parameter type it does not know, rather than
    guessing, and a text with no ``.entry`` unless ``require_entry`` is False (a compiled
    source may hold only device functions).
    """
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    out: dict[str, Signature] = {}
    for m in _ENTRY.finditer(text):
        name, body = m.group(1), m.group(2)
        params = tuple(_ptx_param(p, name, op) for p in _PARAM.finditer(body))
        out[name] = Signature(name, params, "ptx")
    if not out and require_entry:
        start = text.lstrip()[:40]
        raise ValidationError(
            f"{op}: the text has no .entry (no kernel to launch); PTX "
            f"starts with directives such as .version, this starts {start!r}"
        )
    return out


# --- CUDA C declarations ----------------------------------------------------------------------

# A __global__ declaration up to its parameter list: the kernel's name is its one group.
_KERNEL_DECL = (
    r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+"
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\("
)
_GLOBAL = re.compile(_KERNEL_DECL + r"([^)]*)\)", re.S)
# Comments, and the string and character literals a comment marker could sit in.
_COMMENTS = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def _without_comments(source: str) -> str:
    """``source`` with each comment replaced by a space (literals are kept as they are)."""
    return _COMMENTS.sub(lambda m: " " if m.group(0)[0] == "/" else m.group(0), source)


# What opens or closes a scope, and a __global__ declaration, in the order the text has them.
_SCOPES = re.compile(
    r"\bnamespace\s+((?:inline\s+)?[A-Za-z_]\w*(?:\s*::\s*(?:inline\s+)?"
    r"[A-Za-z_]\w*)*)\s*\{|\bnamespace\s*\{|[{}]|" + _KERNEL_DECL
)


def qualified_kernel_names(source: str) -> dict[str, str]:
    """The names, with their namespaces, of the kernels the text declares in named ones.

    ``{"k": "ops::k"}``: how an ``extern "C"`` kernel is named after the source's end.
    Braces of preprocessor lines (continued ones too) and of literals are not counted; an
    unnamed namespace adds nothing (its names are visible outside it). Where a name is
    declared in two scopes, the first counts.
    """
    text = "\n".join(
        "" if line.lstrip().startswith("#") else line
        for line in _COMMENTS.sub(" ", source).replace("\\\n", " ").splitlines()
    )
    scopes: list[str] = []  # one entry a brace open: a namespace's name, or ""
    out: dict[str, str] = {}
    for m in _SCOPES.finditer(text):
        token = m.group(0)
        if m.group(2) is not None:  # a kernel
            path = "::".join(p for p in scopes if p)
            if path:
                out.setdefault(m.group(2), f"{path}::{m.group(2)}")
        elif token == "}":
            if scopes:
                scopes.pop()
        elif m.group(1) is not None:
            scopes.append("::".join(part.split()[-1] for part in m.group(1).split("::")))
        else:  # "{" or an unnamed namespace
            scopes.append("")
    return out


_QUALIFIERS = re.compile(r"\b(const|volatile|__restrict__|__restrict|restrict|__grid_constant__)\b")


def _c_param(decl: str) -> Param | None:
    """The kind of one C parameter declaration, or None when it is not a plain type."""
    if "*" in decl:
        return Param(PTR, 8, 8)
    words = _QUALIFIERS.sub(" ", decl).split()
    if len(words) < 2:
        return None
    t = dtypes.from_c_name(" ".join(words[:-1]).removesuffix(" int"))  # long int: long
    if t is None:
        return None
    return Param(FLOAT if t.is_float else INT, t.itemsize, t.itemsize, t)


_TYPE_WORDS = frozenset(
    {
        "void",
        "char",
        "short",
        "int",
        "long",
        "float",
        "double",
        "bool",
        "signed",
        "unsigned",
        "struct",
    }
)
_LAST_NAME = re.compile(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*$")


def _decl_name(decl: str) -> str:
    """The parameter's name in one C declaration (``const float* x = 0`` -> ``x``); "" if none.

    A declaration that ends in a type word or a ``*``, or is one word (``int32_t``), names no
    parameter.
    """
    text = _QUALIFIERS.sub(" ", decl.partition("=")[0]).strip()
    m = _LAST_NAME.search(text)
    if m is None or m.group(1) in _TYPE_WORDS:
        return ""
    before = text[: m.start(1)].strip()
    return m.group(1) if before and not before.endswith("::") else ""


def _split_params(arglist: str) -> list[str]:
    """A parameter list split at its top-level commas (not those of ``Vec<float, 4>``)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(arglist):
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(arglist[start:i])
            start = i + 1
    out.append(arglist[start:])
    return out


def refine_with_source(sigs: dict[str, Signature], source: str) -> dict[str, Signature]:
    """Refine signatures with the ``__global__`` declarations of the CUDA C source.

    Every entry takes its parameters' names from its declaration (an unnamed one has none,
    not PTX's ``k_param_1``); a C++ entry from the declarations of its unqualified name with
    as many parameters, where they agree on the names. Where the compiler gave no C type
    (`with_c_types` runs first; one a macro declares in a namespace has none), an
    unmangled entry's parameter is refined from the text where the C type is a plain type or
    a pointer whose size agrees with the PTX: a 64-bit PTX parameter becomes a pointer or an
    exact integer type, a 32-bit one gets its signedness.
    """
    out = dict(sigs)
    by_name: dict[str, list[list[str]]] = {}
    for m in _GLOBAL.finditer(_without_comments(source)):
        name, arglist = m.group(1), m.group(2).strip()
        decls = [] if arglist in ("", "void") else _split_params(arglist)
        by_name.setdefault(name, []).append(decls)
        sig = sigs.get(name)
        if sig is None or len(decls) != len(sig.params):
            continue
        params = []
        for ptx, decl in zip(sig.params, decls, strict=True):
            c = None if ptx.c_type is not None else _c_param(decl)
            if (
                c is not None
                and ptx.kind in (PTR_OR_INT, PTR, INT, FLOAT)
                and c.size == ptx.size
                and (c.kind == FLOAT) == (ptx.kind == FLOAT)
            ):
                ptx = replace(ptx, kind=c.kind, scalar=c.scalar)
            elif (
                c is not None and ptx.kind == BYTES and c.scalar is not None and c.size == ptx.size
            ):  # __half / __nv_bfloat16 are structs in PTX
                ptx = replace(ptx, kind=FLOAT, scalar=c.scalar)
            params.append(replace(ptx, name=_decl_name(decl)))  # "" for an unnamed one
        out[name] = Signature(name, tuple(params), "cuda")
    for entry, sig in sigs.items():
        if not entry.startswith("_Z"):
            continue
        try:
            plain = demangle(entry).name.rsplit("::", 1)[-1]
        except (ValueError, IndexError):
            continue
        names = {
            tuple(map(_decl_name, decls))
            for decls in by_name.get(plain, ())
            if len(decls) == len(sig.params)
        }
        if len(names) == 1:
            out[entry] = Signature(
                entry,
                tuple(replace(p, name=n) for p, n in zip(sig.params, names.pop(), strict=True)),
                "cuda",
            )
    return out


def from_driver_layout(name: str, layout: list[tuple[int, int]]) -> Signature:
    """A signature from cuFuncGetParamInfo's (offset, size) list: sizes only, kinds unknown."""
    params = []
    for off, size in layout:
        # The offset's own alignment, capped at the size: what the driver laid out.
        align = 16
        while align > 1 and (off % align or align > size):
            align //= 2
        params.append(Param(OPAQUE, size, align))
    return Signature(name, tuple(params), "driver")


# Pointees that take a span of any dtype: untyped memory and bytes.
_ANY_ELEMENT = frozenset({"void", "char", "unsigned char"})
# CUDA's vector types (float2, uint4, longlong2, ...): the element, and the complex type a
# two-element float or double vector is laid out as (cuComplex is float2).
_VECTOR = re.compile(r"(u?)(char|short|int|long|longlong|float|double)([1-4])")
_VECTOR_ELEMENT = {
    "char": "i8",
    "short": "i16",
    "int": "i32",
    "long": "i64",
    "longlong": "i64",
    "float": "f32",
    "double": "f64",
}
_COMPLEX_VALUES = {"float2": "c64", "double2": "c128"}
_PAIRED_HALVES = {
    "__half2": "f16",
    "half2": "f16",
    "__nv_bfloat162": "bf16",
    "nv_bfloat162": "bf16",
}


def value_types(c: CType) -> frozenset[dtypes.ScalarType] | None:
    """The scalar types a by-value parameter of C type ``c`` takes; None if not a scalar.

    Exactly one, signedness and width included, except plain ``char``, whose signedness C
    leaves to the target: it takes i8 and u8. ``float2`` / ``double2`` (cuFloatComplex,
    cuDoubleComplex) by value take complex64 / complex128.
    """
    base = c.unqualified()
    if base.kind not in ("builtin", "class"):
        return None
    if base.name == "char":
        return frozenset({dtypes.by_name("i8"), dtypes.by_name("u8")})
    if base.name in _COMPLEX_VALUES:  # cuFloatComplex is float2, cuDoubleComplex double2
        return frozenset({dtypes.by_name(_COMPLEX_VALUES[base.name])})
    t = dtypes.from_c_name(base.name)
    return None if t is None else frozenset({t})


def element_types(c: CType | None) -> frozenset[dtypes.ScalarType] | None:
    """The span dtypes a pointer parameter of C type ``c`` takes; None where any is taken.

    ``T*`` takes spans of T; a vector type's pointer (``float4*``) takes its element, and
    ``float2*`` / ``double2*`` complex64 / complex128 too. ``void*``, ``char*`` and
    ``unsigned char*`` take any span, as do pointers to structs and to pointers, whose
    elements no dtype names.
    """
    pointee = None if c is None else c.pointee
    if pointee is None:
        return None
    base = pointee.unqualified()
    if base.kind not in ("builtin", "class") or base.name in _ANY_ELEMENT:
        return None
    t = dtypes.from_c_name(base.name)
    if t is not None:
        return frozenset({t})
    if base.name in _PAIRED_HALVES:
        return frozenset({dtypes.by_name(_PAIRED_HALVES[base.name])})
    m = _VECTOR.fullmatch(base.name)
    if m is None:
        return None
    unsigned, element, lanes = m.groups()
    name = _VECTOR_ELEMENT[element]
    if unsigned:
        if name[0] != "i":
            return None  # there is no unsigned float vector
        name = "u" + name[1:]
    t = dtypes.by_name(name)
    if lanes == "2" and element in ("float", "double"):
        return frozenset({t, dtypes.by_name("c64" if element == "float" else "c128")})
    return frozenset({t})


def _with_c_type(p: Param, c: CType) -> Param:
    """``p`` with its C type, and the kind and scalar type that C type settles."""
    if c.pointee is not None and p.kind in (PTR, PTR_OR_INT) and p.size == 8:
        return replace(p, kind=PTR, c_type=c)
    taken = value_types(c)
    if taken is not None and p.kind in (INT, FLOAT, PTR_OR_INT, BYTES):
        t = min(taken, key=lambda t: t.name)  # char: i8, as refine_with_source reads it
        if t.itemsize == p.size and t.kind == "complex":  # a struct's bytes, or a complex
            return replace(p, scalar=t, c_type=c)
        if t.itemsize == p.size:
            return replace(p, kind=FLOAT if t.is_float else INT, scalar=t, c_type=c)
    return replace(p, c_type=c)


def with_c_types(sigs: dict[str, Signature], probes: dict[str, str]) -> dict[str, Signature]:
    """``sigs`` with each parameter's C type, where the compiler's names give them.

    A C++ entry's own mangled name carries its parameter types; an ``extern "C"`` entry's come
    from ``probes``, the mangled name of a template instantiated on ``decltype(&entry)``. A
    name that does not read, or a parameter count that does not match the PTX, leaves that
    signature as it was.
    """
    out = {}
    for entry, sig in sigs.items():
        out[entry] = sig
        try:
            if entry.startswith("_Z"):
                c_params = demangle(entry).params
            elif entry in probes:  # the probe's template argument: a pointer to the kernel
                fn = demangle(probes[entry]).template_args[0].pointee
                if fn is None or fn.kind != "function":
                    continue
                c_params = fn.args  # (void) for none: no parameters, no types to give
            else:
                continue
        except (ValueError, IndexError):
            continue
        if len(c_params) == len(sig.params):
            # PTX's own names (entry_param_0) say nothing the position does not: dropped, and
            # refine_with_source gives the declaration's.
            out[entry] = replace(
                sig,
                params=tuple(
                    replace(_with_c_type(p, c), name="")
                    for p, c in zip(sig.params, c_params, strict=True)
                ),
            )
    return out
