"""tenferro.kernels as a package: its sources compile without a GPU, ship in the wheel, and
every entry point refuses bad input."""

import numpy as np
import pytest

import tenferro as tf
from tenferro import kernels as k
from tenferro.kernels import _build, gemm, maps, reduce, rows


@pytest.mark.parametrize(
    ("file", "exprs"),
    [
        ("elementwise.cu", maps._EXPRS),
        ("reduce.cu", reduce._EXPRS),
        ("rows.cu", rows._EXPRS),
        *(("matmul.cu", gemm._EXPRS[out]) for out in gemm._OUT_C),
        *(("matmul_sm90.cu", gemm._WGMMA[out]) for out in gemm._OUT_C),
        *(("matmul_sm90_tma.cu", gemm._TMA[out]) for out in gemm._OUT_C),
    ],
)
def test_every_source_compiles_without_a_gpu(file, exprs):
    arch = "sm_90a" if file.startswith("matmul_sm90") else "sm_90"
    r = tf.compile_cuda(
        _build._source(file),
        arch=arch,
        options=["-std=c++17"],
        name_expressions=list(exprs) or None,
    )
    assert r.image and set(r.lowered_names) == set(exprs)


def _launches():
    """Per source file, each kernel an entry point picks and the argument types it passes,
    read from the entry points' own tables (the dtype a user's array has -> the kernel)."""
    u32, u64 = "u32", "u64"
    softmax = [
        *rows._SOFTMAX["cached"],
        *rows._SOFTMAX["online"],
        *rows._SPLIT.values(),
        "softmax_rows_f32",
    ]
    return {
        "elementwise.cu": [(maps._FILL[t], [t, t, u64]) for t in maps._FILL_TYPES]
        + [(maps._CAST[(to, fr)], [to, fr, u64]) for to, fr in maps._CASTS]
        + [(maps._AXPY[t], [t, t, t, u64]) for t in maps._AXPY_TYPES],
        "reduce.cu": [(name, [t, t, u64, u64]) for (_, t), name in reduce._NAMES.items()],
        "rows.cu": [
            (rows._TRANSPOSE[rows._T_CTYPES[t], e], [t, t, u32, u32])
            for t in rows._T_TYPES
            for e in rows.TRANSPOSE_TILES
        ]
        + [
            (rows._scan_name(t, c), [t, t, u64, u64, u32, u32])
            for t in rows._S_TYPES
            for c in rows.SCAN_CONFIGS
        ]
        + [(name, ["f32", "f32", u32, u32]) for name in softmax],
        "matmul.cu": [("matmul_f32", ["f32", "f32", "f32", u32, u32, u32])]
        + [
            (name, [out, "bf16", "bf16", u32, u32, u32])
            for out in gemm._OUT_C
            for name in gemm._EXPRS[out]
            if name != "matmul_f32"
        ],
        "matmul_sm90.cu": [
            (name, [out, "bf16", "bf16", u32, u32, u32])
            for out in gemm._OUT_C
            for name in gemm._WGMMA[out]
        ],
        "matmul_sm90_tma.cu": [
            (name, ["map", "map", "map", u32, u32, u32])
            for out in gemm._OUT_C
            for name in gemm._TMA[out]
        ],
    }


