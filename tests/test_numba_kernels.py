"""numba kernels: layout, write detection and packing (CPU, through compile_ptx), then on a GPU."""

import struct

import numpy as np
import pytest
from numba import cuda, from_dtype, types
from numba.cuda.compiler import compile_cuda

import tenferro as tf
from tenferro import dtypes
from tenferro.numba_kernels import (
    NumbaParamBlock,
    _specialization_type,
    numba_layout,
    written_arrays,
)
from tenferro.signature import parse_ptx


def scale_into(out, x, a, n):
    i = cuda.grid(1)
    if i < n:
        out[i] = a * x[i]


def views_and_atomics(out, x, acc, hist, n):
    i = cuda.grid(1)
    v = out[1:]
    w = v.T
    if i < n - 1:
        w[i] = x[i]
        cuda.atomic.add(acc, 0, x[i])
    if i < hist.shape[0]:
        t = hist[i]  # read only
        acc[1] = t


def atomics_only(acc, x, n):
    i = cuda.grid(1)
    if i < n and i < len(x):  # len(x) is a call on x: not a store
        cuda.atomic.add(acc, 0, x[i])


def reads_only(x, y, n):
    i = cuda.grid(1)
    if i < n:
        s = x[i] + y[i]
        s += 1


F32_C = types.Array(types.float32, 1, "C")
F64_2A = types.Array(types.float64, 2, "A")


def _typed(f, argtypes):
    return compile_cuda(f, types.void, argtypes, cc=(9, 0)).type_annotation


def test_layout_matches_the_ptx_numba_emits():
    argtypes = (
        F32_C,
        F64_2A,
        types.complex64,
        types.int16,
        types.boolean,
        types.float16,
        types.Array(types.int8, 3, "A"),
    )

    def k(a, b, c, d, e, f, g):
        pass

    _specs, sig = numba_layout(argtypes, "k", "test")
    ptx, _ = cuda.compile_ptx(k, argtypes, cc=(9, 0))
    (entry,) = parse_ptx(ptx).values()
    assert [p.size for p in entry.params] == [p.size for p in sig.params]
    assert len(sig.params) == 7 + 9 + 2 + 1 + 1 + 1 + 11


def test_layout_names_each_field_as_numba_lays_it_out():
    specs, sig = numba_layout((F32_C, types.complex64, types.float32), "k", "test")
    assert (sig.name, sig.origin) == ("k", "numba")
    table = [(p.kind, p.size, p.align, p.scalar and p.scalar.name, p.name) for p in sig.params]
    assert table == [
        ("int", 8, 8, "i64", f"0.{f}")
        for f in ("meminfo", "parent", "nitems", "itemsize", "data", "shape0", "stride0")
    ] + [
        ("opaque", 4, 4, None, "1.real"),
        ("opaque", 4, 4, None, "1.imag"),
        ("opaque", 4, 4, "f32", "2"),
    ]
    from tenferro.numba_kernels import _ARRAY, _SCALAR_ARG

    f32, c64 = dtypes.by_name("f32"), dtypes.by_name("c64")
    assert specs == [
        (_ARRAY, f32, 1, "C", 0),
        (_SCALAR_ARG, c64, 0, "", 7),
        (_SCALAR_ARG, f32, 0, "", 9),
    ]  # each argument's first parameter


def test_writes_are_read_from_the_typed_ir():
    assert written_arrays(_typed(scale_into, (F32_C, F32_C, types.float32, types.int64)), 4) == {0}
    argtypes = (F32_C, F32_C, types.Array(types.float64, 1, "C"), F32_C, types.int64)
    assert written_arrays(_typed(views_and_atomics, argtypes), 5) == {0, 2}
    assert written_arrays(_typed(reads_only, (F32_C, F32_C, types.int64)), 3) == set()
    # An array written only through an atomic, beside another only passed to a call.
    assert written_arrays(_typed(atomics_only, (F32_C, F32_C, types.int64)), 3) == {0}


class _FakeSession:
    pass


