"""The docs site: its reference covers the public API, and the guides' examples run.

Every ```python block in docs/ and README.md is preceded by a marker saying where it runs:
``<!-- docs-test: cpu -->`` (here, without a GPU), ``<!-- docs-test: gpu -->`` (needs a
device) or ``<!-- docs-test: skip: why -->``. A page's blocks run top to bottom in one
namespace: its cpu blocks alone on every machine, all of them on a GPU machine.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
PAGES = [*sorted(DOCS.rglob("*.md")), ROOT / "README.md"]
MARKER = re.compile(r"^<!-- docs-test: (cpu|gpu|skip: \S.*) -->$")
FENCE = re.compile(r"^(\s*)```(\w*)")


def code_blocks(page: Path) -> list[tuple[str | None, str, int]]:
    """``(marker, code, line)`` for each ```python block of ``page``; marker None if missing."""
    lines = page.read_text().splitlines()
    found = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, indent, lang = i, m.group(1), m.group(2)
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        if lang == "python":
            body = "\n".join(line[len(indent) :] for line in lines[start + 1 : i])
            prev = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            marker = MARKER.match(prev.strip())
            found.append((marker.group(1) if marker else None, body, start + 1))
        i += 1
    return found


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _pages_with(kind: str) -> list[Path]:
    return [p for p in PAGES if any(m == kind for m, _, _ in code_blocks(p))]


# Packages a guide may show that are not tenferro's dependencies: a page that imports one the
# machine lacks is skipped with its name, never passed.
OPTIONAL = {"IPython", "torch", "cupy", "jax", "ml_dtypes", "nvtx", "nbformat", "nbclient"}


def _run(page: Path, kinds: tuple[str, ...], tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # what an example writes stays out of the checkout
    module = types.ModuleType("tenferro_docs_example")  # a real module: torch.compile looks it up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for marker, code, line in code_blocks(page):
        if marker not in kinds:
            continue
        compiled = compile(code, f"{_page_id(page)}:{line}", "exec")
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compiled, module.__dict__)
        except ModuleNotFoundError as exc:
            if exc.name not in OPTIONAL:
                raise
            pytest.skip(f"the page's examples need {exc.name}, not installed here")


def test_the_site_has_its_pages():
    guides = {p.stem for p in (DOCS / "guides").glob("*.md")}
    assert {"getting-started", "launching", "errors", "environment"} <= guides
    assert (DOCS / "index.md").is_file() and (REFERENCE / "index.md").is_file()


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_python_block_says_where_it_runs(page):
    for marker, code, line in code_blocks(page):
        assert marker is not None, f"{_page_id(page)}:{line}: no <!-- docs-test: ... --> marker"
        ast.parse(code, f"{_page_id(page)}:{line}")  # every block is whole Python


def test_the_block_reader_sees_markers_and_fences(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "<!-- docs-test: cpu -->\n```python\nx = 1\n```\n\n```python\ny = 2\n```\n"
        "<!-- docs-test: skip: a fragment -->\n\n```python\nz\n```\n```text\nnot code\n```\n"
    )
    assert code_blocks(page) == [
        ("cpu", "x = 1", 2),
        (None, "y = 2", 6),
        ("skip: a fragment", "z", 11),
    ]


@pytest.mark.parametrize("page", _pages_with("cpu"), ids=_page_id)
def test_cpu_examples_run(page, tmp_path, monkeypatch):
    _run(page, ("cpu",), tmp_path, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("page", _pages_with("gpu"), ids=_page_id)
def test_gpu_examples_run(device, page, tmp_path, monkeypatch):
    _run(page, ("cpu", "gpu"), tmp_path, monkeypatch)


# The reference: every public name has a page, and every documented call says what it takes,
# gives and raises (Google style: Args / Returns / Raises).


def _directives() -> dict[str, dict]:
    """``::: path`` directives of the reference, with the options the audit follows."""
    found: dict[str, dict] = {}
    for page in REFERENCE.glob("*.md"):
        text = page.read_text() + "\n"
        for m in re.finditer(r"^::: ([\w.]+)\n((?:    .*\n)*)", text, re.M):
            options = m.group(2)
            filters = re.search(r"filters:\s*\[([^\]]*)\]", options)
            hidden = [
                f.strip().strip("\"'")[1:]
                for f in (filters.group(1).split(",") if filters else [])
                if f.strip().strip("\"'").startswith("!")
            ]
            found[m.group(1)] = {
                "hidden": [re.compile(h) for h in hidden],
                "inherited": "inherited_members: true" in options,
            }
    return found


def _public_names() -> list[str]:
    tree = ast.parse((ROOT / "tenferro" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__":
            return list(ast.literal_eval(node.value))
    raise AssertionError("tenferro/__init__.py has no __all__")


def test_every_public_name_is_in_the_reference():
    directives = _directives()
    text = "\n".join(p.read_text() for p in REFERENCE.glob("*.md"))
    missing = [
        n
        for n in _public_names()
        if f"tenferro.{n}" not in directives
        and f"`tf.{n}`" not in text
        and f"`tenferro.{n}`" not in text
    ]
    assert not missing, f"public names with no reference entry: {missing}"


def _load():
    griffe = pytest.importorskip("griffe", reason="the reference audit reads the code with griffe")
    tf = griffe.load("tenferro", search_paths=[str(ROOT)], docstring_parser="google")
    kernels = griffe.load("kernels", search_paths=[str(ROOT)], docstring_parser="google")
    return griffe, tf, kernels


def _documented(griffe, tf, kernels):
    """``(path, function)`` for every function or method the reference renders."""
    for path, options in _directives().items():
        obj = kernels if path == "kernels" else tf[path.removeprefix("tenferro.")]
        yield from _walk(griffe, path, obj, options)


def _walk(griffe, path, obj, options):
    if obj.is_alias:
        obj = obj.final_target
    if obj.is_function:
        yield path, obj
        return
    if not (obj.is_class or obj.is_module):
        return
    members = obj.all_members if options and options["inherited"] else obj.members
    for name, member in members.items():
        if options and any(h.search(name) for h in options["hidden"]):
            continue
        if name.startswith("_") and name != "__call__":
            continue
        if obj.is_module and obj.exports is not None and name not in obj.exports:
            continue
        if obj.is_module and member.is_alias and obj.exports is None:
            continue
        yield from _walk(griffe, f"{path}.{name}", member, {"hidden": [], "inherited": False})


def _gaps(griffe, fn) -> list[str]:
    kinds = griffe.DocstringSectionKind
    if fn.docstring is None:
        return ["a docstring"]
    sections = fn.docstring.parsed
    kinds_found = {s.kind for s in sections}
    described = {p.name for s in sections if s.kind is kinds.parameters for p in s.value}
    gaps = []
    params = [
        p.name
        for p in fn.parameters
        if p.name not in ("self", "cls")
        and not p.name.startswith("_")
        and p.kind not in (griffe.ParameterKind.var_positional, griffe.ParameterKind.var_keyword)
    ]
    if [p for p in params if p not in described]:
        gaps.append(f"Args for {[p for p in params if p not in described]}")
    returns = fn.returns
    if (
        returns is not None
        and str(returns) != "None"
        and "property" not in fn.labels
        and not ({kinds.returns, kinds.yields} & kinds_found)
    ):
        gaps.append("Returns")
    if re.search(r"^\s+raise \w", fn.source or "", re.M) and kinds.raises not in kinds_found:
        gaps.append("Raises")
    return gaps


def test_documented_calls_say_what_they_take_give_and_raise():
    griffe, tf, kernels = _load()
    gaps = {path: g for path, fn in _documented(griffe, tf, kernels) if (g := _gaps(griffe, fn))}
    assert not gaps, "docstrings missing sections:\n" + "\n".join(
        f"  {p}: {g}" for p, g in gaps.items()
    )


def test_the_audit_sees_a_missing_section(tmp_path):
    griffe, _, _ = _load()
    (tmp_path / "m.py").write_text(
        'def f(a: int) -> int:\n    """Twice.\n\n    Args:\n        a: A number.\n    """\n'
        "    if a < 0:\n        raise ValueError(a)\n    return 2 * a\n"
    )
    module = griffe.load("m", search_paths=[str(tmp_path)], docstring_parser="google")
    assert _gaps(griffe, module["f"]) == ["Returns", "Raises"]
