"""The refusals of s.tensor / s.tensor_mut, on a real device."""

import threading

import numpy as np
import pytest
from _sources import AXPY

import tenferro as tf
from tenferro import spans


@pytest.mark.gpu
def test_tensor_and_tensor_mut_over_a_tensor(session):
    t = session.upload(np.arange(12, dtype=np.int32).reshape(3, 4))
    r, m = session.tensor(t), session.tensor_mut(t)
    assert isinstance(r, tf.TensorRef) and isinstance(m, tf.TensorMut)
    assert (r.ptr, r.shape, r.strides, r.dtype) == (t.ptr, (3, 4), (16, 4), np.int32)
    assert r.owner is t and session.tensor(t, dtype=np.int32).shape == (3, 4)


@pytest.mark.gpu
def test_host_memory_is_refused(session, cai):
    host = np.ones(16, np.float32)
    with pytest.raises(tf.ValidationError, match=r"session\.tensor: x is a numpy array in host"):
        session.tensor(host)
    with pytest.raises(
        tf.ValidationError, match=r"session\.tensor_mut: x's pointer 0x[0-9a-f]+ is not CUDA device"
    ):
        session.tensor_mut(cai(host.ctypes.data, (16,), "<f4", keep=host))


@pytest.mark.gpu
def test_other_device_is_refused_naming_both(session):
    class OnDevice7:
        def __dlpack_device__(self):
            return (2, 7)

        def __dlpack__(self, **kw):
            raise AssertionError("must be refused before the producer is asked for a capsule")

    with pytest.raises(
        tf.ValidationError,
        match=r"session\.tensor: x lives on device 7, this session is on device 0",
    ):
        session.tensor(OnDevice7())


@pytest.mark.gpu
def test_read_only_producer_refused_for_tensor_mut(session, cai):
    t = session.alloc_zeros(8, np.float32)
    ro = cai(t.ptr, (8,), "<f4", readonly=True, keep=t)
    assert isinstance(session.tensor(ro), tf.TensorRef)
    with pytest.raises(tf.ValidationError, match=r"session\.tensor_mut: x is read-only"):
        session.tensor_mut(ro)
    with pytest.raises(tf.ValidationError, match=r"session\.tensor_mut: x is read-only"):
        session.tensor_mut(session.tensor(t))


@pytest.mark.gpu
def test_dtype_mismatch_is_refused(session):
    t = session.alloc_zeros(8, np.float32)
    with pytest.raises(
        tf.ValidationError, match=r"session\.tensor: dtype=f64 was asked but x is f32"
    ):
        session.tensor(t, dtype=np.float64)
    with pytest.raises(tf.ValidationError, match=r"session\.tensor_mut: dtype=i32"):
        session.tensor_mut(t, dtype="int32")


@pytest.mark.gpu
def test_strides_refused_unless_allowed_and_read_correctly(session, cai, rng):
    a = rng.standard_normal((37, 53))
    t = session.upload(a)
    transposed = cai(t.ptr, (53, 37), "<f8", strides=(8, 53 * 8), keep=t)
    with pytest.raises(
        tf.ValidationError, match=r"session\.tensor: x has non-compact strides=\(8, 424\)"
    ):
        session.tensor(transposed)
    view = session.tensor(transposed, allow_strided=True)
    np.testing.assert_array_equal(session.download(view), a.T)
    fn = session.compile(AXPY).function("gather2d")
    out = session.upload(np.full((53, 37), np.nan))
    session.launch(
        fn,
        tf.LaunchConfig((1, 53), (64, 1)),
        [session.tensor_mut(out), view, tf.i64(1), tf.i64(53), 53, 37],
    )
    np.testing.assert_array_equal(session.download(out), a.T)
    # An offset, negatively strided view: every other row, reversed.
    rev = cai(t.ptr + 36 * 53 * 8, (19, 53), "<f8", strides=(-2 * 53 * 8, 8), keep=t)
    np.testing.assert_array_equal(
        session.download(session.tensor(rev, allow_strided=True)), a[::-2]
    )
    bcast = cai(t.ptr, (4, 53), "<f8", strides=(0, 8), keep=t)
    assert session.tensor(bcast, allow_strided=True).shape == (4, 53)
    with pytest.raises(tf.ValidationError, match=r"session\.tensor_mut: x has a zero stride"):
        session.tensor_mut(bcast, allow_strided=True)