def test_pack_writes_numbas_array_struct_and_checks(rng):
    s = _FakeSession()
    specs, sig = numba_layout((F64_2A, F32_C, types.float32, types.int64), "k", "test")
    block = NumbaParamBlock("k", specs, sig, {1})
    f64, f32 = dtypes.by_name("f64"), dtypes.by_name("f32")
    a = tf.TensorRef(0x10000, (3, 5), (8, 24), f64, 0, None, s)  # a transposed view
    b = tf.TensorMut(0x20000, (7,), (4,), f32, 0, None, s)
    spans = block.pack([a, b, tf.f32(2.5), 7], s, "session.launch")
    assert spans == [a, b]
    raw = bytes(block._mv)
    assert struct.unpack_from("<9q", raw, block.offsets[0]) == (0, 0, 15, 8, 0x10000, 3, 5, 8, 24)
    assert struct.unpack_from("<7q", raw, block.offsets[9]) == (0, 0, 7, 4, 0x20000, 7, 4)
    assert struct.unpack_from("<f", raw, block.offsets[16]) == (2.5,)
    assert struct.unpack_from("<q", raw, block.offsets[17]) == (7,)
    # numpy scalars of the argument's own type: their bytes; of another type: refused
    block.pack([a, b, np.float32(-0.75), np.int64(-(1 << 40))], s, "session.launch")
    raw = bytes(block._mv)
    assert struct.unpack_from("<f", raw, block.offsets[16]) == (-0.75,)
    assert struct.unpack_from("<q", raw, block.offsets[17]) == (-(1 << 40),)
    op = "session.launch"
    for bad, name in ((np.float64(1.0), "float64"), (np.int32(1), "int32")):
        args = [a, b, bad, np.int64(1)] if name == "float64" else [a, b, np.float32(1), bad]
        with pytest.raises(
            tf.ValidationError,
            match=rf"args\[[23]\] of numba kernel 'k' "
            rf"expects (f32|i64), got numpy {name}",
        ):
            block.pack(args, s, op)
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.launch: args\[1\] is a read-only "
        r"TensorRef but numba kernel 'k' stores",
    ):
        block.pack([a, tf.TensorRef(0x20000, (7,), (4,), f32, 0, None, s), tf.f32(1), 7], s, op)
    with pytest.raises(
        tf.ValidationError,
        match=r"args\[2\] of numba kernel 'k' expects f32, "
        r"got f64",
    ):
        block.pack([a, b, tf.f64(1), 7], s, op)
    with pytest.raises(
        tf.ValidationError,
        match=r"args\[3\]: 1e\+30 is out of range|args\[3\]"
        r".*needs an integer",
    ):
        block.pack([a, b, tf.f32(1), 1e30], s, op)
    with pytest.raises(
        tf.ValidationError,
        match=r"args\[3\]: 9223372036854775808 is out of "
        r"range for i64",
    ):
        block.pack([a, b, tf.f32(1), 1 << 63], s, op)
    with pytest.raises(
        tf.ValidationError,
        match=r"args\[0\] of 'k' expects a 2-d f64 array, "
        r"got a 1-d f32",
    ):
        block.pack([b, b, tf.f32(1), 7], s, op)
    with pytest.raises(tf.ValidationError, match=r"args\[1\] of 'k' expects layout 'C'"):
        block.pack([a, tf.TensorMut(0x20000, (7,), (8,), f32, 0, None, s), tf.f32(1), 7], s, op)
    with pytest.raises(tf.ValidationError, match=r"numba kernel 'k' takes 4 argument"):
        block.pack([a], s, op)


def test_pack_checks_and_writes_only_the_arguments_that_changed(monkeypatch):
    s = _FakeSession()
    specs, sig = numba_layout((F32_C, F32_C, types.float32, types.int64), "k", "test")
    block = NumbaParamBlock("k", specs, sig, {0})
    f32 = dtypes.by_name("f32")
    y = tf.TensorMut(0x20000, (7,), (4,), f32, 0, None, s)
    x = tf.TensorRef(0x30000, (7,), (4,), f32, 0, None, s)
    checked = []
    real = NumbaParamBlock.pack_slot

    def counting(self, i, a, session, op):
        checked.append(i)
        return real(self, i, a, session, op)

    monkeypatch.setattr(NumbaParamBlock, "pack_slot", counting)
    op = "session.launch"
    assert block.pack([y, x, np.float32(1.5), np.int64(7)], s, op) == [y, x]
    assert checked == [0, 1, 2, 3]
    checked.clear()
    nine = np.int64(9)
    # The README's loop: new numpy scalars of their parameters' own types, the same spans:
    # their bytes are written, nothing else is checked again.
    assert block.pack([y, x, np.float32(-2.5), nine], s, op) == [y, x]
    assert checked == []
    raw = bytes(block._mv)
    assert struct.unpack_from("<f", raw, block.offsets[14]) == (-2.5,)
    assert struct.unpack_from("<q", raw, block.offsets[15]) == (9,)
    assert struct.unpack_from("<7q", raw, block.offsets[0])[4] == 0x20000
    checked.clear()
    over = tf.TensorRef(0x20004, (7,), (4,), f32, 0, None, s)  # a new span: overlaps checked
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[0\] \(TensorMut\) "
        r"and args\[1\] \(TensorRef\) overlap",
    ):
        block.pack([y, over, np.float32(1.0), nine], s, op)
    assert checked == [1, 2]
    checked.clear()
    block.pack([y, x, np.float32(1.0), nine], s, op)  # after a refusal: all again
    assert checked == [0, 1, 2, 3]
    checked.clear()
    block.pack([y, x, 2.0, nine], s, op)  # a float where a numpy scalar was: checked
    assert checked == [2]
    checked.clear()
    two = np.float32(2.0)
    block.pack([y, x, two, nine], s, op)
    with pytest.raises(
        tf.ValidationError,
        match=r"args\[0\] \(TensorMut\) and args\[1\] "
        r"\(TensorRef\) overlap",
    ):
        block.pack([y, over, two, nine], s, op)  # only a span is new: overlaps still checked
    block.pack([y, x, two, nine], s, op)
    with pytest.raises(
        tf.ValidationError,
        match=r"numba kernel 'k' takes 4 argument\(s\), "
        r"got 1",
    ):
        block.pack([y], s, op)  # the first of the last arguments is not all of them
    block.pack([y, x, two, nine], s, op)
    with pytest.raises(
        tf.ValidationError,
        match=r"args\[1\] of 'k' is an array \(f32, 1-d\); "
        r"got float32",
    ):
        block.pack([y, np.float32(1.0), two, nine], s, op)  # a numpy scalar where an array goes
    block.pack([y, x, two, nine], s, op)
    block.forget()  # a synchronize: the next pack checks everything again
    checked.clear()
    block.pack([y, x, two, nine], s, op)
    assert checked == [0, 1, 2, 3]
    checked.clear()
    with pytest.raises(
        tf.ValidationError,
        match=r"args\[2\] of numba kernel 'k' expects f32, "
        r"got numpy float64",
    ):
        block.pack([y, x, np.float64(1.0), nine], s, op)  # another numpy type: refused
    assert checked == [2]
    checked.clear()
    with pytest.raises(
        tf.ValidationError,
        match=r"numba kernel 'k' takes 4 argument\(s\), "
        r"got 0",
    ):
        block.pack([], s, op)  # after the refusal nothing is remembered; still counted