@pytest.mark.parametrize(
    ("file", "exprs"),
    [
        ("elementwise.cu", maps._EXPRS),
        ("reduce.cu", reduce._EXPRS),
        ("rows.cu", rows._EXPRS),
        ("matmul.cu", sum(gemm._EXPRS.values(), ())),
        ("matmul_sm90.cu", sum(gemm._WGMMA.values(), ())),
        ("matmul_sm90_tma.cu", sum(gemm._TMA.values(), ())),
    ],
)
def test_every_kernel_takes_the_arguments_its_entry_point_passes(file, exprs):
    # The launch check reads each parameter's C type: the spans and scalars an entry point
    # passes must be exactly what its kernel declares (a transpose of f16 takes __half*).
    from tenferro.args import ParamBlock
    from tenferro.dtypes import by_name
    from tenferro.tensor_maps import TensorMap

    arch = "sm_90a" if file.startswith("matmul_sm90") else "sm_90"
    launches = _launches()[file]
    names = [n for n, _ in launches if n != "softmax_rows_f32"]
    assert set(names) == set(exprs)  # every kernel of the file is covered
    r = tf.compile_cuda(
        _build._source(file), arch=arch, options=["-std=c++17"], name_expressions=list(exprs)
    )
    ptr = 0x10000
    for expr, types in launches:
        sig = r.signatures[r.lowered_names.get(expr, expr)]
        assert all(p.c_type is not None for p in sig.params), expr
        args = []
        for p, t in zip(sig.params, types, strict=True):
            if t == "map":  # a tensor map of a bf16 span, as gemm builds it
                span = tf.TensorRef(ptr, (64, 64), (128, 2), by_name("bf16"), 0, None, None)
                args.append(TensorMap(span, (64, 64), 128, bytes(128)))
                ptr += 0x10000
            elif p.kind == "ptr":
                args.append(
                    tf.TensorMut(ptr, (4,), (by_name(t).itemsize,), by_name(t), 0, None, None)
                )
                ptr += 0x1000
            else:
                args.append(tf.KernelArg.scalar(1, t))
        ParamBlock(sig).pack(args, None, "session.launch")


def test_package_headers_are_inlined_into_the_compiled_source():
    src = _build._source("elementwise.cu")
    assert '#include "pack.cuh"' not in src.splitlines()
    assert src.count("struct alignas(W * sizeof(T)) Pack") == 1


def test_every_kernel_source_is_in_the_wheel():
    import fnmatch
    import os
    import tomllib

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        globs = tomllib.load(f)["tool"]["setuptools"]["package-data"]["tenferro.kernels"]
    here = os.path.dirname(_build.__file__)
    sources = [n for n in os.listdir(here) if n.endswith((".cu", ".cuh"))]
    assert sources and all(any(fnmatch.fnmatch(n, g) for g in globs) for n in sources), globs


@pytest.mark.gpu
def test_entry_points_refuse_bad_input(session):
    f32 = session.upload(np.ones(8, np.float32))
    f64 = session.upload(np.ones(8, np.float64))
    i32 = session.upload(np.ones(8, np.int32))
    ro = session.tensor(f32)
    cases = [
        (
            lambda: k.axpy(session, f32, f64, 1.0),
            tf.ValidationError,
            r"kernels\.axpy: inputs\[0\] is f64, out is f32",
        ),
        (
            lambda: k.axpy(session, i32, i32, 1),
            tf.ValidationError,
            r"kernels\.axpy: y is i32; axpy takes",
        ),
        (
            lambda: k.axpy(session, f32, session.upload(np.ones(9, np.float32)), 1.0),
            tf.ValidationError,
            r"kernels\.axpy: inputs\[0\] has 9 elements, out has 8",
        ),
        (lambda: k.fill(session, i32, 2**40), tf.ValidationError, r"out of range|outside"),
        (
            lambda: k.fill(session, f32, "x"),
            tf.ValidationError,
            r"kernels\.fill: value='x' must be a number",
        ),
        (lambda: k.fill(session, ro, 1.0), tf.ValidationError, r"read-only"),
        (
            lambda: k.cast(session, i32, f64),
            tf.ValidationError,
            r"kernels\.cast: f64 -> i32 is not provided",
        ),
        (
            lambda: k.elementwise(session, "x + z", f32, x=f32),
            tf.ValidationError,
            r"kernels\.elementwise: expr uses 'z'",
        ),
        (
            lambda: k.elementwise(session, "x +", session.upload(np.ones(8, np.float32)), x=f32),
            tf.CompileError,
            r"kernels\.elementwise: expr 'x \+' did not compile",
        ),
        (
            lambda: k.softmax(session, f32, f32),
            tf.ValidationError,
            r"kernels\.softmax: x must be 2-D",
        ),
        (
            lambda: k.transpose(
                session,
                session.upload(np.ones((2, 4), np.float32)),
                session.upload(np.ones((2, 4), np.float32)),
            ),
            tf.ValidationError,
            r"kernels\.transpose: out must be f32\(4, 2\)",
        ),
        (
            lambda: k.cumsum(session, f64, f32),
            tf.ValidationError,
            r"kernels\.cumsum: x must be 1-D and out of its shape and dtype",
        ),
        (
            lambda: k.matmul(
                session,
                session.upload(np.ones((2, 2), np.float32)),
                session.upload(np.ones((2, 3), np.float32)),
                session.upload(np.ones((2, 2), np.float32)),
            ),
            tf.ValidationError,
            r"kernels\.matmul: a\(2, 3\) @ b\(2, 2\) needs",
        ),
        (lambda: k.max(session, i32), tf.ValidationError, r"kernels\.max: x is i32"),
        (lambda: k.sum(session, np.ones(3)), tf.ValidationError, r"host memory"),
    ]
    for call, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            call()