@pytest.mark.gpu
def test_misaligned_masked_and_stream_zero_are_refused(session, cai):
    t = session.alloc_zeros(64, np.uint8)
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.tensor: x's data pointer .* not "
        r"aligned to the 4 bytes its f32",
    ):
        session.tensor(cai(t.ptr + 2, (8,), "<f4", keep=t))
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.tensor: __cuda_array_interface__ has "
        r"a mask",
    ):
        session.tensor(cai(t.ptr, (8,), "<f4", mask=object(), keep=t))
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.tensor: __cuda_array_interface__ "
        r"stream=0 is ambiguous",
    ):
        session.tensor(cai(t.ptr, (8,), "<f4", stream=0, keep=t))
    with pytest.raises(tf.ValidationError, match=r"session\.tensor: x is a str"):
        session.tensor("not an array")


@pytest.mark.gpu
def test_span_of_another_session_and_other_thread(session):
    with tf.Session() as s2:
        other = s2.tensor(s2.alloc_zeros(4, np.float32))
        with pytest.raises(
            tf.ValidationError, match=r"session\.tensor: x is a TensorRef of another session"
        ):
            session.tensor(other)
        fn = session.compile(AXPY).function("axpy")
        with pytest.raises(
            tf.ValidationError,
            match=r"session\.launch: args\[1\] is a TensorRef "
            r"of another session",
        ):
            session.launch(
                fn,
                tf.LaunchConfig.flat(4),
                [
                    session.tensor_mut(session.alloc_zeros(4, np.float32)),
                    other,
                    tf.f32(1),
                    tf.u32(4),
                ],
            )
    t = session.alloc_zeros(4, np.float32)
    errors = []
    th = threading.Thread(target=lambda: errors.append(_catch(lambda: session.tensor_mut(t))))
    th.start()
    th.join()
    assert isinstance(errors[0], tf.RuntimeStateError) and "session.tensor_mut" in str(errors[0])


def _catch(f):
    try:
        f()
    except Exception as exc:
        return exc
    return None


@pytest.mark.gpu
def test_strides_must_be_whole_elements(session, cai, rng):
    t = session.upload(rng.standard_normal(64).astype(np.float32))
    # 8-byte steps over 4-byte elements: the last stride accepted (every other element) ...
    view = session.tensor(cai(t.ptr, (4,), "<f4", strides=(8,), keep=t), allow_strided=True)
    np.testing.assert_array_equal(session.download(view), t.to_host()[:8:2])
    # ... and 5-byte steps refused: a kernel would read elements straddling two floats.
    for strides in [(5,), (6,), (9,)]:
        with pytest.raises(
            tf.ValidationError,
            match=rf"session\.tensor: x has strides=\({strides[0]},\) \(bytes\) "
            r"that are not multiples of its 4-byte f32 elements",
        ):
            session.tensor(cai(t.ptr, (4,), "<f4", strides=strides, keep=t), allow_strided=True)
    with pytest.raises(tf.ValidationError, match=r"session\.tensor_mut: x has strides=\(4, 10\)"):
        session.tensor_mut(cai(t.ptr, (3, 4), "<f4", strides=(4, 10), keep=t), allow_strided=True)
    # A dimension of extent 1 is never stepped along: its stride does not matter.
    one = session.tensor(cai(t.ptr, (1, 4), "<f4", strides=(7, 4), keep=t))
    np.testing.assert_array_equal(session.download(one), t.to_host()[:4].reshape(1, 4))


@pytest.mark.gpu
def test_extents_outside_the_address_space_are_refused(session, cai):
    t = session.alloc_zeros(64, np.float32)
    wrapped = (1 << 64) - 4  # -4 read as unsigned
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.tensor: x's strides=\(18446744073709551"
        r"612,\) \(bytes\) for shape=\(10,\) .* reach "
        r"outside the address space",
    ):
        session.tensor(cai(t.ptr, (10,), "<f4", strides=(wrapped,), keep=t), allow_strided=True)
    below_zero = -t.ptr  # the tenth element would sit at 8 * -ptr
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.tensor: x's strides=\(-\d+,\) .* reach "
        r"outside the address space",
    ):
        session.tensor(cai(t.ptr, (10,), "<f4", strides=(below_zero,), keep=t), allow_strided=True)
    # The same view in range reads (the last accepted side): nine steps back from the end.
    back = session.tensor(cai(t.ptr + 36, (10,), "<f4", strides=(-4,), keep=t), allow_strided=True)
    assert (back.lo, back.hi) == (t.ptr, t.ptr + 40)
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.tensor: x's data pointer -64 is not "
        r"a 64-bit address",
    ):
        session.tensor(cai(-64, (4,), "<f4", keep=t))