def test_pack_takes_a_pointer_argument_as_its_span_and_checks_fortran_order_and_ndim():
    s = _FakeSession()
    f_order = types.Array(types.float64, 2, "F")
    specs, sig = numba_layout((f_order, types.float64), "k", "test")
    block = NumbaParamBlock("k", specs, sig, set())
    f64 = dtypes.by_name("f64")
    fort = tf.TensorRef(0x10000, (3, 5), (8, 24), f64, 0, None, s)  # column-major
    op = "session.launch"
    assert block.pack([tf.KernelArg.pointer(fort), np.float64(1.0)], s, op) == [fort]
    assert struct.unpack_from("<9q", bytes(block._mv), block.offsets[0])[4:] == (
        0x10000,
        3,
        5,
        8,
        24,
    )
    rows = tf.TensorRef(0x10000, (3, 5), (40, 8), f64, 0, None, s)  # row-major
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[0\] of 'k' expects "
        r"layout 'F', got strides=\(40, 8\)",
    ):
        block.pack([rows, np.float64(1.0)], s, op)
    flat = tf.TensorRef(0x10000, (15,), (8,), f64, 0, None, s)  # the right type, one dimension
    with pytest.raises(
        tf.ValidationError,
        match=r"args\[0\] of 'k' expects a 2-d f64 array, "
        r"got a 1-d f64 span",
    ):
        block.pack([flat, np.float64(1.0)], s, op)
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[1\] of numba kernel "
        r"'k' expects f64, got numpy float32 scalar",
    ):
        block.pack([fort, np.float32(1.0)], s, op)


def test_specialization_refuses_untyped_python_numbers():
    with pytest.raises(
        tf.ValidationError,
        match=r"op: args\[2\] is a bare Python int; a numba "
        r"kernel without a signature",
    ):
        _specialization_type(3, "op", 2)
    assert _specialization_type(tf.f32(1.0), "op", 0) == types.float32
    assert _specialization_type(np.int16(3), "op", 0) == types.int16
    f64 = dtypes.by_name("f64")
    fort = tf.TensorRef(0x10000, (3, 5), (8, 24), f64, 0, None, _FakeSession())
    assert _specialization_type(tf.KernelArg.pointer(fort), "op", 0) == types.Array(
        types.float64, 2, "A"
    )  # a pointer argument is its span's array type


class _CachingSession:
    def __init__(self):
        self.liveness = self
        self.caches = []

    def add_cache(self, cache):
        self.caches.append(cache)


class _Fn:
    """A compiled Function as a NumbaKernel sees it: its name and its parameter block."""

    def __init__(self, name, argtypes=(types.float32,)):
        specs, sig = numba_layout(argtypes, "k", "test")
        self.name, self.param_block = name, NumbaParamBlock("k", specs, sig, set())

    def __eq__(self, other):  # compared with the name the stand-in compiler gave it
        return other == self.name or other is self

    __hash__ = object.__hash__


def test_a_kernel_specializes_once_per_numba_type_and_finds_it_without_numba(monkeypatch):
    from tenferro import numba_kernels as nk

    compiled, keys = [], []
    monkeypatch.setattr(
        nk,
        "compile_for_session",
        lambda s, d, key, name, op: compiled.append(key) or _Fn(f"fn{len(compiled)}"),
    )
    real = nk._specialization_type
    monkeypatch.setattr(
        nk, "_specialization_type", lambda a, op, i: keys.append(i) or real(a, op, i)
    )
    s = _CachingSession()
    k = nk.NumbaKernel(s, None, "k")
    f32, f64 = dtypes.by_name("f32"), dtypes.by_name("f64")

    def span(shape, strides, t=f32, cls=tf.TensorRef):
        return cls(0x10000, shape, strides, t, 0, None, s)

    assert k.function_for([span((4, 8), (32, 4)), tf.f32(1.0)], "op") == "fn1"
    assert len(keys) == 2  # numba's types built once for the first arguments
    keys.clear()
    # New objects of the same kinds (a mutable span, a numpy scalar of the same type): found
    # by the quick key, no numba types built, nothing compiled.
    assert k.function_for([span((4, 8), (32, 4), cls=tf.TensorMut), tf.f32(2.0)], "op") == "fn1"
    assert k.function_for([span((2, 3), (12, 4)), tf.f32(3.0)], "op") == "fn1"
    assert keys == [] and len(compiled) == 1
    # What changes the numba type: the layout, the ndim, the dtype, the scalar's type.
    assert k.function_for([span((4, 8), (4, 16)), tf.f32(1.0)], "op") == "fn2"  # 'A' layout
    assert k.function_for([span((32,), (4,)), tf.f32(1.0)], "op") == "fn3"
    assert k.function_for([span((4, 8), (64, 8), f64), tf.f32(1.0)], "op") == "fn4"
    assert k.function_for([span((4, 8), (32, 4)), tf.f64(1.0)], "op") == "fn5"
    # A numpy scalar of the type a typed scalar has: numba's same type, the same Function.
    assert k.function_for([span((4, 8), (32, 4)), np.float32(1.0)], "op") == "fn1"
    assert len(compiled) == 5
    with pytest.raises(tf.ValidationError, match=r"op: args\[1\] is a bare Python int"):
        k.function_for([span((4, 8), (32, 4)), 3], "op")


