"""Finding a kernel's entry in a module by the name its author knows.

An ``extern "C"`` kernel's entry is its name; a C++ kernel's is mangled
(``_Z25layernorm_forward_kernel3PfS_S_PKfS1_S1_ii``). `find_entry` takes, in this order: a name
expression given to the compile, an entry name, and then a C++ name read from the mangled
entries: the plain or qualified name of a kernel that is neither overloaded nor a template,
or any kernel spelled as `candidates` lists it (``fill<float>``, ``scale(float*, float)``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from .errors import ValidationError
from .mangling import Demangled, demangle

__all__ = ["candidates", "find_entry"]

_SPACES = re.compile(r"\s*([<>(),*&:])\s*")


def _norm(text: str) -> str:
    """``text`` without the spaces C++ lets around punctuation, and without a leading ``::``."""
    return _SPACES.sub(r"\1", text.strip()).removeprefix("::")


def _spellings(d: Demangled) -> tuple[str, str]:
    """A kernel's name with its template arguments, and the same with its parameters."""
    return d.spell_name(), d.spell()


def candidates(name: str, entries: Iterable[str]) -> list[tuple[str, Demangled]]:
    """The C++ entries whose qualified or unqualified name is ``name``, demangled.

    ``name`` may carry template arguments or a parameter list, as `Demangled.spell` writes
    them; spaces do not count. Entries that do not demangle are left out.
    """
    want = _norm(name)
    out = []
    for entry in entries:
        if not entry.startswith("_Z"):
            continue
        try:
            d = demangle(entry)
        except (ValueError, IndexError):
            continue
        if want in map(_norm, _spellings(d)) or d.name == want or d.name.endswith("::" + want):
            out.append((entry, d))
    return sorted(out, key=lambda c: c[1].spell())


def find_entry(
    name: str, entries: Iterable[str], lowered_names: Mapping[str, str], op: str
) -> str | None:
    """The entry ``name`` denotes among ``entries``, or None where nothing matches.

    An overloaded or templated C++ name (several entries, or one that is a template
    instance, when ``name`` gave no template arguments) is a `ValidationError` listing each
    candidate's C signature and how to pick one.
    """
    found = lowered_names.get(name)
    if found is not None:
        return found
    entries = list(entries)
    if name in entries:
        return name
    matches = candidates(name, entries)
    if not matches:
        return None
    exact = [e for e, d in matches if _norm(name) in (_norm(s) for s in _spellings(d))]
    if len(exact) == 1:
        return exact[0]
    if len(matches) == 1 and not matches[0][1].template_args:
        return matches[0][0]
    template = all(d.template_args for _, d in matches)
    listed = "; ".join(d.spell() for _, d in matches)
    example = _spellings(matches[0][1])[0 if template else 1]
    raise ValidationError(
        f"{op}: {name!r} is {'a template' if template else 'overloaded'}; the kernels of "
        f"this module called so are: {listed}. Pass one as written there "
        f"(module.function({example!r})) or as a name expression given to compile"
    )