@pytest.mark.gpu
def test_cupy_negative_stride_views_read_right(session, rng):
    cp = pytest.importorskip("cupy")
    a = rng.standard_normal((4, 5, 9))
    x = cp.asarray(a)
    for view, ref in [
        (x[::2, ::-1, 2:-3], a[::2, ::-1, 2:-3]),
        (x.ravel()[::-1], a.ravel()[::-1]),
        (x.astype(cp.float32)[:, ::-2, 1], a.astype(np.float32)[:, ::-2, 1]),
    ]:
        span = session.tensor(view, allow_strided=True)
        assert span.strides == view.strides and span.ptr == view.data.ptr
        np.testing.assert_array_equal(session.download(span), ref)
    rev = x.ravel()[::-1]
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.tensor: x has non-compact "
        r"strides=\(-8,\)",
    ):
        session.tensor(rev)


@pytest.mark.parametrize("shape", [(), (0,), (1,), (4096,), (3, 0, 2), (7, 5, 3)])
@pytest.mark.parametrize("cls", [tf.TensorRef, tf.TensorMut])
def test_a_compact_span_is_the_span_the_full_constructor_makes(shape, cls):
    from tenferro import dtypes
    from tenferro.spans import c_strides

    t = dtypes.by_name("f64")
    strides = c_strides(shape, t.itemsize)
    nbytes = int(np.prod(shape, dtype=np.int64)) * t.itemsize
    owner, session = object(), object()
    full = cls(0x7000_0040, shape, strides, t, 3, owner, session)
    fast = cls.compact(0x7000_0040, shape, strides, t, nbytes, 3, owner, session)
    fields = (
        "ptr",
        "shape",
        "strides",
        "scalar_type",
        "device",
        "owner",
        "state",
        "nbytes",
        "lo",
        "hi",
    )
    assert [getattr(fast, f) for f in fields] == [getattr(full, f) for f in fields]
    assert type(fast) is cls and fast.is_c_contiguous


def _span(cls, ptr, n, session=None):
    from tenferro import dtypes

    return cls(ptr, (n,), (4,), dtypes.by_name("f32"), 0, None, session)


def test_overlap_is_exact_to_the_byte():
    from tenferro.spans import overlaps

    a = _span(tf.TensorMut, 0x1000, 4)  # bytes 0x1000-0x100f
    touching = _span(tf.TensorRef, 0x1010, 4)  # starts where a ends: no overlap
    one_byte = _span(tf.TensorRef, 0x100C, 4)  # shares a's last element
    empty = _span(tf.TensorRef, 0x1008, 0)  # inside a, but holds no byte
    assert not overlaps(a, touching) and not overlaps(touching, a)
    assert overlaps(a, one_byte) and overlaps(one_byte, a)
    assert not overlaps(a, empty) and not overlaps(empty, a)


def test_a_launch_refuses_a_span_of_another_session_and_aliasing_without_a_gpu():
    from tenferro.args import ParamBlock
    from tenferro.signature import parse_ptx

    sig = parse_ptx(
        ".visible .entry k(.param .u64 .ptr .global k_param_0, "
        ".param .u64 .ptr .global k_param_1) { ret; }"
    )["k"]
    block = ParamBlock(sig)
    ours, theirs = object(), object()
    y = _span(tf.TensorMut, 0x2000, 8, ours)
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.launch: args\[1\] is a TensorRef of "
        r"another session",
    ):
        block.pack([y, _span(tf.TensorRef, 0x3000, 8, theirs)], ours, "session.launch")
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.launch: args\[0\] \(TensorMut\) and "
        r"args\[1\] \(TensorRef\) overlap in memory",
    ):
        block.pack([y, _span(tf.TensorRef, 0x201C, 8, ours)], ours, "session.launch")
    spans = block.pack([y, _span(tf.TensorRef, 0x2020, 8, ours)], ours, "session.launch")
    assert [s.ptr for s in spans] == [0x2000, 0x2020]  # touching is fine; the bytes are packed
    assert bytes(block.snapshot()[:16]) == (0x2000).to_bytes(8, "little") + (0x2020).to_bytes(
        8, "little"
    )