def test_known_function_finds_only_what_is_compiled_and_builds_nothing(monkeypatch):
    from tenferro import numba_kernels as nk

    built = []
    real = nk._specialization_type
    fn1 = _Fn("fn1", (F32_C, types.float32))
    monkeypatch.setattr(nk, "compile_for_session", lambda s, d, key, name, op: fn1)
    monkeypatch.setattr(
        nk, "_specialization_type", lambda a, op, i: built.append(i) or real(a, op, i)
    )
    s = _CachingSession()
    k = nk.NumbaKernel(s, None, "k")
    f32 = dtypes.by_name("f32")
    y = tf.TensorMut(0x10000, (8,), (4,), f32, 0, None, s)
    assert k.known_function([y, np.float32(1.0)]) is None  # nothing compiled yet
    assert k.function_for([y, np.float32(1.0)], "op") == "fn1" and built == [0, 1]
    built.clear()
    x = tf.TensorRef(0x20000, (8,), (4,), f32, 0, None, s)  # its writability is pack's to check
    assert k.known_function([x, np.float32(2.0)]) == "fn1"
    fn1.param_block.pack([x, np.float32(2.0)], s, "op")  # what the launch does next
    keyed = []
    real_key = nk._quick_key
    monkeypatch.setattr(nk, "_quick_key", lambda a: keyed.append(a) or real_key(a))
    assert k.known_function([x, np.float32(5.0)]) == "fn1"  # a numpy scalar of the same class
    assert keyed == []  # needs no key: its class is its numba type
    f64 = dtypes.by_name("f64")
    wide = tf.TensorRef(0x20000, (8,), (8,), f64, 0, None, s)  # a new span of the same class
    assert k.known_function([wide, np.float32(2.0)]) is None  # is keyed: another numba type
    assert k.known_function([x, np.float64(2.0)]) is None  # another type: the checked path
    assert k.known_function([x, 3]) is None  # a bare int decides no type here
    assert k.known_function("ab") is None
    assert built == []
    assert k.known_function([x]) is None  # the first of the last arguments is not them all
    fresh = nk.NumbaKernel(s, None, "k")
    assert fresh.state is s and s.caches[-1] is fresh  # forgotten when the session syncs
    assert fresh.known_function([]) is None
    assert fresh.function_for([], "op") == "fn1"  # an empty list is looked up, never "found"


def test_a_kernel_compiles_for_its_session_dispatcher_and_name_once_per_key(monkeypatch):
    from tenferro import numba_kernels as nk

    asked = []
    monkeypatch.setattr(
        nk, "compile_for_session", lambda *a: asked.append(a) or _Fn(f"fn{len(asked)}")
    )
    s, dispatcher = _CachingSession(), object()
    k = nk.NumbaKernel(s, dispatcher, "k")
    f32 = dtypes.by_name("f32")
    y = tf.TensorMut(0x10000, (8,), (4,), f32, 0, None, s)
    assert k.function_for([y, np.float32(1.0)], "session.launch") == "fn1"
    assert asked == [
        (s, dispatcher, (types.Array(types.float32, 1, "C"), types.float32), "k", "session.launch")
    ]
    assert k.function_for([y], "session.launch") == "fn2"  # a prefix of the last arguments
    assert k.function_for([y, np.float32(3.0)], "session.launch") == "fn1" and len(asked) == 2


def test_a_numba_kernel_refuses_another_argument_count_before_compiling(monkeypatch):
    from tenferro import numba_kernels as nk

    monkeypatch.setattr(nk, "compile_for_session", lambda *a: pytest.fail("compiled"))
    k = nk.NumbaKernel(_CachingSession(), cuda.jit(scale_into), "scale_into")
    f32 = dtypes.by_name("f32")
    y = tf.TensorMut(0x10000, (8,), (4,), f32, 0, None, k.state)
    for args in ([], [y, y, np.float32(1.0)], [y, y, np.float32(1.0), np.int64(8), 0]):
        with pytest.raises(
            tf.ValidationError,
            match=rf"^session\.launch: numba kernel "
            rf"'scale_into' takes 4 argument\(s\), "
            rf"got {len(args)}$",
        ):
            k.function_for(args, "session.launch")


