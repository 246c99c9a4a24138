"""torch tensors read through their own attributes (tenferro.interop.producers), with every check
of the general path and the producer's stream ordered before the session's next kernel."""

import numpy as np
import pytest
from _sources import AXPY

import tenferro as tf
from tenferro import _driver
from tenferro.interop import producers

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

SPIN = 200_000_000  # clocks torch's stream sleeps before it writes: ~0.1 s on the H200


@pytest.fixture
def no_dlpack(monkeypatch):
    """torch's DLPack export made to fail: a span that still comes back came the direct way."""

    def refuse(*args, **kwargs):
        raise AssertionError("the direct path asked for a DLPack capsule")

    monkeypatch.setattr(torch.Tensor, "__dlpack__", refuse)


@pytest.fixture
def records(monkeypatch):
    """The producer streams the session's stream was made to wait for, in order."""
    seen = []
    real = _driver.wait_for_stream

    def wait(waiter, producer, event, op):
        seen.append(producer)
        real(waiter, producer, event, op)

    monkeypatch.setattr(_driver, "wait_for_stream", wait)
    return seen


TYPES = [
    ("bool", "bool"),
    ("int8", "i8"),
    ("int16", "i16"),
    ("int32", "i32"),
    ("int64", "i64"),
    ("uint8", "u8"),
    ("uint16", "u16"),
    ("uint32", "u32"),
    ("uint64", "u64"),
    ("float16", "f16"),
    ("bfloat16", "bf16"),
    ("float32", "f32"),
    ("float64", "f64"),
]


@pytest.mark.parametrize(("torch_name", "ours"), TYPES)
def test_every_dtype_reads_pointer_shape_and_byte_strides(session, no_dlpack, torch_name, ours):
    x = torch.zeros((6, 10), dtype=getattr(torch, torch_name), device="cuda")
    size = x.element_size()
    r = session.tensor(x)
    assert (r.ptr, r.shape, r.strides, r.scalar_type.name) == (
        x.data_ptr(),
        (6, 10),
        (10 * size, size),
        ours,
    )
    assert r.owner is x and (r.lo, r.hi) == (x.data_ptr(), x.data_ptr() + 60 * size)
    view = x[1:, 2::3]  # offset and non-compact: the general checks still run
    with pytest.raises(tf.ValidationError, match=r"^session\.tensor: x has non-compact strides"):
        session.tensor(view)
    v = session.tensor(view, allow_strided=True)
    assert (v.ptr, v.shape, v.strides) == (view.data_ptr(), (5, 3), (10 * size, 3 * size))


def test_the_direct_span_is_what_the_dlpack_span_was(session, rng):
    x = torch.from_numpy(rng.standard_normal((7, 9))).cuda().t()
    direct = session.tensor(x, allow_strided=True)
    general = tf.from_dlpack(x, session=session, allow_strided=True)
    for field in ("ptr", "shape", "strides", "scalar_type", "nbytes", "lo", "hi", "device"):
        assert getattr(direct, field) == getattr(general, field), field


def test_refusals_name_the_operation_and_argument(session, no_dlpack):
    y = torch.ones(16, device="cuda")
    with pytest.raises(
        tf.ValidationError, match=r"^session\.tensor: dtype=f64 was asked but x is f32"
    ):
        session.tensor(y, np.float64)
    assert session.tensor(y, np.float32).scalar_type.name == "f32"  # the last accepted
    wide = torch.ones(4, device="cuda").expand(3, 4)
    with pytest.raises(tf.ValidationError, match=r"^session\.tensor_mut: x has a zero stride"):
        session.tensor_mut(wide, allow_strided=True)
    assert session.tensor(wide, allow_strided=True).strides == (0, 4)
    odd = torch.ones(9, dtype=torch.uint8, device="cuda")[1:]
    assert session.tensor(odd).ptr % 2 == 1  # u8 needs no alignment ...
    f16 = torch.ones(9, dtype=torch.float16, device="cuda")
    assert session.tensor(f16[1:]).ptr == f16.data_ptr() + 2  # ... f16 is aligned by torch


