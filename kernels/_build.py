"""Loading the kernel sources once per session, and the checks every entry point shares."""

from __future__ import annotations

import os
import re
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from tenferro import LaunchConfig, Module, Session, ValidationError, args, dtypes
from tenferro.session import state_of

__all__ = [
    "C_TYPES",
    "check_session",
    "function",
    "grid_stride",
    "plan",
    "session_table",
    "spans_1d",
    "workspace",
]

_HERE = os.path.dirname(os.path.abspath(__file__))

# The C type of each scalar type the kernels are instantiated for.
C_TYPES = {
    "f16": "__half",
    "bf16": "__nv_bfloat16",
    "f32": "float",
    "f64": "double",
    "i32": "int",
    "u32": "unsigned",
    "i64": "long long",
    "u8": "unsigned char",
}


_INCLUDE = re.compile(r'^#include "([a-z_]+\.cuh)"$', re.MULTILINE)


def _source(name: str) -> str:
    """The text of ``name``, with this package's ``#include "x.cuh"`` lines inlined.

    Inlined here rather than passed to NVRTC as headers, so the compiled source (and with it the
    disk cache's key) is all of the code that was compiled.
    """
    with open(os.path.join(_HERE, name), encoding="utf-8") as f:
        text = f.read()
    return _INCLUDE.sub(lambda m: _source(m.group(1)), text)


def check_session(s: Any, op: str) -> None:
    """Refuse a first argument that is not a tf.Session (the entry points take it first)."""
    if not isinstance(s, Session):
        raise ValidationError(
            f"{op}: s must be a tf.Session (the first argument of every ready "
            f"kernel), got {type(s).__name__}"
        )


# Per open session, the Functions already looked up: (file, expressions, suffix, name) ->
# Function, its workspaces (name -> Tensor) and the entry points' plans (`plan`). A
# relaunch finds its kernel in one dictionary, not through the resource cache and the module;
# the table goes with the session (the session checks use at launch).
_functions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Table(dict):
    """One session's Functions; the last session's table is found without the weak lookup.

    The session makes it forget at every synchronize (its close included), so the shortcut
    never keeps a closed session alive; at the close it also drops what it holds (workspaces,
    plans), so a closed session that is still referenced keeps no device memory through it.
    """

    def __init__(self, s: Any, entries: Any = ()) -> None:
        super().__init__(entries)
        self.session = weakref.ref(s)

    def forget(self) -> None:
        global _last
        if _last[1] is self:
            _last = (None, None)
        s = self.session()
        if s is None or not s.is_open:
            self.clear()


_last: tuple[Any, _Table | None] = (None, None)  # (session, its table)


def session_table(s: Any) -> _Table:
    """The session's table: its Functions, workspaces and what entry points keep there."""
    global _last
    last, table = _last
    if last is not s:
        table = _functions.get(s)
        if table is None:
            table = _functions[s] = _Table(s)
            state_of(s).liveness.add_cache(table)
        if s.is_open:
            _last = (s, table)
    assert table is not None
    return table


def workspace(s: Any, words: int, name: str = "workspace") -> Any:
    """The session's u64 workspace ``name`` of at least ``words`` words, kept between calls.

    Zeroed when made (again larger, where more words are asked), and never after: it is for
    kernels that leave it as they need to find it. Launches are ordered on the session's
    stream, so they share it.
    """
    table = session_table(s)
    ws = table.get(name)
    if ws is None or ws.size < words:
        ws = table[name] = s.alloc_zeros((words,), np.uint64)
    return ws


_MAX_PLANS = 256  # launches a session keeps for the sizes and types it was asked


def plan(s: Any, key: tuple, make: Callable[[], Any]) -> Any:
    """``make()``'s result for ``key``, made once a session and kept in its table.

    What an entry point works out for one size and type (its Function, config, scalars);
    past `_MAX_PLANS` the kept ones go together.
    """
    table = session_table(s)
    plans = table.get("plans")
    if plans is None:
        plans = table["plans"] = {}
    found = plans.get(key)
    if found is None:
        if len(plans) >= _MAX_PLANS:
            plans.clear()
        found = plans[key] = make()
    return found


