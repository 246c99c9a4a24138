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
PRIVATE_READS = {"interop/producers.py": {"torch._C", "torch._C._cuda_getCurrentRawStream"},
                 "session.py": {"session._state"}}


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
    return {(node.lineno, node.attr) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "_driver"}


def test_the_driver_seam_lists_what_crosses_it():
    # _driver.__all__ is the seam: every name another module uses is in it, and only _driver
    # imports the bindings (so no binding object is made above it).
    from tenferro import _driver

    outside = {}
    for name, path in _sources():
        if name == "_driver.py":
            continue
        assert "cuda.bindings" not in path.read_text(), f"{name} imports cuda.bindings"
        unlisted = {used for _, used in _driver_names_used(path) if used not in _driver.__all__}
        if unlisted:
            outside[name] = sorted(unlisted)
    assert outside == {}, outside
    assert all(hasattr(_driver, name) for name in _driver.__all__)


def _code_lines(path):
    """Lines of code: docstrings, comments and blank lines aside."""
    tree = ast.parse(path.read_text())
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(1 for i, line in enumerate(path.read_text().splitlines(), 1)
               if i not in docs and line.strip() and not line.strip().startswith("#"))


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

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(PACKAGE.parent).parts)
             for p in PACKAGE.rglob("__init__.py")}
    found.add("tenferro.kernels")  # from the top-level kernels/, by package-dir
    assert found == listed


def test_the_ready_kernels_are_tenferro_kernels_from_the_top_level_directory():
    import tenferro.kernels

    assert pathlib.Path(tenferro.kernels.__file__).parent == PACKAGE.parent / "kernels"