def test_what_the_direct_path_leaves_to_the_general_one_is_refused_as_before(session, monkeypatch):
    # requires_grad, host memory, a neg-bit view: torch's own refusal or the general words.
    w = torch.ones(8, device="cuda", requires_grad=True)
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor: x\.__dlpack__\(\) of "
        r"Tensor refused to export",
    ):
        session.tensor(w)
    assert session.tensor(w.detach()).ptr == w.data_ptr()
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor: x is on DLPack "
        r"device_type 1",
    ):
        session.tensor(torch.ones(4))
    z = torch.ones(4, dtype=torch.complex64, device="cuda")
    assert session.tensor(z).scalar_type.name == "c64"  # complex goes through DLPack
    neg = z.conj().imag  # its memory holds +imag; torch reads it as -imag
    assert neg.is_neg()
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor: x is a negated view "
        r".*pass x\.resolve_neg\(\)",
    ):
        session.tensor(neg, allow_strided=True)
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.from_dlpack: x is a negated view "
        r".*pass x\.resolve_neg\(\)",
    ):
        tf.from_dlpack(neg, session=session, allow_strided=True)  # torch's capsule would give +imag
    fixed = neg.resolve_neg()
    np.testing.assert_array_equal(
        session.download(session.tensor(fixed, allow_strided=True)), fixed.cpu().numpy()
    )
    sparse = torch.eye(4, device="cuda").to_sparse()
    with pytest.raises(tf.ValidationError, match=r"^session\.tensor: x\.__dlpack__\(\)"):
        session.tensor(sparse)


def test_subclasses_take_the_general_path():
    class Mine(torch.Tensor):
        pass

    assert producers.direct_reader(torch.Tensor) is not None
    assert producers.direct_reader(Mine) is None
    assert producers.direct_reader(np.ndarray) is None


def test_the_raw_stream_query_is_torchs_current_stream(device):
    raw = torch._C._cuda_getCurrentRawStream
    assert raw(device) == torch.cuda.current_stream(device).cuda_stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert raw(device) == side.cuda_stream != 0


def _fill_after_sleep(x, value):
    """On torch's current stream: sleep, then fill x, so a reader that is not ordered after
    torch's stream reads the old values."""
    torch.cuda._sleep(SPIN)
    x.fill_(value)


def test_a_launch_waits_for_torchs_stream_with_one_event_for_all_its_tensors(session, rng, records):
    fn = session.compile(AXPY).function("axpy")
    n = 4099
    x = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).cuda()
    y = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).cuda()
    torch.cuda.synchronize()
    want_y = y.double().cpu().numpy()
    side = torch.cuda.Stream()  # torch's own streams are non-blocking: an event is needed
    with torch.cuda.stream(side):
        _fill_after_sleep(x, 1.25)  # torch's stream is still asleep when we launch
        records.clear()
        session.launch(
            fn,
            tf.LaunchConfig.flat(n, 256),
            [session.tensor_mut(y), session.tensor(x), tf.f32(2.0), tf.u32(n)],
        )
        assert records == [side.cuda_stream]  # one event for two tensors, at the launch
    got = session.download(session.tensor(y))
    np.testing.assert_allclose(got, 2.0 * 1.25 + want_y, rtol=1e-6)


def test_torchs_default_stream_and_the_sessions_own_are_ordered_both_ways(session, rng, records):
    # The session's own stream is blocking: the driver orders it with torch's default stream
    # (the legacy one) both ways, with no event. Each side sleeps before it writes, so a reader
    # not ordered after it would read the old values.
    n = 4099
    fns = session.compile(AXPY)
    axpy, slow_scale = fns.function("axpy"), fns.function("slow_scale")
    x = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).cuda()
    y = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).cuda()
    torch.cuda.synchronize()
    want_y = y.double().cpu().numpy()
    records.clear()
    _fill_after_sleep(x, 1.25)  # torch writes x late; our kernel reads it
    session.launch(
        axpy,
        tf.LaunchConfig.flat(n, 256),
        [session.tensor_mut(y), session.tensor(x), tf.f32(2.0), tf.u32(n)],
    )
    np.testing.assert_allclose(session.download(session.tensor(y)), 2.0 * 1.25 + want_y, rtol=1e-6)
    src = torch.from_numpy(rng.standard_normal(n)).cuda()
    out = torch.full((n,), -7.0, dtype=torch.float64, device="cuda")  # poisoned
    torch.cuda.synchronize()
    session.launch(
        slow_scale,
        tf.LaunchConfig.flat(n, 256),  # we write out late; torch reads
        [session.tensor_mut(out), session.tensor(src), 3.0, n, SPIN],
    )
    got = (out * 1.0).cpu().numpy()  # torch's op and copy on its default stream, no wait asked
    np.testing.assert_array_equal(got, 3.0 * src.cpu().numpy())
    assert records == []


