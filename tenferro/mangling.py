"""Kernel names as the Itanium C++ ABI mangles them: the name and the C parameter types.

A C++ kernel's entry name (``_Z4axpyPfPKffj``) carries its qualified name and the type of
every parameter; NVRTC's lowered name expressions give the same for templates. `demangle`
reads the part of the grammar kernel names use: nested and template names, builtin types,
pointers, const and volatile, class types, arrays, template parameters, literals among template
arguments, and substitutions. Anything else is a `ValueError` (callers keep what PTX says).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CType", "Demangled", "demangle"]

_BUILTIN = {
    "v": "void",
    "w": "wchar_t",
    "b": "bool",
    "c": "char",
    "a": "signed char",
    "h": "unsigned char",
    "s": "short",
    "t": "unsigned short",
    "i": "int",
    "j": "unsigned int",
    "l": "long",
    "m": "unsigned long",
    "x": "long long",
    "y": "unsigned long long",
    "n": "__int128",
    "o": "unsigned __int128",
    "f": "float",
    "d": "double",
    "e": "long double",
    "g": "__float128",
    "z": "...",
}
_BUILTIN_D = {
    "Dh": "half",
    "Di": "char32_t",
    "Ds": "char16_t",
    "Du": "char8_t",
    "Dn": "decltype(nullptr)",
}


@dataclass(frozen=True)
class CType:
    """One C type of a mangled name; ``kind`` names what it is.

    builtin, class, pointer, const, volatile, function, array (``name`` its extent) or value.
    """

    kind: str
    name: str = ""  # builtin or class name (qualified), a template argument's value, an extent
    inner: CType | None = None  # what a pointer points to, or what const/volatile qualifies
    args: tuple[CType, ...] = ()  # a class template's arguments, a function's parameters

    def spell(self) -> str:
        """The type as C++ writes it (``const float*``, ``ns::P``, ``Vec<float, 4>``)."""
        if self.kind == "pointer":
            inner = self.inner
            return f"{inner.spell()}*" if inner is not None else "*"
        if self.kind in ("const", "volatile"):
            inner = self.inner
            assert inner is not None
            if inner.kind == "pointer":
                return f"{inner.spell()} {self.kind}"
            return f"{self.kind} {inner.spell()}"
        if self.kind == "function":
            return f"{self.name}({', '.join(a.spell() for a in self.args)})"
        if self.kind == "array":  # float[4][8]: the element, then each extent
            extents, t = "", self
            while t.kind == "array" and t.inner is not None:
                extents, t = f"{extents}[{t.name}]", t.inner
            return f"{t.spell()}{extents}"
        if self.args:
            return f"{self.name}<{', '.join(a.spell() for a in self.args)}>"
        return self.name

    @property
    def pointee(self) -> CType | None:
        """What a pointer points to, its const or volatile kept; None for a non-pointer."""
        t = self
        while t.kind in ("const", "volatile") and t.inner is not None:
            t = t.inner  # a const pointer is still a pointer
        return t.inner if t.kind == "pointer" else None

    @property
    def is_const(self) -> bool:
        """True for a const-qualified type (``const float`` as a pointee)."""
        t = self
        while t.kind == "volatile" and t.inner is not None:
            t = t.inner
        return t.kind == "const"

    def unqualified(self) -> CType:
        """The type without const and volatile."""
        t = self
        while t.kind in ("const", "volatile") and t.inner is not None:
            t = t.inner
        return t


@dataclass(frozen=True)
class Demangled:
    """A mangled function name read: ``name`` qualified, template arguments, parameters."""

    name: str
    template_args: tuple[CType, ...]
    params: tuple[CType, ...]

    def spell_name(self) -> str:
        """The name with its template arguments: ``ns::axpy<float>``."""
        if not self.template_args:
            return self.name
        return f"{self.name}<{', '.join(a.spell() for a in self.template_args)}>"

    def spell(self) -> str:
        """``ns::axpy<float>(float*, const float*, float, unsigned int)``."""
        return f"{self.spell_name()}({', '.join(p.spell() for p in self.params)})"


class _Reader:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.subs: list[CType] = []  # substitution candidates, in order
        self.template_args: tuple[CType, ...] = ()

    def fail(self, what: str) -> ValueError:
        return ValueError(f"cannot demangle {self.s!r} at offset {self.i}: {what}")

    def peek(self, n: int = 1) -> str:
        return self.s[self.i : self.i + n]

    def take(self, token: str) -> bool:
        if self.s.startswith(token, self.i):
            self.i += len(token)
            return True
        return False

    def number(self) -> int:
        start = self.i
        while self.i < len(self.s) and self.s[self.i].isdigit():
            self.i += 1
        if start == self.i:
            raise self.fail("a length was expected")
        return int(self.s[start : self.i])

    def source_name(self) -> str:
        n = self.number()
        name = self.s[self.i : self.i + n]
        if len(name) != n:
            raise self.fail("a name runs past the end")
        self.i += n
        return name

    def seq_id(self, close: str) -> int:
        """The index of ``S_``/``T_`` (0) or ``S<base36>_``/``T<n>_`` (that + 1)."""
        if self.take("_"):
            return 0
        start = self.i
        while self.i < len(self.s) and self.s[self.i] != "_":
            self.i += 1
        digits = self.s[start : self.i]
        if not self.take("_") or not digits:
            raise self.fail(f"a {close} index was expected")
        base = 36 if close == "substitution" else 10
        return int(digits, base) + 1

    def substitution(self) -> CType:
        k = self.seq_id("substitution")
        if k >= len(self.subs):
            raise self.fail(f"substitution {k} of {len(self.subs)}")
        return self.subs[k]

    def template_param(self) -> CType:
        k = self.seq_id("template parameter")
        if k >= len(self.template_args):
            raise self.fail(f"template parameter {k} of {len(self.template_args)}")
        return self.template_args[k]

    def template_args_list(self) -> tuple[CType, ...]:
        out = []
        while not self.take("E"):
            if self.take("L"):  # a literal: L <type> <value> E
                t = self.type()
                start = self.i
                while self.i < len(self.s) and self.s[self.i] != "E":
                    self.i += 1
                value = self.s[start : self.i].replace("n", "-", 1)
                if not self.take("E"):
                    raise self.fail("an unterminated literal")
                out.append(
                    CType(
                        "value",
                        value if t.name != "bool" else ("true" if value == "1" else "false"),
                    )
                )
            else:
                out.append(self.type())
            if self.i >= len(self.s):
                raise self.fail("unterminated template arguments")
        return tuple(out)

    def nested(self, is_type: bool) -> tuple[str, tuple[CType, ...]]:
        """N ... E: the qualified name and, if it ends in one, its template arguments.

        Every prefix is a substitution candidate; so is the whole name of a type, but not
        the name of the function being read.
        """
        self.take("K")  # a const member function: no kernel is one, but it reads the same
        cur = plain = ""  # the name so far; and without its last template arguments
        args: tuple[CType, ...] = ()
        while not self.take("E"):
            if self.i >= len(self.s):
                raise self.fail("an unterminated nested name")
            if self.take("S"):
                cur = plain = self.substitution().spell()
                args = ()
                continue
            if self.take("I"):
                plain, args = cur, self.template_args_list()
                cur = f"{cur}<{', '.join(a.spell() for a in args)}>"
            else:
                name = self.source_name()
                cur = plain = f"{cur}::{name}" if cur else name
                args = ()
            if self.peek() != "E" or is_type:
                self.subs.append(CType("class", cur))
        return (cur, ()) if is_type else (plain, args)

    def type(self) -> CType:
        c = self.peek()
        if not c:
            raise self.fail("a type was cut off")
        if c in _BUILTIN:
            self.i += 1
            return CType("builtin", _BUILTIN[c])
        two = self.peek(2)
        if two in _BUILTIN_D:
            self.i += 2
            return CType("builtin", _BUILTIN_D[two])
        if self.take("DF16_"):
            return CType("builtin", "_Float16")
        if c in "KVr":
            quals = []
            while self.peek() in ("K", "V", "r") and self.peek():
                quals.append(self.s[self.i])
                self.i += 1
            t = self.type()
            for q in reversed(quals):  # r (restrict) is kept by no kernel ABI: dropped
                if q == "K":
                    t = CType("const", inner=t)
                elif q == "V":
                    t = CType("volatile", inner=t)
            self.subs.append(t)
            return t
        if c == "P":
            self.i += 1
            t = CType("pointer", inner=self.type())
            self.subs.append(t)
            return t
        if c in ("R", "O"):
            self.i += 1
            t = CType("pointer", inner=self.type())  # a reference passes as a pointer
            self.subs.append(t)
            return t
        if c == "S":
            self.i += 1
            t = self.substitution()
            if self.peek() == "I":  # a substituted template name with its arguments
                self.i += 1
                t = CType("class", t.spell(), args=self.template_args_list())
                self.subs.append(t)
            return t
        if c == "T":
            self.i += 1
            t = self.template_param()
            self.subs.append(t)
            return t
        if c == "N":
            self.i += 1
            name, _ = self.nested(is_type=True)
            return CType("class", name)
        if c == "A":  # an array of a known extent: A <extent> _ <element>
            self.i += 1
            extent = self.number()
            if not self.take("_"):
                raise self.fail("an array extent without its '_'")
            t = CType("array", str(extent), inner=self.type())
            self.subs.append(t)
            return t
        if c == "F":
            self.i += 1
            self.take("Y")
            ret = self.type()
            params = []
            while not self.take("E"):
                params.append(self.type())
                if self.i >= len(self.s):
                    raise self.fail("an unterminated function type")
            t = CType("function", ret.spell(), args=tuple(params))
            self.subs.append(t)
            return t
        if c.isdigit():
            name = self.source_name()
            t = CType("class", name)
            self.subs.append(t)
            if self.peek() == "I":
                self.i += 1
                t = CType("class", name, args=self.template_args_list())
                self.subs.append(t)
            return t
        raise self.fail(f"type code {c!r} is not read here")


def demangle(mangled: str) -> Demangled:
    """Read a mangled function name (``_Z...``); `ValueError` where it is not one read here."""
    r = _Reader(mangled)
    if not r.take("_Z"):
        raise r.fail("not a mangled name")
    if r.take("N"):
        name, targs = r.nested(is_type=False)
    else:
        name = r.source_name()
        targs = ()
        if r.peek() == "I":
            r.subs.append(CType("class", name))  # a template's name is a candidate
            r.i += 1
            targs = r.template_args_list()
    r.template_args = targs
    if targs:
        r.type()  # a template function encodes its return type first
    params = []
    while r.i < len(mangled):
        if mangled.startswith(".", r.i):  # a clone suffix (.constprop.0): not part of the type
            break
        params.append(r.type())
    if params == [CType("builtin", "void")]:
        params = []
    return Demangled(name, targs, tuple(params))