@pytest.mark.parametrize(
    "call",
    [
        lambda k: k.fill(None, None, 1.0),
        lambda k: k.axpy("s", None, None, 2.0),
        lambda k: k.cast(None, None, None),
        lambda k: k.elementwise(None, "a", None),
        lambda k: k.sum(None, None),
        lambda k: k.max(None, None),
        lambda k: k.softmax(None, None, None),
        lambda k: k.transpose(None, None, None),
        lambda k: k.cumsum(None, None, None),
        lambda k: k.matmul(None, None, None, None),
    ],
)
def test_ready_kernels_refuse_a_first_argument_that_is_not_a_session(call):
    import tenferro.kernels as k

    with pytest.raises(
        tf.ValidationError,
        match=r"kernels\.\w+: s must be a tf\.Session \(the "
        r"first argument of every ready kernel\), got "
        r"(NoneType|str)",
    ):
        call(k)


def test_a_grid_stride_config_is_found_again_for_a_size_seen():
    first = _build.grid_stride(None, 4097, per_thread=4, capped=False)  # no device asked
    assert (first.grid, first.block) == ((5, 1, 1), (256, 1, 1))  # 1025 threads: 5 blocks
    assert _build.grid_stride(None, 4097, per_thread=4, capped=False) is first
    assert _build.grid_stride(None, 4096, per_thread=4, capped=False).grid == (4, 1, 1)
    assert _build.grid_stride(None, 4097, per_thread=1, capped=False).grid == (17, 1, 1)
    assert _build.grid_stride(None, 0, capped=False).grid == (1, 1, 1)
    for n in range(5000):  # a bounded table
        _build.grid_stride(None, n, capped=False)
    assert len(_build._configs) <= 4097


def test_a_capped_config_is_kept_per_device():
    class Device:  # what grid_stride reads of a session: its device and its SM count
        def __init__(self, device, sms):
            self.device, self.context, self.sms = device, self, sms

        def attribute(self, name):
            assert name == "MULTIPROCESSOR_COUNT"
            return self.sms

    n = 1 << 24  # 16384 blocks of 256 threads at 4 items a thread, uncapped
    on0, on1 = Device(0, 132), Device(1, 2)
    cfg0 = _build.grid_stride(on0, n, per_thread=4)
    assert cfg0.grid == (132 * _build.BLOCKS_PER_SM, 1, 1)
    assert _build.grid_stride(on1, n, per_thread=4).grid == (2 * _build.BLOCKS_PER_SM, 1, 1)
    assert _build.grid_stride(on0, n, per_thread=4) is cfg0  # found again for its device
    small = _build.grid_stride(on1, 256 * 4 * 2 * _build.BLOCKS_PER_SM, per_thread=4)
    assert small.grid == (2 * _build.BLOCKS_PER_SM, 1, 1)  # the last size under the cap