@pytest.mark.parametrize("which", ["default", "side"])
def test_a_session_on_torchs_stream_records_no_event(device, rng, records, which):
    # The README's way: the session opened on torch's current stream object.
    side = torch.cuda.Stream() if which == "side" else torch.cuda.current_stream()
    with torch.cuda.stream(side):
        n = 1000
        x = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).cuda()
        y = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).cuda()
        want = 3.0 * x.double().cpu().numpy() + y.double().cpu().numpy()
        with tf.Session(device=device, stream=torch.cuda.current_stream()) as s:
            fn = s.compile(AXPY).function("axpy")
            records.clear()
            for _ in range(3):  # fresh spans each call, as users write it
                s.launch(
                    fn,
                    tf.LaunchConfig.flat(n, 128),
                    [s.tensor_mut(y), s.tensor(x), tf.f32(1.0), tf.u32(n)],
                )
            assert records == []
            got = y.double().cpu().numpy()  # torch's own read, ordered on the shared stream
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_memory_operation_on_a_span_waits_for_its_producer(session, rng):
    x = torch.from_numpy(rng.standard_normal(3000)).cuda()
    torch.cuda.synchronize()
    _fill_after_sleep(x, -2.5)
    r = session.tensor(x)  # ordered before the session's next kernel or copy
    out = session.alloc_output((3000,), np.float64)
    session.copy(out, r)
    np.testing.assert_array_equal(session.download(out), np.full(3000, -2.5))
    _fill_after_sleep(x, 4.0)
    r = session.tensor(x)
    np.testing.assert_array_equal(session.download(r), np.full(3000, 4.0))


def test_spans_made_before_a_capture_are_ordered_before_it(session, rng):
    # A tensor of torch's default stream needs no event on the session's blocking stream, so
    # a span of it is not refused in a capture, and each replay reads what torch wrote late;
    # one of a torch side stream is refused. Float32 sums near zero: an absolute bound too.
    fn = session.compile(AXPY).function("axpy")
    n = 2048
    y = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).cuda()
    x = torch.empty(n, device="cuda")
    torch.cuda.synchronize()
    want_y = y.double().cpu().numpy()
    _fill_after_sleep(x, 0.5)
    args = [session.tensor_mut(y), session.tensor(x), tf.f32(4.0), tf.u32(n)]
    with session.capture() as cap:
        session.launch(fn, tf.LaunchConfig.flat(n, 256), args)
    cap.graph.launch()
    np.testing.assert_allclose(session.download(args[0]), want_y + 4.0 * 0.5, rtol=1e-6, atol=1e-6)
    _fill_after_sleep(x, -0.75)  # torch writes x again, late: the next replay waits for it
    cap.graph.launch()
    np.testing.assert_allclose(
        session.download(args[0]), want_y + 4.0 * (0.5 - 0.75), rtol=1e-6, atol=1e-6
    )
    with session.capture() as cap:
        session.launch(
            fn,
            tf.LaunchConfig.flat(n, 256),
            [session.tensor_mut(y), session.tensor(x), tf.f32(1.0), tf.u32(n)],
        )
    assert cap.graph.node_count == 1
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        z = torch.ones(n, device="cuda")
        with (
            session.capture(),
            pytest.raises(
                tf.RuntimeStateError,
                match=r"^session\.tensor: not allowed during "
                r"s\.capture\(\): ordering after",
            ),
        ):
            session.tensor(z)


def test_an_overlap_of_torch_tensors_is_refused(session, no_dlpack):
    fn = session.compile(AXPY).function("axpy")
    y = torch.ones(64, device="cuda")
    with pytest.raises(tf.ValidationError, match=r"^session\.launch: .*overlap"):
        session.launch(
            fn,
            tf.LaunchConfig.flat(64, 64),
            [session.tensor_mut(y), session.tensor(y[1:]), tf.f32(1.0), tf.u32(63)],
        )
    session.launch(
        fn,
        tf.LaunchConfig.flat(32, 32),  # touching, not overlapping
        [session.tensor_mut(y[:32]), session.tensor(y[32:]), tf.f32(1.0), tf.u32(32)],
    )
    session.synchronize()
    np.testing.assert_array_equal(y.cpu().numpy(), [2.0] * 32 + [1.0] * 32)