# --- on the GPU --------------------------------------------------------------------------------


@cuda.jit
def transpose_add(out, a, b):
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = a[i, j] + 2.0 * b[i, j]


@cuda.jit
def stencil3d(out, x):
    i, j, k = cuda.grid(3)
    n0, n1, n2 = x.shape
    if 0 < i < n0 - 1 and j < n1 and k < n2:
        out[i, j, k] = x[i - 1, j, k] + x[i + 1, j, k] - 2.0 * x[i, j, k]
    elif i < n0 and j < n1 and k < n2:
        out[i, j, k] = x[i, j, k]


@pytest.mark.gpu
def test_1d_numba_kernel_with_signature(session, rng):
    fn = session.numba_kernel(scale_into, "void(float64[::1], float64[::1], float64, int64)")
    assert isinstance(fn, tf.Function)
    n = 10_007
    x0 = rng.standard_normal(n)
    out = session.upload(np.full(n, np.nan))
    session.launch(
        fn,
        tf.LaunchConfig.flat(n),
        [session.tensor_mut(out), session.tensor(session.upload(x0)), 1.75, n],
    )
    np.testing.assert_array_equal(session.download(out), 1.75 * x0)
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.launch: args\[2\] of numba kernel "
        r"'scale_into' expects f64, got f32",
    ):
        session.launch(
            fn,
            tf.LaunchConfig.flat(n),
            [session.tensor_mut(out), session.tensor(out), tf.f32(1.0), n],
        )
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.launch: args\[3\]: i64 needs an integer, got float 1\.5",
    ):
        session.launch(
            fn,
            tf.LaunchConfig.flat(n),
            [session.tensor_mut(out), session.tensor(session.upload(x0)), 1.0, 1.5],
        )
    with pytest.raises(
        tf.ValidationError,
        match=r"args\[0\] is a read-only TensorRef but numba "
        r"kernel 'scale_into' stores",
    ):
        session.launch(
            fn,
            tf.LaunchConfig.flat(n),
            [session.tensor(out), session.tensor(session.upload(x0)), 1.0, n],
        )