def function(
    s: Any, file: str, name: str, expressions: tuple[str, ...] = (), arch_suffix: str = ""
) -> Any:
    """The kernel ``name`` of ``file`` (a ``.cu`` of this package), compiled once a session.

    ``expressions`` are the template instantiations the file is compiled with; they are part
    of the cache key, so a file is compiled once for each set asked. ``arch_suffix="a"``
    compiles for the device's architecture-specific target (sm_90a for wgmma).
    """
    key = (file, expressions, arch_suffix, name)
    table = session_table(s)
    fn = table.get(key)
    if fn is not None and s.is_open:
        return fn

    def build(session: Any) -> Module:
        major, minor = session.context.compute_capability
        return session.compile(
            _source(file),
            options=["-std=c++17"],
            name_expressions=list(expressions) or None,
            arch=f"sm_{major}{minor}{arch_suffix}",
        )

    mod = s.resource(("tenferro.kernels", file, expressions, arch_suffix), build, Module)
    fn = table[key] = mod.function(name)
    return fn


# Blocks a multiprocessor for grid-stride loops that end in one atomic a block (sum, max):
# 256-thread blocks, 2048 resident threads an SM, so 8 is one full wave. Elementwise kernels
# take no cap (one step a thread): on the H200 that wrote 4.51 TB/s for fill against 4.26 at 8
# blocks an SM, while sum fell to 2.06 TB/s from 4.15 (benchmarks/kernels.py --sweep).
BLOCKS_PER_SM = 8
_MAX_GRID = (1 << 31) - 1


def grid_stride(
    s: Any, n: int, block: int = 256, per_thread: int = 1, capped: bool = True
) -> LaunchConfig:
    """A 1-D config for a grid-stride loop over ``n`` items, ``per_thread`` a thread a step.

    No more blocks than the items need; with ``capped``, at most ``BLOCKS_PER_SM`` a
    multiprocessor. A relaunch gets the same config object (LaunchConfig keeps plain ones).
    """
    key = (n, block, per_thread, s.device if capped else -1)  # a cap is the device's
    config = _configs.get(key)
    if config is not None:
        return config
    threads = (n + per_thread - 1) // per_thread
    blocks = (threads + block - 1) // block
    if capped:
        blocks = min(blocks, s.context.attribute("MULTIPROCESSOR_COUNT") * BLOCKS_PER_SM)
    config = LaunchConfig(max(1, min(blocks, _MAX_GRID)), block)
    if len(_configs) > 4096:
        _configs.clear()
    _configs[key] = config
    return config


# The configs of sizes seen: (n, block, per_thread, device where capped, else -1) -> config.
_configs: dict[tuple[int, int, int, int], LaunchConfig] = {}


def spans_1d(op: str, out: Any, *inputs: Any, same_dtype: bool = True) -> None:
    """Refuse outputs and inputs whose element counts differ (and dtypes, if asked)."""
    for i, x in enumerate(inputs):
        if x.scalar_type is out.scalar_type and x.nbytes == out.nbytes:
            continue  # one type and as many bytes: as many elements
        if x.size != out.size:
            raise ValidationError(f"{op}: inputs[{i}] has {x.size} elements, out has {out.size}")
        if same_dtype:
            raise ValidationError(
                f"{op}: inputs[{i}] is {x.scalar_type.name}, out is {out.scalar_type.name}"
            )


def scalar_for(t: dtypes.ScalarType, value: Any, op: str, name: str) -> Any:
    """``value`` as a typed scalar of type ``t`` (range-checked by the scalar factories)."""
    cls = value.__class__
    if (
        cls is not float
        and cls is not int
        and (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)))
    ):
        raise ValidationError(f"{op}: {name}={value!r} must be a number")
    return _FACTORIES[t](value)


_FACTORIES = {t: getattr(args, t.name) for t in dtypes.SCALAR_TYPES if hasattr(args, t.name)}