def test_a_torch_tensor_gets_its_span_again_until_it_changes(session, rng):
    fn = session.compile(AXPY).function("axpy")
    n = 300
    x = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).cuda()
    y = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).cuda()
    want = y.double().cpu().numpy() + 3 * 0.5 * x.double().cpu().numpy()
    made = []
    for _ in range(3):  # the README's loop: spans made in the call
        made.append((session.tensor_mut(y), session.tensor(x)))
        session.launch(
            fn, tf.LaunchConfig.flat(n, 128), [made[-1][0], made[-1][1], tf.f32(0.5), tf.u32(n)]
        )
    assert made[0][0] is made[2][0] and made[0][1] is made[2][1]
    session.synchronize()  # three float32 roundings of values near zero: an absolute bound too
    np.testing.assert_allclose(y.double().cpu().numpy(), want, rtol=1e-6, atol=1e-6)
    old = made[0][0]
    y.resize_(2, 150)  # same memory, another shape: a new span
    assert session.tensor_mut(y) is not old and session.tensor_mut(y).shape == (2, 150)
    y.set_(torch.zeros(150, device="cuda"))  # another place
    assert session.tensor_mut(y).ptr == y.data_ptr() != old.ptr
    y.unsqueeze_(1)  # a column: still compact
    assert session.tensor_mut(y).shape == (150, 1)
    x.requires_grad_()
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor: x\.__dlpack__\(\) of "
        r"Tensor refused to export",
    ):
        session.tensor(x)


def test_a_numba_kernel_takes_torch_tensors(session, rng):
    from _sources import scale_add

    k = session.numba_kernel(scale_add)
    n = 777
    x = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).cuda()
    out = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).cuda()
    want = out.double().cpu().numpy() + 0.5 * x.double().cpu().numpy()
    session.launch(
        k,
        tf.LaunchConfig.flat(n, 128),
        [session.tensor_mut(out), session.tensor(x), np.float32(0.5), np.int64(n)],
    )
    session.synchronize()
    np.testing.assert_allclose(out.double().cpu().numpy(), want, rtol=1e-6)


@pytest.fixture
def cupy():
    return pytest.importorskip("cupy")


def test_cupy_arrays_are_read_directly_and_match_the_dlpack_span(session, cupy, monkeypatch):
    base = cupy.arange(60, dtype=cupy.float64).reshape(6, 10)
    views = [
        base,
        base.T,
        base[::-1],
        base[1:, 2::3],
        cupy.ones(7, dtype=cupy.complex64),
        cupy.ones(5, dtype=cupy.float16),
        cupy.zeros((0, 3), dtype=cupy.int32),
        cupy.ones(4, dtype=cupy.bool_),
    ]
    monkeypatch.setitem(producers.readers, cupy.ndarray, None)
    general = [session.tensor(v, allow_strided=True) for v in views]  # through CAI
    monkeypatch.delitem(producers.readers, cupy.ndarray)
    reader = producers.direct_reader(cupy.ndarray)
    assert reader is not None
    read = []
    monkeypatch.setitem(
        producers.readers,
        cupy.ndarray,
        lambda x, device, op: read.append(x) or reader(x, device, op),
    )
    for v, g in zip(views, general, strict=True):
        d = session.tensor(v, allow_strided=True)
        for field in ("ptr", "shape", "strides", "scalar_type", "nbytes", "lo", "hi"):
            assert getattr(d, field) == getattr(g, field), (v.shape, v.strides, field)
        assert d.owner is v
    assert len(read) == len(views)
    np.testing.assert_array_equal(
        session.download(session.tensor(base[::-1], allow_strided=True)),
        np.arange(60.0).reshape(6, 10)[::-1],
    )
    with pytest.raises(tf.ValidationError, match=r"^session\.tensor: x has non-compact strides"):
        session.tensor(base.T)
    with pytest.raises(tf.ValidationError, match=r"^session\.tensor_mut: x has a zero stride"):
        session.tensor_mut(cupy.broadcast_to(cupy.ones(3), (4, 3)), allow_strided=True)


def test_cupy_arrays_on_a_cupy_stream_are_ordered_at_the_launch(session, cupy, rng, records):
    fn = session.compile(AXPY).function("axpy")
    n = 3000
    x0, y0 = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        x, y = cupy.asarray(x0), cupy.asarray(y0)
        records.clear()
        session.launch(
            fn,
            tf.LaunchConfig.flat(n, 256),
            [session.tensor_mut(y), session.tensor(x), tf.f32(-1.5), tf.u32(n)],
        )
    assert records == [stream.ptr]
    np.testing.assert_allclose(
        session.download(session.tensor(y)), y0.astype(np.float64) - 1.5 * x0, rtol=1e-6, atol=1e-6
    )