@pytest.mark.gpu
def test_2d_strided_views_lazily_specialized(session, rng):
    k = session.numba_kernel(transpose_add)
    rows, cols = 45, 70
    a0, b0 = rng.standard_normal((cols, rows)), rng.standard_normal((rows, cols))
    at = session.tensor(session.upload(a0), allow_strided=False)  # C (cols, rows)
    a_t = tf.TensorRef(
        at.ptr, (rows, cols), (8, rows * 8), at.scalar_type, 0, at.owner, at.state
    )  # its transpose, as a strided view
    out = session.upload(np.full((rows, cols), np.nan))
    cfg = tf.LaunchConfig(((rows + 15) // 16, (cols + 15) // 16), (16, 16))
    session.launch(k, cfg, [session.tensor_mut(out), a_t, session.tensor(session.upload(b0))])
    np.testing.assert_array_equal(session.download(out), a0.T + 2.0 * b0)
    # A torch/cupy-style strided producer goes through allow_strided the same way.
    assert len(k.specializations) == 1


@pytest.mark.gpu
def test_3d_numba_kernel(session, rng):
    x0 = rng.standard_normal((9, 17, 33)).astype(np.float32)
    out = session.upload(np.full(x0.shape, np.nan, np.float32))
    k = session.numba_kernel(stencil3d)
    session.launch(
        k,
        tf.LaunchConfig((3, 5, 9), (4, 4, 4)),
        [session.tensor_mut(out), session.tensor(session.upload(x0))],
    )
    ref = x0.astype(np.float64).copy()
    ref[1:-1] = x0[:-2].astype(np.float64) + x0[2:] - 2.0 * x0[1:-1]
    np.testing.assert_allclose(session.download(out), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_numba_and_raw_kernels_share_buffers_in_stream_order(session, rng):
    from _sources import AXPY

    raw = session.compile(AXPY).function("axpy")
    nk = session.numba_kernel(scale_into, "void(float32[::1], float32[::1], float32, int64)")
    n = 1 << 16
    x0, y0 = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x, y, z = session.upload(x0), session.upload(y0), session.alloc_output((n,), np.float32)
    cfg = tf.LaunchConfig.flat(n)
    for _ in range(3):  # y = 2x + y (raw), z = 3y (numba), x = z (copy)
        session.launch(raw, cfg, [session.tensor_mut(y), session.tensor(x), tf.f32(2.0), tf.u32(n)])
        session.launch(nk, cfg, [session.tensor_mut(z), session.tensor(y), tf.f32(3.0), n])
        session.copy(x, z)
    xr, yr = x0.astype(np.float64), y0.astype(np.float64)
    for _ in range(3):
        yr = 2 * xr + yr
        xr = 3 * yr
    np.testing.assert_allclose(session.download(x), xr, rtol=1e-5)


@pytest.mark.gpu
def test_numba_kernel_links_tenferro_compiled_cuda_c(session, rng, tmp_path):
    src = r"""
    extern "C" __device__ int cubic(float* ret, float x) { *ret = x * x * x; return 0; }
    """
    major, minor = session.context.compute_capability
    r = tf.compile_cuda(src, arch=f"sm_{major}{minor}", target="ptx", options=["-rdc=true"])
    path = tmp_path / "cubic.ptx"
    path.write_text(r.ptx)
    cubic = cuda.declare_device("cubic", "float32(float32)")

    @cuda.jit(link=[str(path)])
    def apply_cubic(out, x):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = cubic(x[i])

    x0 = rng.standard_normal(999).astype(np.float32)
    out = session.upload(np.full(999, np.nan, np.float32))
    k = session.numba_kernel(apply_cubic, "void(float32[::1], float32[::1])")
    session.launch(
        k, tf.LaunchConfig.flat(999), [session.tensor_mut(out), session.tensor(session.upload(x0))]
    )
    np.testing.assert_allclose(session.download(out), x0.astype(np.float64) ** 3, rtol=1e-5)


@pytest.mark.gpu
def test_numba_kernel_refusals(session):
    @cuda.jit(device=True)
    def helper(x):
        return x

    with pytest.raises(
        tf.ValidationError,
        match=r"session\.numba_kernel: 'helper' is a device "
        r"function",
    ):
        session.numba_kernel(helper)
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.numba_kernel: expected a Python "
        r"function",
    ):
        session.numba_kernel(42)
    k = session.numba_kernel(scale_into)
    y = session.alloc_zeros(8, np.float32)
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.launch: args\[2\] is a bare Python "
        r"float",
    ):
        session.launch(
            k, tf.LaunchConfig.flat(8), [session.tensor_mut(y), session.tensor(y), 2.0, 8]
        )


@pytest.mark.gpu
def test_a_numba_kernel_relaunched_with_new_objects_of_the_same_types_computes_and_checks(
    session, rng
):
    k = session.numba_kernel(scale_into)
    n = 4097
    x0 = rng.standard_normal(n).astype(np.float32)
    x = session.upload(x0)
    out = session.upload(np.full(n, np.nan, np.float32))
    for a in (0.5, -1.25, 3.0):  # new numpy scalars each call: the Function is found again
        session.launch(
            k,
            tf.LaunchConfig.flat(n),
            [session.tensor_mut(out), session.tensor(x), np.float32(a), np.int64(n)],
        )
        np.testing.assert_allclose(session.download(out), np.float64(a) * x0, rtol=1e-6)
    assert len(k.specializations) == 1
    poisoned = session.upload(np.full(n, np.nan, np.float32))
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[0\] is a read-only "
        r"TensorRef but numba kernel 'scale_into' "
        r"stores",
    ):
        session.launch(
            k,
            tf.LaunchConfig.flat(n),
            [session.tensor(poisoned), session.tensor(x), np.float32(1.0), np.int64(n)],
        )
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args must be a list or "
        r"tuple",
    ):
        session.launch(k, tf.LaunchConfig.flat(n), 5)
    session.synchronize()
    assert np.isnan(session.download(poisoned)).all()  # nothing ran with the refused argument


def test_the_scalar_shortcut_writes_exact_bits_and_ends_where_it_must():
    import gc
    import weakref

    s = _FakeSession()
    specs, sig = numba_layout((F32_C, types.float32, types.int64), "k", "test")
    block = NumbaParamBlock("k", specs, sig, {0})
    f32 = dtypes.by_name("f32")
    y = tf.TensorMut(0x20000, (7,), (4,), f32, 0, None, s)
    op = "session.launch"
    assert not block.takes_quickly([y, np.float32(1.0), np.int64(2)])  # nothing packed yet
    signalling_nan = np.array([0x7F800001], np.uint32).view(np.float32)[0]
    block.pack([y, signalling_nan, np.int64(2)], s, op)  # the checked path keeps bits too
    assert struct.unpack_from("<I", bytes(block._mv), block.offsets[7]) == (0x7F800001,)
    block.pack([y, np.float32(1.0), np.int64(2)], s, op)
    assert block.takes_quickly([y, signalling_nan, np.int64(-3)])
    block.pack([y, signalling_nan, np.int64(-3)], s, op)
    raw = bytes(block._mv)
    assert struct.unpack_from("<I", raw, block.offsets[7]) == (0x7F800001,)  # its very bits
    assert struct.unpack_from("<q", raw, block.offsets[8]) == (-3,)
    # Not the shortcut: another span, a scalar of another class, another count.
    other = tf.TensorMut(0x20000, (7,), (4,), f32, 0, None, s)
    assert not block.takes_quickly([other, np.float32(1.0), np.int64(2)])
    assert not block.takes_quickly([y, np.float64(1.0), np.int64(2)])
    assert not block.takes_quickly([y, tf.f32(1.0), np.int64(2)])
    assert not block.takes_quickly([y, np.float32(1.0)])
    # A synchronize forgets the arrays: no shortcut, and nothing of them is kept.
    gone = weakref.ref(y)
    block.forget()
    assert not block.takes_quickly([y, np.float32(1.0), np.int64(2)])
    del y
    gc.collect()
    assert gone() is None