def test_spans_1d_compares_element_counts_and_types():
    from tenferro import dtypes

    def span(n, t):
        return tf.TensorRef(
            0x1000, (n,), (dtypes.by_name(t).itemsize,), dtypes.by_name(t), 0, None, None
        )

    _build.spans_1d("op", span(8, "f32"), span(8, "f32"))
    _build.spans_1d("op", span(8, "f32"), span(8, "f64"), same_dtype=False)  # a cast
    with pytest.raises(tf.ValidationError, match=r"^op: inputs\[1\] has 7 elements, out has 8$"):
        _build.spans_1d("op", span(8, "f32"), span(8, "f32"), span(7, "f32"))
    with pytest.raises(tf.ValidationError, match=r"^op: inputs\[0\] has 4 elements, out has 8$"):
        _build.spans_1d("op", span(8, "f32"), span(4, "f64"))  # as many bytes, fewer elements
    with pytest.raises(tf.ValidationError, match=r"^op: inputs\[0\] is i32, out is f32$"):
        _build.spans_1d("op", span(8, "f32"), span(8, "i32"))


def test_the_last_sessions_table_is_forgotten_at_its_synchronize():
    class Liveness:
        def __init__(self):
            self.caches = []

        def add_cache(self, c):
            self.caches.append(c)

    class Stand:  # what function() asks of a session holding a looked-up Function
        is_open = True
        _state = property(lambda self: self)  # its state, as state_of reads it

        def __init__(self):
            self.liveness = Liveness()

    s, other = Stand(), Stand()
    key = ("f.cu", (), "", "k")
    _build._functions[s] = table = _build._Table(s, {key: "fn"})
    s.liveness.add_cache(table)
    assert _build.function(s, "f.cu", "k") == "fn" and _build._last == (s, table)
    _build._functions[other] = _build._Table(other, {key: "theirs"})
    assert _build.function(other, "f.cu", "k") == "theirs"  # another session: its own table
    assert _build.function(s, "f.cu", "k") == "fn"
    for c in s.liveness.caches:  # what the session's synchronize does: its table stays
        c.forget()
    assert _build._last == (None, None) and table == {key: "fn"}
    s.is_open = False  # what its close does: the table lets go of what it holds
    for c in s.liveness.caches:
        c.forget()
    assert table == {}
    with pytest.raises(AttributeError):  # and asks for its resources again (here: none)
        _build.function(s, "f.cu", "k")
    assert _build._last == (None, None)


def test_a_plan_is_made_once_a_session_and_the_table_stays_bounded():
    class Stand:  # what the session's table asks of a session, and of its state (itself)
        is_open = True
        _state = property(lambda self: self)

        def __init__(self):
            self.liveness, self.caches = self, []

        def add_cache(self, cache):
            self.caches.append(cache)

    s, other = Stand(), Stand()
    made = []

    def make(key):
        return lambda: made.append(key) or ("plan", key)

    assert _build.plan(s, ("k", 1), make(1)) == ("plan", 1)
    assert _build.plan(s, ("k", 1), make(1)) == ("plan", 1) and made == [1]  # kept
    assert _build.plan(other, ("k", 1), make(1)) == ("plan", 1) and made == [1, 1]  # its own
    for i in range(2, _build._MAX_PLANS + 1):
        _build.plan(s, ("k", i), make(i))
    made.clear()
    _build.plan(s, ("k", 1), make(1))  # the last size of the table: all still kept
    assert made == []
    _build.plan(s, ("k", 0), make(0))  # the first past it: the table starts again
    _build.plan(s, ("k", 1), make(1))
    assert made == [0, 1]
