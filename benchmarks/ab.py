"""Two trees' launch paths in one process, batch against batch: what a change costs, without
the drift of the host's clocks between two runs.

    python benchmarks/ab.py BEFORE AFTER [--rounds 40] [--calls 1000] [--json FILE]

BEFORE and AFTER are folders holding a tree's ``tenferro/`` and ``kernels/`` (a checkout, or
``git archive REV tenferro kernels | tar -x -C DIR``). Each is copied under its own package
name (``tenferro_before``, ``tenferro_after``) and both are imported here. The rows are the
launches users write (``benchmarks/user_path.py``'s, with torch tensors where torch is
installed) and the paths under them; each row runs a batch of ``--calls`` calls on one tree,
then the same batch on the other, alternating which goes first, ``--rounds`` times. A row's
figure is the median over rounds of the after/before ratio of two batches that ran back to
back: two separate runs of ``launch.py`` on one machine differ by more than the few percent a
change of the launch path is allowed (the host's clocks drift within a minute).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _axpy import AXPY_SRC

N = 4096
_NAME = re.compile(r"\btenferro\b(?=[.\s,;)]|$)", re.M)


def load_tree(tree: Path, name: str, into: Path) -> Any:
    """``tree``'s tenferro imported as the package ``name`` (its kernels/ as ``name.kernels``)."""
    pkg = into / name
    shutil.copytree(tree / "tenferro", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    if (tree / "kernels").is_dir() and not (pkg / "kernels").exists():
        shutil.copytree(tree / "kernels", pkg / "kernels", ignore=shutil.ignore_patterns("__py*"))
    for source in pkg.rglob("*.py"):  # imports of tenferro name this copy
        text = source.read_text()
        source.write_text(_NAME.sub(name, text))
    sys.path.insert(0, str(into))
    return importlib.import_module(name)


def rows(tfm: Any, stack: list[Any], torch: Any) -> dict[str, Callable[[], Any]]:
    """The timed calls on one tree: ``name -> call``; its sessions go on ``stack``."""
    s = tfm.Session(0).__enter__()  # as a with block opens it (the older trees have no open)
    stack.append(s)
    fn = s.compile(AXPY_SRC).function("axpy")
    cfg = tfm.LaunchConfig.flat(N, 256)
    ty, tx = (s.upload(np.random.rand(N).astype(np.float32)) for _ in range(2))
    f32, u32 = tfm.f32, tfm.u32
    out: dict[str, Callable[[], Any]] = {
        "s.launch, tf.Tensors, fresh spans": lambda: s.launch(
            fn, cfg, [s.tensor_mut(ty), s.tensor(tx), f32(2.0), u32(N)]
        ),
    }
    once = [s.tensor_mut(ty), s.tensor(tx), f32(2.0), u32(N)]
    out["s.launch, spans made once (floor)"] = lambda: s.launch(fn, cfg, once)
    out["BoundLaunch()"] = s.bind(fn, cfg, once)
    with s.capture() as cap:
        for _ in range(100):
            s.launch(fn, cfg, once)
    out["graph replay, 100 kernels"] = cap.graph.launch
    if torch is None:
        return out
    y, x = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    st = tfm.Session(0, stream=torch.cuda.current_stream().cuda_stream).__enter__()
    stack.append(st)
    fn_t = st.compile(AXPY_SRC).function("axpy")
    out["s.launch, torch tensors, own stream"] = lambda: s.launch(
        fn, cfg, [s.tensor_mut(y), s.tensor(x), f32(2.0), u32(N)]
    )
    out["s.launch, torch tensors, torch's stream"] = lambda: st.launch(
        fn_t, cfg, [st.tensor_mut(y), st.tensor(x), f32(2.0), u32(N)]
    )
    out["s.launch, new torch views each call"] = lambda: st.launch(
        fn_t, cfg, [st.tensor_mut(y.view(N)), st.tensor(x.view(N)), f32(2.0), u32(N)]
    )
    from numba import cuda

    @cuda.jit
    def axpy_numba(yy, xx, a, n):
        i = cuda.grid(1)
        if i < n:
            yy[i] = a * xx[i] + yy[i]

    nk = s.numba_kernel(axpy_numba)
    out["s.launch of a numba kernel, torch tensors"] = lambda: s.launch(
        nk, cfg, [s.tensor_mut(y), s.tensor(x), np.float32(2.0), np.int64(N)]
    )
    kernels = importlib.import_module(f"{tfm.__name__}.kernels")
    out["kernels.axpy(s, y, x, 2.0), torch tensors"] = lambda: kernels.axpy(s, y, x, 2.0)
    return out


def batch_us(call: Callable[[], Any], calls: int, sync: Callable[[], None]) -> float:
    """Host microseconds a call, over one batch; the stream is drained before and after."""
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    t = time.perf_counter() - t0
    sync()
    return t / calls * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    try:
        import torch
    except ImportError:
        torch = None
    into = Path(tempfile.mkdtemp(prefix="tenferro-ab-"))
    trees = {
        "before": load_tree(ns.before, "tenferro_before", into),
        "after": load_tree(ns.after, "tenferro_after", into),
    }
    stacks: dict[str, list[Any]] = {k: [] for k in trees}
    table = {k: rows(tfm, stacks[k], torch) for k, tfm in trees.items()}
    for tfm in trees.values():
        # the steady state: a hot process's @njit launcher (a tree before the public call too)
        (getattr(tfm, "build_fast_launcher", None) or tfm._driver.build_fast_calls)()
    syncs = {k: stacks[k][0].synchronize for k in trees}
    for k in trees:  # warm: every row's first calls, its checks and caches
        for call in table[k].values():
            batch_us(call, ns.calls, syncs[k])
    times: dict[str, dict[str, list[float]]] = {
        name: {"before": [], "after": []} for name in table["before"]
    }
    for r in range(ns.rounds):
        for name in times:
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for k in order:
                times[name][k].append(batch_us(table[k][name], ns.calls, syncs[k]))
    report = {}
    print(f"{'row':48s} {'before us':>9s} {'after us':>9s} {'after/before':>12s} {'IQR':>13s}")
    for name, t in times.items():
        ratios = sorted(a / b for a, b in zip(t["after"], t["before"], strict=True))
        q = statistics.quantiles(ratios, n=4)
        med = statistics.median(ratios)
        b, a = statistics.median(t["before"]), statistics.median(t["after"])
        report[name] = {"before_us": b, "after_us": a, "ratio": med, "iqr": [q[0], q[2]]}
        print(f"{name:48s} {b:9.2f} {a:9.2f} {med:12.3f} {q[0]:6.3f}-{q[2]:.3f}")
    for k in reversed(list(trees)):  # the last opened first: each restores the context before it
        for session in reversed(stacks[k]):
            session.__exit__(None, None, None)
    shutil.rmtree(into, ignore_errors=True)  # the copies, imported already
    if ns.json:
        Path(ns.json).write_text(json.dumps({"rounds": ns.rounds, "rows": report}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
