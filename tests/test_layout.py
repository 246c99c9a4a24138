"""The package's layout rules: a part's state is its own, and session.py stays small."""

import ast
import importlib
import pathlib

import tenferro

PACKAGE = pathlib.Path(tenferro.__file__).parent
KERNELS = pathlib.Path(importlib.import_module("tenferro.kernels").__file__).parent


def _sources():
    """(name, path) of every module of the package and of the ready kernels."""
    for root, prefix in ((PACKAGE, ""), (KERNELS, "kernels/")):
        for path in sorted(root.rglob("*.py")):
            yield prefix + str(path.relative_to(root)), path


# torch's raw current-stream query (0.2 us against 8 for torch.cuda.current_stream), in the one
# module that reads torch tensors (checked against the public answer on the GPU), and Session's
# ``_state``, which session.py alone reads, to hand it to the parts and, through `state_of`, to
# the layers above Session (ready kernels, torch ops): no other module may reach into anything.
# numba_kernels.py reads a compiled kernel through its `library` and `type_annotation`.
PRIVATE_READS = {
    "interop/producers.py": {"torch._C", "torch._C._cuda_getCurrentRawStream"},
    "session.py": {"session._state"},
}


def _reaches(path):
    """(line, expression) of each read or write of another object's underscore attribute."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue  # an object's own state
        found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_module_reaches_into_another_objects_underscore_attributes():
    reaches = {}
    for name, path in _sources():
        allowed = PRIVATE_READS.get(name, set())
        found = [(line, expr) for line, expr in _reaches(path) if expr not in allowed]
        if found:
            reaches[name] = found
    assert reaches == {}, reaches


def test_the_check_sees_a_reach():
    # The walker itself: another object's private state is found, one's own and dunders are not.
    import tempfile

    src = "def f(s, self):\n    s._held.append(1)\n    self._own = 2\n    return s.__class__\n"
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(src)
    assert _reaches(pathlib.Path(f.name)) == [(2, "s._held")]


def _driver_names_used(path):
    tree = ast.parse(path.read_text(), str(path))
    return {
        (node.lineno, node.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "_driver"
    }


def test_the_driver_seam_lists_what_crosses_it():
    # _driver.__all__ is the seam: every name another module uses is in it, and only the
    # modules of the _driver package import the bindings (so no binding object is made above it).
    from tenferro import _driver

    outside = {}
    for name, path in _sources():
        if name.startswith("_driver/"):
            continue
        assert "cuda.bindings" not in path.read_text(), f"{name} imports cuda.bindings"
        unlisted = {used for _, used in _driver_names_used(path) if used not in _driver.__all__}
        if unlisted:
            outside[name] = sorted(unlisted)
    assert outside == {}, outside
    assert all(hasattr(_driver, name) for name in _driver.__all__)


def test_the_driver_package_gathers_the_seam_and_its_modules_import_one_way():
    # _driver/__init__.py imports exactly the seam's names and does nothing else; each private
    # module says what it holds and what it offers (__all__), and no two import each other,
    # directly or round a circle.
    import graphlib

    from tenferro import _driver

    init = ast.parse((PACKAGE / "_driver" / "__init__.py").read_text())
    gathered = {
        a.asname or a.name
        for node in init.body
        if isinstance(node, ast.ImportFrom)
        for a in node.names
    }
    assert gathered == set(_driver.__all__)
    assert all(isinstance(node, (ast.ImportFrom, ast.Assign)) for node in init.body[1:])
    imports = {}
    for path in sorted((PACKAGE / "_driver").glob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        assert ast.get_docstring(tree), f"_driver/{path.name} says nothing of what it holds"
        assert any(
            isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__"
            for node in tree.body
        ), f"_driver/{path.name} has no __all__"
        imports[path.stem] = {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 1
        }
    assert None not in set().union(*imports.values())  # "from . import x" would hide a module
    tuple(graphlib.TopologicalSorter(imports).static_order())  # CycleError on a circle


def _code_lines(path):
    """Lines of code: docstrings, comments and blank lines aside."""
    tree = ast.parse(path.read_text())
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(
        1
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if i not in docs and line.strip() and not line.strip().startswith("#")
    )


def test_session_module_stays_small():
    # Session is the user's surface: each method a short delegate to the part that owns the
    # work. A new operation belongs to that part.
    lines = _code_lines(PACKAGE / "session.py")
    assert lines < 250, f"session.py has {lines} lines of code; give the new code to its part"


def test_session_shows_users_at_most_thirty_names():
    from tenferro import Session

    public = [n for n in vars(Session) if not n.startswith("_")]
    assert len(public) <= 30, sorted(public)
    assert all(getattr(Session, n).__doc__ for n in public)


def test_every_package_ships_in_the_wheel():
    # setuptools is given the packages by name: a new subpackage missing from the list would be
    # left out of the wheel while every test run from the checkout still passed.
    import tomllib

    listed = set(
        tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"][
            "packages"
        ]
    )
    found = {
        ".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")
    }
    found.add("tenferro.kernels")  # from the top-level kernels/, by package-dir
    found.add("tenferro.nvrtc_std")  # headers for NVRTC: data, listed so the build takes it
    assert found == listed


def test_the_ready_kernels_are_tenferro_kernels_from_the_top_level_directory():
    import tenferro.kernels

    assert pathlib.Path(tenferro.kernels.__file__).parent == PACKAGE.parent / "kernels"


def _module_name(name, path):
    """``tenferro.x.y`` for a source of `_sources` (``kernels/...`` is tenferro.kernels)."""
    parts = list(pathlib.PurePosixPath(name).with_suffix("").parts)
    if parts[0] == "kernels":
        parts = ["kernels", *parts[1:]]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["tenferro", *parts])


def _imports(name, path):
    """(line, module imported, names taken) of every import of ``path``, lazy ones included."""
    me = _module_name(name, path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.append((node.lineno, base, tuple(a.name for a in node.names)))
    return found


def _graph():
    """Module -> the package modules it imports (a name that is a submodule counts as it)."""
    modules = {_module_name(n, p): p for n, p in _sources()}
    graph = {}
    for name, path in _sources():
        me = _module_name(name, path)
        edges = set()
        for _, base, names in _imports(name, path):
            if not base.startswith("tenferro"):
                continue
            subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in modules]
            edges.update(subs or [base])
            if len(subs) < len(names) and base in modules:
                edges.add(base)  # names the package itself gives
        edges.discard(me)
        graph[me] = edges & set(modules)
    return graph


def _circles(graph):
    """Every cycle's modules (strongly connected components with more than one module)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles_lazy_imports_included():
    # Dependencies point one way: an import inside a function is an import all the same.
    assert _circles(_graph()) == []


def test_the_circle_check_sees_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_another_modules_private_name():
    # `from x import _name` reaches into x as `x._name` would; a private module (`_driver`,
    # `_liveness`) is a seam the package lists, and may be imported.
    modules = {_module_name(n, p) for n, p in _sources()}
    found = {}
    for name, path in _sources():
        for line, base, names in _imports(name, path):
            private = [
                n
                for n in names
                if n.startswith("_") and not n.startswith("__") and f"{base}.{n}" not in modules
            ]
            if base.startswith("tenferro") and private:
                found.setdefault(name, []).append((line, base, private))
    assert found == {}, found