def test_a_scalar_type_numpy_lacks_takes_no_shortcut_and_all_numpy_scalars_need_no_array():
    s = _FakeSession()
    specs, sig = numba_layout((types.float32, types.int64), "k", "test")
    block = NumbaParamBlock("k", specs, sig, set())
    assert block.takes_quickly([np.float32(0.5), np.int64(7)])  # nothing else to check
    assert block.pack([np.float32(0.5), np.int64(7)], s, "op") == []
    raw = bytes(block._mv)
    assert struct.unpack_from("<f", raw, block.offsets[0]) + struct.unpack_from(
        "<q", raw, block.offsets[1]
    ) == (0.5, 7)
    assert not block.takes_quickly([np.float32(0.5), np.int32(7)])
    bf16 = NumbaParamBlock("k", *numba_layout((F32_C, types.float32), "k", "test"), set())
    bf16.scalar_places = (None, None)  # as for a type numpy has no class for
    array = object()
    bf16._last_arrays[0] = array  # the array test passes: the scalar's decides
    takes, quick_pack = bf16._straight_line_checks()
    assert not takes([array, np.float32(1.0)]) and not quick_pack([array, np.float32(1.0)])


def test_each_array_is_compared_with_its_own_place_and_a_kernel_may_take_nothing():
    s = _FakeSession()
    f32 = dtypes.by_name("f32")
    y, x, z = (tf.TensorMut(0x10000 * (i + 1), (7,), (4,), f32, 0, None, s) for i in range(3))
    block = NumbaParamBlock(
        "k", *numba_layout((F32_C, F32_C, F32_C, types.float32), "k", "test"), {0, 1, 2}
    )
    block.pack([y, x, z, np.float32(1.0)], s, "op")
    assert block.takes_quickly([y, x, z, np.float32(2.0)])
    for swapped in ([y, x, x], [y, z, z], [x, x, z], [z, x, y]):  # another span in a place
        assert not block.takes_quickly([*swapped, np.float32(2.0)])
    empty = NumbaParamBlock("k", *numba_layout((), "k", "test"), set())
    assert empty.takes_quickly([]) and empty.pack([], s, "op") == []
    assert not empty.takes_quickly([np.float32(1.0)])


def test_the_numba_simulator_is_named_when_a_kernel_is_given_under_it():
    import os
    import subprocess
    import sys

    code = (
        "from numba import cuda\n"
        "import tenferro as tf\n"
        "from tenferro.numba_kernels import as_dispatcher\n"
        "def k(y):\n"
        "    y[0] = 1\n"
        "for f in (k, cuda.jit(k)):\n"
        "    try:\n"
        "        as_dispatcher(f, 'session.numba_kernel')\n"
        "    except tf.ValidationError as e:\n"
        "        print(e)\n"
    )
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stderr
    assert len(lines) == 2 and all(
        line.startswith(
            "session.numba_kernel: numba's CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1)"
        )
        for line in lines
    )


def _in_packing_code(code):  # tenferro's packing, generated code included
    name = code.co_filename
    return "tenferro" in name and ("numba_kernels" in name or "args" in name)


def test_an_interrupt_anywhere_in_a_numba_pack_leaves_no_half_packed_block_behind():
    # Ctrl-C between any two lines of a pack, on its general path (another array) and its
    # quick one (the same arrays, new numpy scalars): the next pack writes exactly its own
    # arguments, the very objects of the last complete pack included.
    from _stand_ins import finishes_despite_interrupt_at

    from tenferro.numba_kernels import NumbaParamBlock

    op = "session.launch"
    f32 = dtypes.by_name("f32")
    argtypes = (types.float32[::1], types.float32[::1], types.float32, types.int64)
    specs, sig = numba_layout(argtypes, "axpy", op)
    y = tf.TensorMut(0x1000, (4,), (4,), f32, 0, None, None)
    y2 = tf.TensorMut(0x3000, (3,), (4,), f32, 0, None, None)
    x = tf.TensorRef(0x2000, (4,), (4,), f32, 0, None, None)
    first = [y, x, np.float32(1.5), np.int64(4)]
    fresh = NumbaParamBlock("axpy", specs, sig, {0})

    def packed(args):
        fresh.pack(args, None, op)
        return fresh.snapshot()

    b = NumbaParamBlock("axpy", specs, sig, {0})
    for other in ([y2, x, np.float32(-2.5), np.int64(3)], [y, x, np.float32(7.0), np.int64(2)]):
        expect_first, expect_other = packed(first), packed(other)
        b.pack(first, None, op)
        interrupted, finished = 0, False
        for n in range(1, 500):
            finished = finishes_despite_interrupt_at(
                n, _in_packing_code, lambda other=other: b.pack(other, None, op)
            )
            assert b.pack(first, None, op) == [y, x] and b.snapshot() == expect_first, n
            assert b.pack(other, None, op) == other[:2] and b.snapshot() == expect_other, n
            b.pack(first, None, op)
            if finished:
                break
            interrupted += 1
        assert finished and interrupted >= 3


