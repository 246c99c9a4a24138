"""Mutation testing of code only a GPU runs: each mutant of a module judged by the GPU tests.

    python tests/_gpu_mutants.py MODULE.py [MODULE.py ...] --tests TEST [TEST ...] [--jobs 8]

mutmut (pyproject.toml) judges the modules the CPU suite covers. Its runner forks each mutant's
test run from a process that has already run the tests, and a process forked after CUDA started
cannot use the GPU, so code only a GPU reaches (the driver seam, frees, replays) is judged here:
every mutant runs ``pytest -x -m gpu TEST...`` in a fresh process, several at once on the one
GPU, each worker in its own copy of the tree. A mutant is killed when the tests fail or time
out (timeouts are counted apart). The mutations: a comparison, ``+``/``-`` and ``and``/``or``
swapped, a ``not`` dropped, an integer constant plus one, a boolean flipped, and a statement
that is a call removed.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SWAPS: dict[type, type] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.And: ast.Or,
    ast.Or: ast.And,
}


def _skipped(tree: ast.Module) -> set[int]:
    """ids of nodes not to mutate: docstrings and ``__all__``."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                skip.update(id(n) for n in ast.walk(body[0]))
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            skip.update(id(n) for n in ast.walk(node))
    return skip


def _sites(tree: ast.Module) -> list[tuple[ast.AST, int, str]]:
    """Each mutation point as (node, which, description), in a fixed walk order."""
    skip = _skipped(tree)
    sites: list[tuple[ast.AST, int, str]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            for j, op in enumerate(node.ops):
                if type(op) in SWAPS:
                    sites.append((node, j, f"{type(op).__name__} -> {SWAPS[type(op)].__name__}"))
        elif isinstance(node, (ast.BinOp, ast.BoolOp)) and type(node.op) in SWAPS:
            sites.append((node, 0, f"{type(node.op).__name__} -> {SWAPS[type(node.op)].__name__}"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            sites.append((node, 0, "not dropped"))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, bool):
            sites.append((node, 0, f"{node.value!r} -> {_changed(node.value)!r}"))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            sites.append((node, 0, "call removed"))
    return sites


def _changed(value: object) -> int | bool:
    if isinstance(value, bool):
        return not value
    assert isinstance(value, int)  # the only constants _sites picks
    return value + 1


def mutant(source: str, k: int) -> tuple[str, int, str]:
    """Mutant ``k`` of ``source``: its text, line and description."""
    tree = ast.parse(source)
    node, which, what = _sites(tree)[k]
    if isinstance(node, ast.Compare):
        node.ops[which] = SWAPS[type(node.ops[which])]()
    elif isinstance(node, (ast.BinOp, ast.BoolOp)):
        node.op = SWAPS[type(node.op)]()
    elif isinstance(node, ast.UnaryOp):
        node.operand = ast.UnaryOp(op=ast.Not(), operand=node.operand)  # not not x: x's truth
    elif isinstance(node, ast.Constant):
        node.value = _changed(node.value)
    else:
        node.value = ast.Constant(value=None)  # type: ignore[attr-defined]
    return ast.unparse(ast.fix_missing_locations(tree)), getattr(node, "lineno", 0), what


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="+", type=Path)
    ap.add_argument("--tests", nargs="+", required=True)
    ap.add_argument("--jobs", type=int, default=8)
    ns = ap.parse_args()
    modules = []
    for path in ns.modules:  # as paths inside the tree: the copies are written, never ROOT
        full = (ROOT / path).resolve()
        if not full.is_relative_to(ROOT) or not full.is_file():
            ap.error(f"module {str(path)!r} is not a file of the tree at {ROOT}")
        modules.append(full.relative_to(ROOT))
    work = Path(tempfile.mkdtemp(prefix="tenferro-mutants-"))
    try:
        return judge_all(modules, ns.tests, ns.jobs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def judge_all(modules: list[Path], tests: list[str], jobs: int, work: Path) -> int:
    """Run every mutant of ``modules`` against ``tests``, ``jobs`` at once; print the score."""
    copies: queue.Queue[Path] = queue.Queue()
    for j in range(jobs):
        copy = work / f"w{j}"
        for part in ("tenferro", "kernels", "tests"):
            shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
        copies.put(copy)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-m", "gpu", "-p", "no:cacheprovider"]
    command += ["-o", "addopts=", *tests]

    def run(copy: Path, timeout: float) -> tuple[str, bytes, float]:
        """("passed" | "failed" | "timeout", pytest's output, seconds) in ``copy``."""
        t0 = time.monotonic()
        path = f"{copy}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
        try:
            out = subprocess.run(
                command,
                cwd=copy,
                env=dict(env, PYTHONPATH=path),
                capture_output=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return "timeout", b"", time.monotonic() - t0
        verdict = "passed" if out.returncode == 0 else "failed"
        return verdict, out.stdout, time.monotonic() - t0

    first = copies.get()
    verdict, output, took = run(first, 600)
    copies.put(first)
    if verdict != "passed" or b" passed" not in output:  # all skipped (no GPU) judges nothing
        print(f"the tests do not pass on the unchanged tree ({verdict}): nothing to judge")
        print(output.decode(errors="replace")[-2000:])
        return 1
    timeout = 3 * took + 30
    todo = []
    for module in modules:
        source = (ROOT / module).read_text()
        todo += [(module, source, k) for k in range(len(_sites(ast.parse(source))))]
    print(f"{len(todo)} mutants; the tests take {took:.1f} s; {jobs} at once")

    def judge(job: tuple[Path, str, int]) -> tuple[Path, int, str, str]:
        module, source, k = job
        text, line, what = mutant(source, k)
        copy = copies.get()
        try:
            (copy / module).write_text(text)
            verdict, _, _ = run(copy, timeout)
        finally:
            (copy / module).write_text(source)
            copies.put(copy)
        return module, line, what, verdict

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(judge, todo))
    failed = sum(r[3] == "failed" for r in results)
    timeouts = [r for r in results if r[3] == "timeout"]
    print(
        f"{failed + len(timeouts)} of {len(results)} killed ({len(timeouts)} by a timeout) "
        f"in {time.monotonic() - t0:.0f} s"
    )
    for module, line, what, verdict in results:
        if verdict != "failed":
            print(
                f"  {'survived' if verdict == 'passed' else 'timed out'}: {module}:{line}: {what}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