def test_a_span_says_its_producer_did_not_mark_it_read_only_unless_told():
    from tenferro.dtypes import by_name

    f32 = by_name("f32")
    assert tf.TensorRef(0x1000, (4,), (4,), f32, 0, None, None).producer_readonly is False
    assert tf.TensorRef(0x1000, (4,), (4,), f32, 0, None, None, True).producer_readonly is True
    assert (
        tf.TensorRef.compact(0x1000, (4,), (4,), f32, 16, 0, None, None).producer_readonly is False
    )


@pytest.mark.parametrize(
    ("shape", "strides", "contiguous"),
    [
        ((3, 1), (4, 999), True),
        ((1, 3), (999, 4), True),  # a 1-extent's stride never matters
        ((2, 3), (12, 4), True),
        ((2, 3), (4, 8), False),
        ((2, 2), (4, 8), False),
        ((0, 3), (7, 4), True),
        ((3,), (8,), False),
    ],
)
def test_c_contiguity_ignores_only_extents_of_one_and_empty_spans(shape, strides, contiguous):
    from tenferro.dtypes import by_name

    span = tf.TensorRef(0x1000, shape, strides, by_name("f32"), 0, None, None)
    assert span.is_c_contiguous is contiguous


@pytest.mark.parametrize(
    ("shape", "strides", "c", "f"),
    [
        ((2, 3), (4, 8), False, True),
        ((2, 3), (12, 4), True, False),  # each order, not the other
        ((2, 3), (4, 12), False, False),  # a gap between columns
        ((1, 3), (999, 4), True, True),
        ((3, 1), (4, 999), True, True),  # one row or one column
        ((3,), (4,), True, True),
        ((3,), (8,), False, False),
        ((0, 3), (7, 4), True, True),
    ],
)
def test_f_contiguity_is_c_contiguity_with_the_order_of_extents_reversed(shape, strides, c, f):
    from tenferro.dtypes import by_name

    span = tf.TensorRef(0x1000, shape, strides, by_name("f32"), 0, None, None)
    assert (span.is_c_contiguous, span.is_f_contiguous) == (c, f)


def test_spans_and_tensors_say_dtype_ndim_and_size_alike():
    from tenferro.dtypes import by_name
    from tenferro.spans import Shaped

    span = tf.TensorRef(0x1000, (2, 3), (12, 4), by_name("f32"), 0, None, None)
    assert (span.dtype, span.ndim, span.size) == (np.dtype(np.float32), 2, 6)
    bf16 = tf.TensorMut(0x1000, (5,), (2,), by_name("bf16"), 0, None, None)
    assert (bf16.dtype, bf16.ndim, bf16.size) == ("bf16", 1, 5)
    assert issubclass(tf.Tensor, Shaped) and tf.Tensor.size is Shaped.size


@pytest.mark.parametrize(
    ("shape", "strides"),
    [((2, 0, 3), (12, 12, 4)), ((0,), (4,)), ((4, 1, 5), (20, 20, 4)), ((), ())],
)
def test_c_strides_count_an_empty_extent_as_one(shape, strides):
    # As torch does (torch.empty(2, 0, 3).stride() is (3, 3, 1)); numpy gives 0s when empty.
    from tenferro.spans import c_strides

    assert c_strides(shape, 4) == strides


def test_a_compact_layout_is_remembered_per_shape_and_comes_back_as_plain_tuples():
    class Size(tuple):  # torch.Size: a tuple subclass, hashed and compared as the tuple
        pass

    shape, strides, nbytes = spans.compact_layout(Size((4, 0, 3)), 8)
    assert (shape, strides, nbytes) == ((4, 0, 3), (24, 24, 8), 0) and type(shape) is tuple
    again = spans.compact_layout((4, 0, 3), 8)
    assert again[0] is shape and again[1] is strides  # the same entry for the plain tuple
    assert spans.compact_layout((5,), 2) == ((5,), (2,), 10)
    spans.layouts.clear()
    for d in range(4097):  # a bounded table: 4097 entries kept, the next one starts it again
        spans.compact_layout((d,), 4)
    assert len(spans.layouts) == 4097
    spans.compact_layout((5000,), 4)
    assert len(spans.layouts) == 1