def test_ctypes_numbers_specialize_and_pack_as_their_c_types():
    import ctypes

    assert _specialization_type(ctypes.c_int16(3), "op", 0) == types.int16
    assert _specialization_type(ctypes.c_double(1.0), "op", 0) == types.float64
    with pytest.raises(
        tf.ValidationError, match=r"^op: args\[1\] is a ctypes c_void_p, an address"
    ):
        _specialization_type(ctypes.c_void_p(8), "op", 1)
    s = _FakeSession()
    specs, sig = numba_layout((types.float64, types.int32), "k", "test")
    block = NumbaParamBlock("k", specs, sig, set())
    op = "session.launch"
    block.pack([ctypes.c_double(2.5), ctypes.c_int(-7)], s, op)
    assert struct.unpack_from("<d", bytes(block._mv), block.offsets[0]) == (2.5,)
    assert struct.unpack_from("<i", bytes(block._mv), block.offsets[1]) == (-7,)
    before = bytes(block._mv)
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[1\] of numba kernel 'k' expects i32, "
        r"got ctypes c_long scalar",
    ):
        block.pack([ctypes.c_double(1.0), ctypes.c_int64(1)], s, op)
    assert bytes(block._mv)[block.offsets[1] :] == before[block.offsets[1] :]


# --- arrays of a record (structured) dtype --------------------------------------------------------

PARTICLE = np.dtype([("x", "<f4"), ("v", "<f4"), ("hits", "<i4")], align=True)


def advance(p, dt, n):
    """A numba kernel over records: x += v dt, and a hit counted where x passes 1."""
    i = cuda.grid(1)
    if i < n:
        p[i].x = p[i].x + p[i].v * dt
        if p[i].x > 1.0:
            p[i].hits += 1


ADVANCE_C = r"""
struct Particle { float x; float v; int hits; };
extern "C" __global__ void advance_c(Particle* p, float dt, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        p[i].x += p[i].v * dt;
        if (p[i].x > 1.0f) p[i].hits += 1;
    }
}
"""


def _particles(rng, n):
    p = np.zeros(n, PARTICLE)
    p["x"] = rng.uniform(-1.0, 1.0, n)
    p["v"] = rng.standard_normal(n)
    p["hits"] = rng.integers(0, 5, n)
    return p


def _advanced(p, dt, steps):
    x, hits = p["x"].astype(np.float64), p["hits"].copy()
    for _ in range(steps):
        x = x + p["v"].astype(np.float64) * dt
        hits += x > 1.0
    return x, hits


@pytest.mark.gpu
def test_numba_and_cuda_c_kernels_update_record_arrays_in_place(session, rng):
    n, dt = 10_001, 0.25
    p0 = _particles(rng, n)
    nk = session.numba_kernel(advance)
    ck = session.compile(ADVANCE_C).function("advance_c")
    a, b = session.upload(p0), session.upload(p0)
    assert a.dtype == PARTICLE and a.shape == (n,)
    for _ in range(3):
        session.launch(nk, tf.LaunchConfig.flat(n), [session.tensor_mut(a), tf.f32(dt), tf.i64(n)])
        session.launch(ck, tf.LaunchConfig.flat(n), [session.tensor_mut(b), tf.f32(dt), n])
    x, hits = _advanced(p0, dt, 3)
    for got in (session.download(a), session.download(b)):
        assert got.dtype == PARTICLE
        np.testing.assert_allclose(got["x"], x, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got["v"], p0["v"])  # a field no kernel writes
        # hits: where x lies within rounding of 1.0 float32 and float64 may differ
        near = np.abs(x - 1.0) < 1e-5
        np.testing.assert_array_equal(got["hits"][~near], hits[~near])
    cai = a.__cuda_array_interface__
    assert cai["typestr"] == "|V12" and np.dtype(cai["descr"]) == PARTICLE
    with pytest.raises(BufferError, match=r"^tensor\.__dlpack__: .* is a record"):
        a.__dlpack__()


@pytest.mark.gpu
def test_a_numba_record_array_is_a_span_and_its_layout_is_checked(session, rng):
    n = 257
    p0 = _particles(rng, n)
    theirs = cuda.to_device(p0, stream=0)
    cuda.synchronize()
    nk = session.numba_kernel(advance)
    session.launch(
        nk, tf.LaunchConfig.flat(n), [session.tensor_mut(theirs), tf.f32(0.5), tf.i64(n)]
    )
    got = session.download(session.tensor(theirs))
    x, _ = _advanced(p0, 0.5, 1)
    np.testing.assert_allclose(got["x"], x, rtol=1e-5, atol=1e-6)
    record = types.Array(from_dtype(PARTICLE), 1, "C")
    fixed = session.numba_kernel(advance, types.void(record, types.float32, types.int64))
    other = np.dtype([("x", "<f4"), ("v", "<f4"), ("hits", "<i8")])  # hits wider: 16 bytes
    wrong = session.upload(np.zeros(n, other))
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[0\] of 'advance' expects a 1-d record\(x f32 @0, v f32 "
        r"@4, hits i32 @8; 12 bytes\) array, got a 1-d record\(x f32 @0, v f32 @4, hits i64 @8; "
        r"16 bytes\) span",
    ):
        session.launch(fixed, tf.LaunchConfig.flat(n), [session.tensor_mut(wrong), 0.5, n])
    np.testing.assert_array_equal(session.download(wrong), np.zeros(n, other))
